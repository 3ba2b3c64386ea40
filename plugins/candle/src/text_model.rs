//! The causal-LM kind of the backend: a text model loaded on first use, its engine, and the
//! optional prefix cache.
//!
//! Weights are shared and immutable once loaded, so calls run from many threads at once, each
//! with its own KV state; the prefix cache is the one piece of shared mutable state, behind its
//! own lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::DType;
use lmhost_plugin_api::{
    lock_or_reset, BackendStats, ConversationSnapshot, EmbeddingRecord, GenerationConfig,
    GenerationRecord, KvCacheSettings, Logger, PluginError, ScoreRecord, TokenDelta,
    TokenizeRecord,
};

use crate::batch::{Batcher, Prompts};
use crate::engine::{Engine, Prefilled};
use crate::kv::KvState;
use crate::models::BuildOptions;
use crate::options::Settings;
use crate::{attention, kernels, source, weights};
use lmhost_plugin_kit::prefix_cache::{PrefixStore, SharedCache, TokenCounts};
use lmhost_plugin_kit::text::{Hiding, TextFrontEnd};

/// Runs `f` on `pool`, outside the decode phase (see [`weights::prefilling`]).
fn install<T: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> T + Send) -> T {
    pool.install(|| weights::prefilling(f))
}

pub struct TextModel {
    model_id: String,
    settings: Settings,
    logger: Logger,
    engine: Mutex<Option<Arc<Engine>>>,
    /// Tokenizing before the model is loaded reads only its tokenizer and template.
    text_only: Mutex<Option<Arc<TextFrontEnd>>>,
    cache: SharedCache<KvState>,
    /// The half-precision caching warning was given.
    warned_half: AtomicBool,
    batcher: Batcher,
    prompts: Prompts,
}

impl TextModel {
    pub fn new(model_id: String, settings: Settings, logger: Logger) -> Self {
        TextModel {
            model_id,
            settings,
            logger,
            engine: Mutex::new(None),
            text_only: Mutex::new(None),
            cache: SharedCache::default(),
            warned_half: AtomicBool::new(false),
            batcher: Batcher::default(),
            prompts: Prompts::default(),
        }
    }

