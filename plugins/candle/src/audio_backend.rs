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
    lock_or_reset, AudioSpan, Capabilities, ConversationSnapshot, GenerationConfig,
    GenerationRecord, Hideable, Part, PluginError, ScoreRecord, TextSpan,
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
/// Token ids, each with its byte range in the text they came from.
type TokensAt = (Vec<u32>, Vec<(usize, usize)>);
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
    /// Where each audio part lies in `samples`, in conversation order.
    clips: Vec<Clip>,
    /// The text `previous` was tokenised from, and each of its tokens' byte range there.
    context: Context,
    offsets: Vec<(usize, usize)>,
}

/// Audio part `audio` of message `message`, at `rate` Hz, starting at 16 kHz sample `start`
/// of the prompt's audio and `len` samples long there.
struct Clip {
    message: u32,
    audio: u32,
    rate: u32,
    start: usize,
    len: usize,
}

/// The text parts joined as the decoder's context (each trimmed, each after a space), and where
/// each of its bytes comes from: `(message, byte of its text_content)`, `None` for a space.
#[derive(Default)]
struct Context {
    text: String,
    origin: Vec<Option<(u32, usize)>>,
}

impl Context {
    /// Adds the text part `text` of message `message`, which starts at byte `at` of the
    /// message's text_content.
    fn push(&mut self, message: u32, at: usize, text: &str) {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return;
        }
        let lead = text.len() - text.trim_start().len();
        self.text.push(' ');
        self.origin.push(None);
        self.text.push_str(trimmed);
        self.origin
            .extend((0..trimmed.len()).map(|k| Some((message, at + lead + k))));
    }

    /// Whether bytes `start..end` of the context spell some of a hidden span.
    fn spells(&self, (start, end): (usize, usize), hidden: &[&TextSpan]) -> bool {
        let bytes = self.origin.get(start..end.min(self.origin.len()));
        (bytes.unwrap_or_default().iter().flatten()).any(|&(m, b)| {
            (hidden.iter()).any(|s| s.message == m && (s.start as usize) <= b && b < s.end as usize)
        })
    }
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
            image_input: false,
            hides: true,
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
        let mut clips = Vec::new();
        let mut context = Context::default();
        for (m, message) in snapshot.messages().enumerate() {
            let (mut at, mut audios) = (0, 0);
            for (p, part) in message.parts.iter().enumerate() {
                match part {
                    Part::Audio { audio } => {
                        let what = format!("message {}, part {} (audio)", m + 1, p + 1);
                        let prepared = self.processor.prepare(audio, &what)?;
                        clips.push(Clip {
                            message: m as u32,
                            audio: audios,
                            rate: audio.sample_rate,
                            start: samples.len(),
                            len: prepared.len(),
                        });
                        samples.extend(prepared);
                        audios += 1;
                    }
                    Part::Text { text } => {
                        context.push(m as u32, at, text);
                        at += text.len();
                    }
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
        let (previous, offsets) = self.previous_text(&context)?;
        Ok(Prompt {
            samples,
            previous,
            clips,
            context,
            offsets,
        })
    }

    /// Tokens of the context text, keeping the last half-context as Whisper does, each with
    /// its byte range in the text.
    fn previous_text(&self, context: &Context) -> Result<TokensAt, PluginError> {
        if context.text.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let encoding = (self.loaded.tokenizer)
            .encode(context.text.as_str(), false)
            .map_err(|e| PluginError::invalid_input(format!("cannot tokenize text parts: {e}")))?;
        let keep = self.loaded.model.config.max_target_positions / 2 - 1;
        let from = encoding.get_ids().len().saturating_sub(keep);
        Ok((
            encoding.get_ids()[from..].to_vec(),
            encoding.get_offsets()[from..].to_vec(),
        ))
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
                let (h, _) = model.force((cross, &self.loaded.tokens), previous, ids, &[])?;
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
        let (prompt, ids, cross) = self.forced(snapshot, reply)?;
        self.scored(&prompt, ids, &cross, &[])
    }

    /// [`Self::score`] once per entry of `hidden`, with the `parts` it lists hidden: no decoder
    /// token attends to a context token that spells hidden text, and none cross-attends to an
    /// encoder position (20 ms) that overlaps a hidden stretch of audio. The audio is encoded
    /// once; each entry runs the decoder over the prompt and the reply.
    pub fn score_hidden(
        &mut self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        parts: &Hideable,
        hidden: &[Vec<u32>],
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let (prompt, ids, cross) = self.forced(snapshot, reply)?;
        let positions = cross.positions().map_err(|e| self.internal(e))?;
        hidden
            .iter()
            .map(|entry| {
                let hidden = parts.hidden(entry);
                if !hidden.boxes.is_empty() {
                    return Err(PluginError::invalid_input(format!(
                        "model `{}` is a speech-to-text model and sees no images to hide",
                        self.model_id
                    )));
                }
                let heard = encoder_positions(&prompt.clips, &hidden.clips, positions);
                let cross = match heard.iter().any(|&h| h) {
                    true => cross.hiding(&heard).map_err(|e| self.internal(e))?,
                    false => cross.clone(),
                };
                // `<|startofprev|>` is position 0; the context's tokens follow it.
                let read = (prompt.offsets.iter().enumerate())
                    .filter(|(_, &at)| prompt.context.spells(at, &hidden.spans))
                    .map(|(i, _)| i + 1)
                    .collect::<Vec<usize>>();
                self.scored(&prompt, ids.clone(), &cross, &read)
            })
            .collect()
    }

    /// The prompt, the reply's ids and the audio's encoded window, for scoring `reply`.
    fn forced(
        &mut self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<(Prompt, Vec<u32>, CrossKv), PluginError> {
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
        Ok((prompt, ids, cross.clone()))
    }

    /// The logprobs of `ids` after `prompt` over `cross`, the context's tokens at positions
    /// `hidden` unseen.
    fn scored(
        &self,
        prompt: &Prompt,
        ids: Vec<u32>,
        cross: &CrossKv,
        hidden: &[usize],
    ) -> Result<ScoreRecord, PluginError> {
        let tokens = &self.loaded.tokens;
        let (_, logprobs) = (self.loaded.model)
            .force((cross, tokens), &prompt.previous, &ids, hidden)
            .map_err(|e| PluginError::invalid_input(format!("cannot score the reply: {e}")))?;
        Ok(ScoreRecord {
            prompt_tokens: tokens.prompt(&prompt.previous).len() as u32,
            token_ids: RVec::from(ids),
            logprobs: RVec::from(logprobs),
            cached_prompt_tokens: 0,
        })
    }
}

/// Which of a window's `positions` encoder positions (20 ms of 16 kHz audio each) overlap one
/// of the `hidden` stretches of the prompt's `clips`.
fn encoder_positions(clips: &[Clip], hidden: &[&AudioSpan], positions: usize) -> Vec<bool> {
    let per_position = WhisperProcessor::HOP * 2;
    let to_16k = |sample: u32, rate: u32, up: bool| {
        let exact = f64::from(sample) * f64::from(WhisperProcessor::SAMPLE_RATE) / f64::from(rate);
        (if up { exact.ceil() } else { exact.floor() }) as usize
    };
    let mut out = vec![false; positions];
    for span in hidden {
        let found = clips
            .iter()
            .find(|c| c.message == span.message && c.audio == span.audio);
        let Some(clip) = found.filter(|c| c.rate > 0) else {
            continue;
        };
        let a = clip.start + to_16k(span.start, clip.rate, false).min(clip.len);
        let b = clip.start + to_16k(span.end, clip.rate, true).min(clip.len);
        // A stretch given backwards (the host refuses one; a library caller may not) is empty.
        let end = b.div_ceil(per_position).min(positions);
        let covered = (a / per_position).min(end)..end;
        out[covered].iter_mut().for_each(|h| *h = true);
    }
    out
}
