//! `candle`: local causal language models on Hugging Face's candle.
//!
//! The backend loads its model lazily (first call, once, under a lock), then serves calls from
//! many threads at once: weights are shared and immutable, each call has its own KV state. The
//! optional prefix cache is the one piece of shared mutable state, behind its own lock.

pub mod attention;
pub mod audio_backend;
pub mod engine;
pub mod kv;
pub mod models;
pub mod options;
pub mod prefix_cache;
pub mod processor;
pub mod sampling;
pub mod source;
pub mod weights;

use std::sync::{Arc, Mutex};

use candle_core::DType;

use lmhost_plugin_api::{
    export_plugin, Backend, BackendStats, Capabilities, ConversationSnapshot, GenerationConfig,
    GenerationRecord, KvCacheSettings, Logger, OptionSpec, PluginContext, PluginError, ScoreRecord,
    TokenizeRecord,
};

use crate::audio_backend::AudioBackend;
use crate::engine::{Engine, PrefixStore};
use crate::models::llama::BuildOptions;
use crate::options::Settings;
use crate::prefix_cache::PrefixCache;

pub struct Candle {
    model_id: String,
    settings: Settings,
    logger: Logger,
    pool: rayon::ThreadPool,
    engine: Mutex<Option<Arc<Engine>>>,
    cache: Mutex<CacheState>,
    /// `Some` when the model is a speech model (the processor path, see `audio_backend`).
    speech: Option<Speech>,
}

/// The processor path: loaded on first use, one call at a time.
struct Speech {
    options: lmhost_plugin_api::serde_json::Map<String, lmhost_plugin_api::serde_json::Value>,
    backend: Mutex<Option<AudioBackend>>,
}

#[derive(Default)]
struct CacheState {
    /// The prefix cache when `[kv_cache]` turns it on; `None` runs without one.
    store: Option<PrefixCache>,
    stats: BackendStats,
    warned_half: bool,
}

impl Backend for Candle {
    const NAME: &'static str = "candle";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn options() -> Vec<OptionSpec> {
        options::specs()
    }

    fn new(context: PluginContext) -> Result<Self, PluginError> {
        let options = context.options()?;
        let settings = Settings::parse(&options)?;
        let model_id = context.model_id.to_string();
        // `model_class` decides; `auto` asks the checkpoint (config.json or model.bin).
        let speech = match settings.model_class.as_deref() {
            Some("whisper") => true,
            Some(_) => false,
            None => models::whisper::detect(std::path::Path::new(&model_id)),
        }
        .then(|| Speech {
            options,
            backend: Mutex::new(None),
        });
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(settings.threads)
            .build()
            .map_err(|e| PluginError::config(format!("option `threads`: {e}")))?;
        Ok(Candle {
            model_id,
            speech,
            settings,
            logger: context.logger.clone(),
            pool,
            engine: Mutex::new(None),
            cache: Mutex::default(),
        })
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            returns_logprobs: true,
            scores_continuations: true,
            audio_input: self.speech.is_some(),
            // Audio prompts are not token prefixes: a speech model never uses the cache.
            prefix_cache: self.speech.is_none(),
            embeddings: true,
        }
    }

    fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord, PluginError> {
        config.validate()?;
        if let Some(record) = self.speech(|audio| audio.generate(snapshot, config))? {
            self.count(record.prompt_tokens, 0, record.token_ids.len());
            return Ok(record);
        }
        self.refuse_audio(snapshot)?;
        let engine = self.engine()?;
        let record = self.with_store(|store| {
            self.pool
                .install(|| engine.generate(snapshot, config, store))
        })?;
        self.count(
            record.prompt_tokens,
            record.cached_prompt_tokens,
            record.token_ids.len(),
        );
        Ok(record)
    }

    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        self.score_batch(std::slice::from_ref(snapshot), reply)?
            .pop()
            .ok_or_else(|| PluginError::internal("no score record"))
    }

    /// Text prompts run in packed passes (see [`engine`]); a speech model scores one at a time.
    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        if snapshots.is_empty() {
            return Ok(Vec::new()); // without loading the model
        }
        if self.speech.is_some() {
            let mut records = Vec::with_capacity(snapshots.len());
            for snapshot in snapshots {
                if let Some(record) = self.speech(|audio| audio.score(snapshot, reply))? {
                    self.count(record.prompt_tokens, 0, 0);
                    records.push(record);
                }
            }
            return Ok(records);
        }
        snapshots
            .iter()
            .try_for_each(|snapshot| self.refuse_audio(snapshot))?;
        let engine = self.engine()?;
        let records = self.with_store(|store| {
            self.pool
                .install(|| engine.score_batch(snapshots, reply, store))
        })?;
        for record in &records {
            self.count(record.prompt_tokens, record.cached_prompt_tokens, 0);
        }
        Ok(records)
    }

    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        self.refuse_speech("tokenize")?;
        self.refuse_audio(snapshot)?;
        self.engine()?.tokenize(snapshot, add_special)
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.refuse_speech("detokenize")?;
        let engine = self.engine()?;
        let vocab = engine.loaded.tokenizer.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(PluginError::invalid_input(format!(
                "token id {id} is outside the vocabulary of {vocab} tokens"
            )));
        }
        engine.decode(ids, false)
    }

    fn set_kv_cache(&self, settings: KvCacheSettings) -> Result<(), PluginError> {
        let mut cache = self.cache.lock().map_err(poisoned)?;
        let warned_half = cache.warned_half;
        *cache = CacheState {
            warned_half,
            ..CacheState::default()
        };
        if settings.enabled {
            let max_entries = usize::try_from(settings.max_entries).unwrap_or(usize::MAX);
            cache.store = Some(PrefixCache::new(max_entries, settings.max_bytes));
            self.warn_half_precision_cache(&mut cache);
        }
        Ok(())
    }

    fn stats(&self) -> BackendStats {
        self.cache
            .lock()
            .map(|c| match c.store.as_ref().map(PrefixCache::stats) {
                // The cache's own counters: a test can hold them against the records.
                Some(cached) => BackendStats {
                    kv_cache_hits: cached.hits,
                    kv_cache_misses: cached.misses,
                    kv_cache_reused_tokens: cached.reused_tokens,
                    kv_cache_evictions: cached.evictions,
                    kv_cache_bytes: cached.bytes,
                    ..c.stats
                },
                None => c.stats,
            })
            .unwrap_or_default()
    }
}

