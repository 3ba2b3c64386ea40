//! The processor path: speech-to-text models (Whisper) behind the candle backend.
//!
//! As in the reference backend (`shared/seeds/000_...txt`), a checkpoint that is not a plain
//! causal LM loads with its processor and takes audio parts. Audio prompts skip the prefix cache
//! (they are not token prefixes); instead the encoder output of each distinct audio (its
//! cross-attention keys and values) is cached, so coalitions that keep the same audio and drop
//! text parts encode it once. The conversation's text parts become the decoder prompt after
//! `<|startofprev|>`.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use lmhost_plugin_api::abi_stable::std_types::{ROption, RString, RVec};
use lmhost_plugin_api::{
    lock_or_reset, Capabilities, ConversationSnapshot, GenerationConfig, GenerationRecord, Part,
    PluginError, ScoreRecord,
};
use serde_json::{Map, Value};

use crate::models::whisper::model::CrossKv;
use crate::models::whisper::{self, LoadedWhisper};
use crate::options::{Settings, DEFAULT_MAX_AUDIO_SECONDS};
use crate::processor::WhisperProcessor;

/// Encoded audios kept (each 30 s window of tiny.en is about 18 MB of keys and values).
const ENCODER_CACHE_ENTRIES: usize = 4;
/// Identifies an audio: a hash of its 16 kHz samples and their count.
type AudioKey = (u64, usize);
/// A static and a contextual embedding.
type Embeddings = (ROption<RVec<f32>>, ROption<RVec<f32>>);

/// The speech kind of the backend: a Whisper model with its processor, loaded on first use,
/// one call at a time.
pub struct SpeechModel {
    model_id: String,
    /// `[backend.options]`, read when the model loads.
    options: Map<String, Value>,
    backend: Mutex<Option<AudioBackend>>,
}

impl SpeechModel {
    pub fn new(model_id: String, options: Map<String, Value>) -> Self {
        SpeechModel {
            model_id,
            options,
            backend: Mutex::new(None),
        }
    }

    /// Runs `f` on the model, loading it first if needed.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut AudioBackend) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        // A call that panicked may have left the model's encoder cache half-updated: it is
        // dropped and the model loads afresh.
        let mut slot = lock_or_reset(&self.backend, |slot| *slot = None);
        let backend = match &mut *slot {
            Some(backend) => backend,
            empty => empty.insert(AudioBackend::load(
                &self.model_id,
                Path::new(&self.model_id),
                &self.options,
            )?),
        };
        f(backend)
    }
}

/// An audio-capable model with its processor.
pub struct AudioBackend {
    model_id: String,
    loaded: LoadedWhisper,
    processor: WhisperProcessor,
    /// (hash of the 16 kHz samples, their count) to encoded windows, most recent last.
    encoded: Vec<(AudioKey, Arc<Vec<CrossKv>>)>,
    encoder_runs: u64,
}

/// The audio and text of a snapshot, ready for the model.
struct Prompt {
    samples: Vec<f32>,
    previous: Vec<u32>,
}