    /// The prompt runs with the prefix cache (held only for it) and decode passes paused,
    /// packed with the prompts of generations that arrive with it; decode steps are batched
    /// with the other generations running now.
    ///
    /// Every method here takes its locks before handing compute to `pool`, never inside it: a
    /// pool thread waiting in a parallel op runs other queued pool jobs, so a job that blocked
    /// on a lock its own thread holds further down the stack would never wake.
    pub fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
        pool: &rayon::ThreadPool,
    ) -> Result<GenerationRecord, PluginError> {
        self.refuse_media(snapshot, pool)?;
        let engine = self.engine(pool)?;
        let started = self.prompts.start(snapshot, |group| {
            self.with_store(|store| {
                self.batcher
                    .prompt(|| install(pool, || engine.start_batch(group, store)))
            })
        })?;
        self.decode(&engine, started, config, sink, pool)
    }

    /// [`kernels::ROWS`] prompts at a time: their prompts in packed passes, then their replies
    /// decoded together (one thread each, their steps packed by the batcher). So a batch costs
    /// about what its longest reply does, and holds the states of only one group.
    pub fn generate_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        config: &GenerationConfig,
        pool: &rayon::ThreadPool,
    ) -> Result<Vec<GenerationRecord>, PluginError> {
        snapshots
            .iter()
            .try_for_each(|snapshot| self.refuse_media(snapshot, pool))?;
        let engine = self.engine(pool)?;
        let mut records = Vec::with_capacity(snapshots.len());
        for (g, group) in snapshots.chunks(kernels::ROWS).enumerate() {
            let started = self.with_store(|store| {
                self.batcher
                    .prompt(|| install(pool, || engine.start_batch(group, store)))
            })?;
            let decoded: Vec<Result<GenerationRecord, PluginError>> = std::thread::scope(|s| {
                let threads: Vec<_> = started
                    .into_iter()
                    .map(|started| {
                        let engine = &engine;
                        s.spawn(move || self.decode(engine, started, config, &mut |_| true, pool))
                    })
                    .collect();
                threads
                    .into_iter()
                    .map(|t| {
                        t.join().unwrap_or_else(|_| {
                            Err(PluginError::internal("a generation thread panicked"))
                        })
                    })
                    .collect()
            });
            for (i, record) in decoded.into_iter().enumerate() {
                let i = g * kernels::ROWS + i;
                records.push(record.map_err(|e| {
                    PluginError::new(e.kind, format!("prompt {i} of the batch: {}", e.message))
                })?);
            }
        }
        Ok(records)
    }

    /// Samples a started prompt's reply, each decode step packed with the other generations'.
    fn decode(
        &self,
        engine: &Engine,
        started: Prefilled,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
        pool: &rayon::ThreadPool,
    ) -> Result<GenerationRecord, PluginError> {
        let model = &*engine.model;
        let _decoding = self.batcher.join();
        let mut record = engine.finish(started, config, sink, &mut |token, kv| {
            self.batcher.step(pool, model, token, kv)
        })?;
        if config.compute_embeddings {
            install(pool, || engine.add_embeddings(&mut record))?;
        }
        Ok(record)
    }

    /// Prompts run in packed passes (see [`crate::engine`]).
    pub fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
        pool: &rayon::ThreadPool,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        snapshots
            .iter()
            .try_for_each(|snapshot| self.refuse_media(snapshot, pool))?;
        let engine = self.engine(pool)?;
        self.with_store(|store| install(pool, || engine.score_batch(snapshots, reply, store)))
    }

    pub fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        hiding: &Hiding<'_>,
        pool: &rayon::ThreadPool,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        self.refuse_media(snapshot, pool)?;
        let engine = self.engine(pool)?;
        self.with_store(|store| {
            install(pool, || engine.score_hidden(snapshot, reply, hiding, store))
        })
    }

    pub fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
        pool: &rayon::ThreadPool,
    ) -> Result<TokenizeRecord, PluginError> {
        self.refuse_media(snapshot, pool)?;
        self.with_front(pool, |front| front.tokenize(snapshot, add_special))
    }

    pub fn detokenize(&self, ids: &[u32], pool: &rayon::ThreadPool) -> Result<String, PluginError> {
        self.with_front(pool, |front| front.detokenize(ids))
    }

    /// Runs `f` with the loaded engine's front end, or, before the model is loaded, with one
    /// built from its tokenizer and template alone (once): tokenizing never loads the weights,
    /// so it works for any architecture whose tokenizer is supported.
    fn with_front<T>(
        &self,
        pool: &rayon::ThreadPool,
        f: impl FnOnce(&TextFrontEnd) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let loaded = lock_or_reset(&self.engine, |_| {}).clone();
        if let Some(engine) = loaded {
            return f(&engine.front);
        }
        let front = {
            let mut slot = lock_or_reset(&self.text_only, |_| {});
            match slot.as_ref() {
                Some(front) => front.clone(),
                None => {
                    let s = &self.settings;
                    let text = install(pool, || source::load_text(&self.model_id, &s.revision))?;
                    let limits = (s.max_context, usize::MAX);
                    let front = TextFrontEnd::new(
                        text,
                        s.chat_template.as_deref(),
                        limits,
                        &self.model_id,
                    )?;
                    slot.insert(Arc::new(front)).clone()
                }
            }
        };
        f(&front)
    }

    pub fn embed(
        &self,
        texts: &[String],
        pool: &rayon::ThreadPool,
    ) -> Result<Vec<EmbeddingRecord>, PluginError> {
        let engine = self.engine(pool)?;
        texts
            .iter()
            .map(|text| {
                let (embedding, tokens) = install(pool, || engine.embed(text))?;
                Ok(EmbeddingRecord {
                    embedding: embedding.into(),
                    prompt_tokens: tokens as u32,
                })
            })
            .collect()
    }

    pub fn set_kv_cache(&self, settings: KvCacheSettings) -> Result<(), PluginError> {
        self.cache.set(settings);
        if settings.enabled {
            self.warn_half_precision_cache();
        }
        Ok(())
    }

    /// Decode passes run and the steps they carried (see [`Batcher::counts`]).
    pub fn decode_passes(&self) -> (u64, u64) {
        self.batcher.counts()
    }

    /// Whether the prefix cache is on.
    pub fn caching(&self) -> bool {
        self.cache.stats().is_some()
    }

    /// `counts` with the prefix cache's own counters over them, when the cache is on (a test
    /// can hold them against the records). Never waits for a running call (a server's
    /// `/metrics` asks while requests run): the counters are those the last call left.
    pub fn stats(&self, counts: &TokenCounts) -> BackendStats {
        counts.stats(&self.cache)
    }

    /// The engine, loading the model on `pool` on first use (once: the lock is held while
    /// loading).
    pub fn engine(&self, pool: &rayon::ThreadPool) -> Result<Arc<Engine>, PluginError> {
        // A panic while loading leaves the slot empty: loading again is safe.
        let mut slot = lock_or_reset(&self.engine, |_| {});
        if let Some(engine) = slot.as_ref() {
            return Ok(engine.clone());
        }
        let engine = Arc::new(install(pool, || self.load())?);
        *slot = Some(engine.clone());
        Ok(engine)
    }

    fn load(&self) -> Result<Engine, PluginError> {
        let s = &self.settings;
        let device = s.device()?;
        let dtype = s.dtype_on(&device)?;
        let attention = match (s.weights, s.attn_implementation.as_str()) {
            // bf16 products in the linear layers, and in attention over a shared prefix.
            (weights::WeightFormat::Bf16, "sdpa") => "sdpa_bf16",
            (_, name) => name,
        };
        let attention = attention::resolve(attention).map_err(PluginError::config)?;
        let memory_budget = s.memory_budget.bytes_on(&device);
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
            memory_budget,
            kv_dtype: s.kv_dtype(dtype),
        };
        let loaded = source::load(&self.model_id, &s.revision, s.model_class.as_deref(), build)?;
        Engine::new(
            loaded,
            s.max_context,
            s.chat_template.as_deref(),
            &self.model_id,
        )
    }

    /// Audio sent to a text model is refused, naming the model, and so is an image unless
    /// the model (loaded for it) sees images.
    fn refuse_media(
        &self,
        snapshot: &ConversationSnapshot,
        pool: &rayon::ThreadPool,
    ) -> Result<(), PluginError> {
        if snapshot.has_audio() {
            return Err(PluginError::invalid_input(format!(
                "audio snapshots need an audio model; `{}` loaded as a text-only causal \
                 language model (set `model_class = \"whisper\"` for a Whisper checkpoint)",
                self.model_id
            )));
        }
        if snapshot.has_images() && !self.engine(pool)?.front.sees_images() {
            return Err(PluginError::invalid_input(format!(
                "the conversation has an image; `{}` loaded as a text-only causal language \
                 model, which cannot see images",
                self.model_id
            )));
        }
        Ok(())
    }

    /// Runs `f` with the prefix store, if one is on (see [`SharedCache::with_store`]).
    fn with_store<T>(
        &self,
        f: impl FnOnce(Option<&mut dyn PrefixStore<KvState>>) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        self.cache.with_store(f)
    }

    /// Warns once that half-precision prefixes round differently from one forward pass (the
    /// cached path runs a prompt in several passes), and that float32 gives identical results.
    fn warn_half_precision_cache(&self) {
        // Before asking for the device: on CUDA each ask makes a context handle.
        if self.warned_half.load(Ordering::Relaxed) {
            return;
        }
        let s = &self.settings;
        let Ok(dtype) = s.device().and_then(|device| s.dtype_on(&device)) else {
            return; // loading reports a device the build lacks
        };
        if !matches!(dtype, DType::F16 | DType::BF16)
            || self.warned_half.swap(true, Ordering::Relaxed)
        {
            return;
        }
        self.logger.warn(&format!(
            "kv_cache with {dtype:?} compute: cached prefixes round differently from one forward \
             pass, so greedy outputs and logprobs can differ slightly from kv_cache off; set \
             `dtype = \"float32\"` in [backend.options] for identical results"
        ));
    }
}
