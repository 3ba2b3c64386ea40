//! `candle`: local causal language models and Whisper on Hugging Face's candle.
//!
//! The backend is one of two kinds of model, each its own type: a [`text_model::TextModel`]
//! (causal LM, prefix cache) or an [`audio_backend::SpeechModel`] (Whisper and its processor).
//! Either loads lazily (first call, once, under a lock); every call runs in the backend's
//! thread pool.

pub mod accelerator;
pub mod attention;
pub mod audio_backend;
pub mod batch;
pub mod engine;
pub mod kernels;
pub mod kv;
pub mod memory;
pub mod models;
pub mod options;
pub mod processor;
pub mod source;
pub mod text_model;
pub mod weights;

use std::sync::Arc;

use lmhost_plugin_api::{
    Backend, BackendStats, Capabilities, ConversationSnapshot, EmbeddingRecord, GenerationConfig,
    GenerationRecord, Hideable, KvCacheSettings, OptionSpec, PluginContext, PluginError,
    ScoreRecord, TokenDelta, TokenizeRecord,
};
use lmhost_plugin_kit::text::Hiding;

use crate::audio_backend::{AudioBackend, SpeechModel};
use crate::engine::Engine;
use crate::options::Settings;
use crate::text_model::TextModel;
use lmhost_plugin_kit::prefix_cache::TokenCounts;

/// Sets, where unset, what candle 0.11's CPU thread pools read from the environment, as the
/// `lmhost` binary does first thing: `RAYON_NUM_THREADS` (without it candle counts the cores
/// from `/proc` on every f32 matrix product, a large part of a small model's decode step) and
/// `CANDLE_BARRIER_POOL_SPIN_LIMIT=0` (candle's own pool for large elementwise ops otherwise
/// spins after each, on the cores the next matrix product needs). Call it while the process has one thread: a thread reading the environment as it
/// changes is undefined behaviour.
pub fn tune_thread_env() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "0");
    }
}

pub struct Candle {
    model_id: String,
    /// Every call runs here: option `threads`.
    pool: rayon::ThreadPool,
    model: Model,
    /// Token counts over the backend's life (the prefix cache adds its own counters).
    counts: TokenCounts,
}

/// What the checkpoint is: each kind of model is its own type.
#[allow(clippy::large_enum_variant)] // one per backend: boxing would save nothing
enum Model {
    Text(TextModel),
    Speech(SpeechModel),
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
        lmhost_plugin_kit::simd::Simd::cap().map_err(PluginError::config)?;
        let model_id = context.model_id.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(settings.threads)
            .build()
            .map_err(|e| PluginError::config(format!("option `threads`: {e}")))?;
        // `model_class` decides; `auto` asks the checkpoint (config.json or model.bin).
        let speech = match settings.model_class.as_deref() {
            Some("whisper") => true,
            Some(_) => false,
            None => models::whisper::detect(std::path::Path::new(&model_id)),
        };
        let model = if speech {
            Model::Speech(SpeechModel::new(model_id.clone(), options))
        } else {
            Model::Text(TextModel::new(
                model_id.clone(),
                settings,
                context.logger.clone(),
            ))
        };
        Ok(Candle {
            model_id,
            pool,
            model,
            counts: TokenCounts::default(),
        })
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn capabilities(&self) -> Capabilities {
        match self.model {
            Model::Speech(_) => AudioBackend::capabilities(),
            Model::Text(_) => Capabilities {
                returns_logprobs: true,
                scores_continuations: true,
                audio_input: false,
                prefix_cache: true,
                embeddings: true,
                image_input: models::vision::may_see(std::path::Path::new(&self.model_id)),
                hides: true,
            },
        }
    }