impl Candle {
    /// Runs `f` on the speech model when this backend is one (loading it on first use), else
    /// returns `None`. Audio prompts never reach the prefix cache: they are not token prefixes.
    fn speech<T: Send>(
        &self,
        f: impl FnOnce(&mut AudioBackend) -> Result<T, PluginError> + Send,
    ) -> Result<Option<T>, PluginError> {
        let Some(speech) = &self.speech else {
            return Ok(None);
        };
        let mut slot = speech.backend.lock().map_err(poisoned)?;
        if slot.is_none() {
            let dir = std::path::Path::new(&self.model_id);
            *slot = Some(AudioBackend::load(&self.model_id, dir, &speech.options)?);
        }
        match slot.as_mut() {
            Some(audio) => self.pool.install(|| f(audio)).map(Some),
            None => Err(PluginError::internal("speech model missing after loading")),
        }
    }

    /// What the speech path does not offer is refused, naming the model.
    fn refuse_speech(&self, what: &str) -> Result<(), PluginError> {
        if self.speech.is_some() {
            return Err(PluginError::unsupported(format!(
                "`{}` is a speech model; {what} is offered for text models",
                self.model_id
            )));
        }
        Ok(())
    }

    /// Audio sent to the causal-LM path is refused, naming the model.
    fn refuse_audio(&self, snapshot: &ConversationSnapshot) -> Result<(), PluginError> {
        if snapshot.has_audio() {
            return Err(PluginError::invalid_input(format!(
                "audio snapshots need an audio model; `{}` loaded as a text-only causal \
                 language model (set `model_class = \"whisper\"` for a Whisper checkpoint)",
                self.model_id
            )));
        }
        Ok(())
    }

    /// The engine, loading the model on first use (once: the lock is held while loading).
    pub fn engine(&self) -> Result<Arc<Engine>, PluginError> {
        let mut slot = self.engine.lock().map_err(poisoned)?;
        if let Some(engine) = slot.as_ref() {
            return Ok(engine.clone());
        }
        let engine = Arc::new(self.pool.install(|| self.load())?);
        *slot = Some(engine.clone());
        Ok(engine)
    }

    fn load(&self) -> Result<Engine, PluginError> {
        let s = &self.settings;
        let device = s.device()?;
        let dtype = s.dtype_on(&device)?;
        let attention = attention::resolve(&s.attn_implementation).map_err(PluginError::config)?;
        let build = BuildOptions {
            dtype,
            device,
            format: s.weights,
            attention,
            max_context: if s.max_context == 0 {
                usize::MAX
            } else {
                s.max_context
            },
        };
        let loaded = source::load(&self.model_id, &s.revision, s.model_class.as_deref(), build)?;
        Engine::new(
            loaded,
            s.max_context,
            s.chat_template.as_deref(),
            &self.model_id,
        )
    }

    /// Runs `f` with the prefix store, if one is on. The store lock is held for the call, so
    /// cached calls run one at a time; uncached calls run concurrently.
    fn with_store<T>(
        &self,
        f: impl FnOnce(Option<&mut dyn PrefixStore>) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let mut cache = self.cache.lock().map_err(poisoned)?;
        if cache.store.is_none() {
            drop(cache);
            return f(None);
        }
        match cache.store.as_mut() {
            Some(store) => {
                let store: &mut dyn PrefixStore = store;
                f(Some(store))
            }
            None => f(None),
        }
    }

    /// Warns once that half-precision prefixes round differently from one forward pass (the
    /// cached path runs a prompt in several passes), and that float32 gives identical results.
    fn warn_half_precision_cache(&self, cache: &mut CacheState) {
        let s = &self.settings;
        let Ok(dtype) = s.device().and_then(|device| s.dtype_on(&device)) else {
            return; // loading reports a device the build lacks
        };
        if cache.warned_half || !matches!(dtype, DType::F16 | DType::BF16) {
            return;
        }
        cache.warned_half = true;
        self.logger.warn(&format!(
            "kv_cache with {dtype:?} compute: cached prefixes round differently from one forward \
             pass, so greedy outputs and logprobs can differ slightly from kv_cache off; set \
             `dtype = \"float32\"` in [backend.options] for identical results"
        ));
    }

    fn count(&self, prompt: u32, cached: u32, generated: usize) {
        if let Ok(mut cache) = self.cache.lock() {
            let on = cache.store.is_some();
            let stats = &mut cache.stats;
            stats.prompt_tokens += u64::from(prompt);
            stats.generated_tokens += generated as u64;
            stats.kv_cache_reused_tokens += u64::from(cached);
            stats.kv_cache_hits += u64::from(on && cached > 0);
            stats.kv_cache_misses += u64::from(on && cached == 0);
        }
    }
}

fn poisoned<T>(_: T) -> PluginError {
    PluginError::internal("candle backend lock poisoned by an earlier panic")
}

export_plugin!(Candle);