impl AudioBackend {
    /// Loads the Whisper checkpoint in `dir`; `options` is `[backend.options]`.
    pub fn load(
        model_id: &str,
        dir: &Path,
        options: &Map<String, Value>,
    ) -> Result<Self, PluginError> {
        let max_seconds = options
            .get("max_audio_seconds")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_MAX_AUDIO_SECONDS);
        // `device` and `dtype` as the text path reads them; `threads` is the caller's pool.
        let settings = Settings::parse(options)?;
        let device = settings.device()?;
        let loaded = whisper::load(dir, &device, settings.dtype_on(&device)?)?;
        let processor = WhisperProcessor::new(loaded.model.config.num_mel_bins, max_seconds as f64);
        Ok(AudioBackend {
            model_id: model_id.to_string(),
            loaded,
            processor,
            encoded: Vec::new(),
            encoder_runs: 0,
        })
    }

    pub fn capabilities() -> Capabilities {
        Capabilities {
            returns_logprobs: true,
            scores_continuations: true,
            audio_input: true,
            prefix_cache: false,
            embeddings: true,
        }
    }

    pub fn loaded(&self) -> &LoadedWhisper {
        &self.loaded
    }

    pub fn processor(&self) -> &WhisperProcessor {
        &self.processor
    }

    /// How many times the encoder ran (a cached audio does not run it).
    pub fn encoder_runs(&self) -> u64 {
        self.encoder_runs
    }

    fn internal(&self, e: candle_core::Error) -> PluginError {
        PluginError::internal(format!("whisper model `{}`: {e}", self.model_id))
    }

    /// Every audio part, in order, resampled and joined; the text parts tokenised as context.
    fn prompt(&self, snapshot: &ConversationSnapshot) -> Result<Prompt, PluginError> {
        let mut samples = Vec::new();
        let mut texts = Vec::new();
        for (m, message) in snapshot.messages().enumerate() {
            for (p, part) in message.parts.iter().enumerate() {
                match part {
                    Part::Audio { audio } => {
                        let what = format!("message {}, part {} (audio)", m + 1, p + 1);
                        samples.extend(self.processor.prepare(audio, &what)?);
                    }
                    Part::Text { text } if !text.trim().is_empty() => texts.push(text.trim()),
                    Part::Text { .. } => {}
                    Part::Image { .. } => {
                        return Err(PluginError::invalid_input(format!(
                            "message {}, part {} is an image; model `{}` is a speech-to-text \
                             model (Whisper) and takes audio and text",
                            m + 1,
                            p + 1,
                            self.model_id
                        )))
                    }
                }
            }
        }
        if samples.is_empty() {
            return Err(PluginError::invalid_input(format!(
                "model `{}` is a speech-to-text model (Whisper) and needs an audio part; \
                 the conversation has none",
                self.model_id
            )));
        }
        let seconds = samples.len() as f64 / f64::from(WhisperProcessor::SAMPLE_RATE);
        let limit = self.processor.max_seconds();
        if seconds > limit {
            return Err(PluginError::invalid_input(format!(
                "the conversation's audio parts together are {seconds:.1} s long; model `{}` \
                 takes at most {limit} s (option `max_audio_seconds`)",
                self.model_id
            )));
        }
        let previous = self.previous_text(&texts.join(" "))?;
        Ok(Prompt { samples, previous })
    }

    /// Tokens of the context text, keeping the last half-context as Whisper does.
    fn previous_text(&self, text: &str) -> Result<Vec<u32>, PluginError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let encoding = self
            .loaded
            .tokenizer
            .encode(format!(" {text}"), false)
            .map_err(|e| PluginError::invalid_input(format!("cannot tokenize text parts: {e}")))?;
        let ids = encoding.get_ids();
        let keep = self.loaded.model.config.max_target_positions / 2 - 1;
        Ok(ids[ids.len().saturating_sub(keep)..].to_vec())
    }

    /// The encoded windows of `samples`, from the cache when this audio was seen.
    fn encode(&mut self, samples: &[f32]) -> Result<Arc<Vec<CrossKv>>, PluginError> {
        let mut hasher = DefaultHasher::new();
        samples.iter().for_each(|s| s.to_bits().hash(&mut hasher));
        let key = (hasher.finish(), samples.len());
        if let Some(i) = self.encoded.iter().position(|(k, _)| *k == key) {
            let entry = self.encoded.remove(i);
            let windows = entry.1.clone();
            self.encoded.push(entry);
            return Ok(windows);
        }
        let features = self.processor.features(samples);
        let windows =
            whisper::decode::encode(&self.loaded.model, &features).map_err(|e| self.internal(e))?;
        self.encoder_runs += 1;
        let windows = Arc::new(windows);
        if self.encoded.len() >= ENCODER_CACHE_ENTRIES {
            self.encoded.remove(0);
        }
        self.encoded.push((key, windows.clone()));
        Ok(windows)
    }

    fn text(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.loaded
            .tokenizer
            .decode(ids, true)
            .map_err(|e| PluginError::internal(format!("cannot decode tokens: {e}")))
    }

    pub fn generate(
        &mut self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord, PluginError> {
        let prompt = self.prompt(snapshot)?;
        let windows = self.encode(&prompt.samples)?;
        let stops: Vec<&str> = config.stop.iter().map(|s| s.as_str()).collect();
        let tokenizer = &self.loaded.tokenizer;
        let stop = |ids: &[u32]| {
            !stops.is_empty()
                && tokenizer
                    .decode(ids, true)
                    .is_ok_and(|t| stops.iter().any(|s| t.contains(s)))
        };
        let model = &self.loaded.model;
        let decoded = model
            .transcribe(
                &windows,
                &self.loaded.tokens,
                &prompt.previous,
                config,
                stop,
            )
            .map_err(|e| self.internal(e))?;
        let mut text = self.text(&decoded.ids)?;
        if let Some(at) = stops.iter().filter_map(|s| text.find(s)).min() {
            text.truncate(at);
        }
        let (embedding, contextual) = if config.compute_embeddings && !decoded.ids.is_empty() {
            self.embeddings(&windows, &prompt.previous, &decoded.per_window)
                .map_err(|e| self.internal(e))?
        } else {
            (ROption::RNone, ROption::RNone)
        };
        Ok(GenerationRecord {
            text: RString::from(text.trim()),
            token_ids: RVec::from(decoded.ids),
            logprobs: RVec::from(decoded.logprobs),
            embedding,
            contextual_embedding: contextual,
            prompt_tokens: decoded.prompt_tokens as u32,
            cached_prompt_tokens: 0,
            finish_reason: decoded.finish,
        })
    }

    /// Static (mean token-embedding row) and contextual (mean final hidden state, teacher-forced
    /// per window) embeddings of the generated tokens.
    fn embeddings(
        &self,
        windows: &[CrossKv],
        previous: &[u32],
        per_window: &[Vec<u32>],
    ) -> candle_core::Result<Embeddings> {
        let model = &self.loaded.model;
        let all: Vec<u32> = per_window.iter().flatten().copied().collect();
        let mean = |t: Tensor| -> candle_core::Result<ROption<RVec<f32>>> {
            Ok(ROption::RSome(RVec::from(
                t.to_dtype(DType::F32)?.mean(0)?.to_vec1::<f32>()?,
            )))
        };
        let embedding = mean(model.decoder.embed(&all)?)?;
        let mut hidden = Vec::new();
        for (cross, ids) in windows.iter().zip(per_window) {
            if !ids.is_empty() {
                let (h, _) = model.force(cross, &self.loaded.tokens, previous, ids)?;
                hidden.push(h.squeeze(0)?);
            }
        }
        Ok((embedding, mean(Tensor::cat(&hidden, 0)?)?))
    }

    /// Teacher-forced logprobs of `reply` as the transcript of the snapshot's audio (which must
    /// fit one 30 s window: a transcript cannot be aligned to windows).
    pub fn score(
        &mut self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        let prompt = self.prompt(snapshot)?;
        if prompt.samples.len() > WhisperProcessor::WINDOW_SAMPLES {
            return Err(PluginError::invalid_input(format!(
                "scoring needs audio of at most {} s (one window); the conversation has {:.1} s",
                WhisperProcessor::WINDOW_SECONDS,
                prompt.samples.len() as f64 / f64::from(WhisperProcessor::SAMPLE_RATE)
            )));
        }
        let reply = reply.trim();
        let ids = self
            .loaded
            .tokenizer
            .encode(format!(" {reply}"), false)
            .map_err(|e| PluginError::invalid_input(format!("cannot tokenize the reply: {e}")))?
            .get_ids()
            .to_vec();
        if reply.is_empty() || ids.is_empty() {
            return Err(PluginError::invalid_input(
                "the reply to score is empty; expected at least one token",
            ));
        }
        let windows = self.encode(&prompt.samples)?;
        let Some(cross) = windows.first() else {
            return Err(PluginError::internal("the audio produced no window"));
        };
        let (_, logprobs) = self
            .loaded
            .model
            .force(cross, &self.loaded.tokens, &prompt.previous, &ids)
            .map_err(|e| PluginError::invalid_input(format!("cannot score the reply: {e}")))?;
        Ok(ScoreRecord {
            prompt_tokens: self.loaded.tokens.prompt(&prompt.previous).len() as u32,
            token_ids: RVec::from(ids),
            logprobs: RVec::from(logprobs),
            cached_prompt_tokens: 0,
        })
    }
}