    /// A text model hands out each token as it is sampled; Whisper the whole transcript.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        config.validate()?;
        let record = match &self.model {
            Model::Text(text) => text.generate(snapshot, config, sink, &self.pool),
            Model::Speech(speech) => {
                let record =
                    speech.with(|audio| self.pool.install(|| audio.generate(snapshot, config)))?;
                sink(&TokenDelta::from(&record));
                Ok(record)
            }
        }?;
        self.counts.add_generation(self.caching(), &record);
        Ok(record)
    }

    /// A text model runs a batch's prompts in packed passes and decodes their replies
    /// together (see [`TextModel::generate_batch`]); a speech model one at a time.
    fn generate_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        config: &GenerationConfig,
    ) -> Result<Vec<GenerationRecord>, PluginError> {
        config.validate()?;
        let records = match &self.model {
            Model::Text(text) => text.generate_batch(snapshots, config, &self.pool)?,
            Model::Speech(_) => {
                return snapshots.iter().map(|s| self.generate(s, config)).collect();
            }
        };
        for record in &records {
            self.counts.add_generation(self.caching(), record);
        }
        Ok(records)
    }

    /// A text model runs the prompts in packed passes; a speech model scores one at a time.
    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        if snapshots.is_empty() {
            return Ok(Vec::new()); // without loading the model
        }
        let records = match &self.model {
            Model::Text(text) => text.score_batch(snapshots, reply, &self.pool),
            Model::Speech(speech) => speech.with(|audio| {
                self.pool.install(|| {
                    snapshots
                        .iter()
                        .map(|snapshot| audio.score(snapshot, reply))
                        .collect()
                })
            }),
        }?;
        Ok(self.scores_counted(records))
    }

    /// A text model hides text and image tokens from the rows after `from_message`; a speech
    /// model hides text from its decoder prompt and audio from its cross-attention, every
    /// decoder row computed again (the encoder output is cached).
    fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        parts: &Hideable,
        hidden: &[Vec<u32>],
        from_message: u32,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let hiding = Hiding {
            parts,
            hidden,
            from_message,
        };
        let records = match &self.model {
            Model::Text(text) => text.score_hidden(snapshot, reply, &hiding, &self.pool)?,
            Model::Speech(speech) => speech.with(|audio| {
                self.pool
                    .install(|| audio.score_hidden(snapshot, reply, parts, hidden))
            })?,
        };
        Ok(self.scores_counted(records))
    }

    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        let text = self.text("tokenize")?;
        text.tokenize(snapshot, add_special, &self.pool)
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, PluginError> {
        let text = self.text("detokenize")?;
        text.detokenize(ids, &self.pool)
    }

    /// Mean-pooled final hidden states of each text (text models).
    fn embed(&self, texts: &[String]) -> Result<Vec<EmbeddingRecord>, PluginError> {
        let text = self.text("embed")?;
        text.embed(texts, &self.pool)
    }

    /// Also starts the token counts afresh. Audio prompts are not token prefixes: a speech
    /// model has no cache to set.
    fn set_kv_cache(&self, settings: KvCacheSettings) -> Result<(), PluginError> {
        self.counts.reset();
        match &self.model {
            Model::Text(text) => text.set_kv_cache(settings),
            Model::Speech(_) => Ok(()),
        }
    }

    fn load(&self) -> Result<(), PluginError> {
        match &self.model {
            Model::Text(text) => text.engine(&self.pool).map(drop),
            Model::Speech(speech) => speech.with(|_| Ok(())),
        }
    }

    fn stats(&self) -> BackendStats {
        match &self.model {
            Model::Text(text) => text.stats(&self.counts),
            Model::Speech(_) => self.counts.get(),
        }
    }
}

impl Candle {
    /// The text model's engine, loading the model on first use; refused for a speech model.
    pub fn engine(&self) -> Result<Arc<Engine>, PluginError> {
        let text = self.text("a text engine")?;
        text.engine(&self.pool)
    }

    /// Decode passes run and the decode steps they carried, over all generations so far: their
    /// ratio is the mean batch size of continuous batching.
    pub fn decode_passes(&self) -> (u64, u64) {
        match &self.model {
            Model::Text(text) => text.decode_passes(),
            Model::Speech(_) => (0, 0),
        }
    }

    /// The text model, or an error naming what a speech model does not offer.
    fn text(&self, what: &str) -> Result<&TextModel, PluginError> {
        match &self.model {
            Model::Text(text) => Ok(text),
            Model::Speech(_) => Err(PluginError::unsupported(format!(
                "`{}` is a speech model; {what} is offered for text models",
                self.model_id
            ))),
        }
    }

    /// `records` after counting their prompt tokens.
    fn scores_counted(&self, records: Vec<ScoreRecord>) -> Vec<ScoreRecord> {
        self.counts.add_scores(self.caching(), &records);
        records
    }

    /// Whether the prefix cache is on (a speech model has none).
    fn caching(&self) -> bool {
        match &self.model {
            Model::Text(text) => text.caching(),
            Model::Speech(_) => false,
        }
    }
}
