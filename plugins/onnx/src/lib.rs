//! An lmhost backend that runs decoder-only LMs exported to ONNX (Hugging Face Optimum's
//! layout: `model.onnx` with `past_key_values.N.*` inputs and `present.N.*` outputs, plus
//! config.json and the tokenizer files) on ONNX Runtime, loaded at run time.
//!
//! It keeps the same contract as candle through `lmhost-plugin-kit`: the same prompts (chat
//! template, tokenizer), sampler, stop rules and prompt-prefix cache tree, over KV state kept as
//! the graph's own `present` tensors.

pub mod engine;
pub mod options;
pub mod past;
mod runtime;
pub mod signature;

use std::sync::{Arc, Mutex};

use lmhost_plugin_api::{
    lock_or_reset, Backend, BackendStats, Capabilities, ConversationSnapshot, GenerationConfig,
    GenerationRecord, KvCacheSettings, OptionSpec, PluginContext, PluginError, ScoreRecord,
    TokenDelta, TokenizeRecord,
};
use lmhost_plugin_kit::prefix_cache::{SharedCache, TokenCounts};

use crate::engine::Engine;
use crate::options::Settings;
use crate::past::Past;

pub struct Onnx {
    model_id: String,
    settings: Settings,
    /// Loaded on first use, so opening a backend to list or validate costs nothing.
    engine: Mutex<Option<Arc<Engine>>>,
    cache: SharedCache<Past>,
    counts: TokenCounts,
}

impl Backend for Onnx {
    const NAME: &'static str = "onnx";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn options() -> Vec<OptionSpec> {
        options::specs()
    }

    /// Loads the ONNX Runtime library now, so a missing one is reported when the backend is
    /// opened; the model loads on first use.
    fn new(context: PluginContext) -> Result<Self, PluginError> {
        let settings = Settings::parse(&context.options()?);
        runtime::with_environment(settings.ort_library.as_deref(), |_| Ok(()))?;
        Ok(Onnx {
            model_id: context.model_id.to_string(),
            settings,
            engine: Mutex::default(),
            cache: SharedCache::default(),
            counts: TokenCounts::default(),
        })
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            returns_logprobs: true,
            scores_continuations: true,
            audio_input: false,
            image_input: false,
            hides: false,
            prefix_cache: true,
            embeddings: false,
        }
    }

    /// Hands out each token as it is sampled.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        config.validate()?;
        let engine = self.engine()?;
        let record = self
            .cache
            .with_store(|store| engine.generate(snapshot, config, store, sink))?;
        self.counts.add_generation(self.caching(), &record);
        Ok(record)
    }

    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        if snapshots.is_empty() {
            return Ok(Vec::new());
        }
        let engine = self.engine()?;
        let records = self
            .cache
            .with_store(|store| engine.score_batch(snapshots, reply, store))?;
        self.counts.add_scores(self.caching(), &records);
        Ok(records)
    }

    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        self.engine()?.front.tokenize(snapshot, add_special)
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.engine()?.front.detokenize(ids)
    }

    fn load(&self) -> Result<(), PluginError> {
        self.engine().map(drop)
    }

    /// Also starts the token counts afresh.
    fn set_kv_cache(&self, settings: KvCacheSettings) -> Result<(), PluginError> {
        self.counts.reset();
        self.cache.set(settings);
        Ok(())
    }

    /// The token counts, with the prefix cache's own counters when it is on: those the last
    /// call left, so this never waits for a running one.
    fn stats(&self) -> BackendStats {
        self.counts.stats(&self.cache)
    }
}

impl Onnx {
    /// The engine, loading the model on first use.
    pub fn engine(&self) -> Result<Arc<Engine>, PluginError> {
        let mut engine = lock_or_reset(&self.engine, |_| {});
        if let Some(engine) = engine.as_ref() {
            return Ok(Arc::clone(engine));
        }
        let loaded = Arc::new(Engine::load(&self.model_id, &self.settings)?);
        *engine = Some(Arc::clone(&loaded));
        Ok(loaded)
    }

    /// Whether the prefix cache is on.
    fn caching(&self) -> bool {
        self.cache.stats().is_some()
    }
}
