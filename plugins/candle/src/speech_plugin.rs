//! An interim `candle` plugin entry point that serves the processor path only.
//!
//! The causal-LM backend is written on the `candle` branch; until it lands here, this backend
//! makes `kind = "candle"` usable for speech models. It shows the delegation the full backend
//! does: `model_class` (or the checkpoint itself, see [`crate::models::whisper::detect`]) picks
//! the audio path, and every call goes to [`AudioBackend`] under one lock. A checkpoint that is
//! not a speech model is refused with a message saying so.

use std::path::Path;
use std::sync::Mutex;

use lmhost_plugin_api::{
    Backend, Capabilities, ConversationSnapshot, GenerationConfig, GenerationRecord, OptionSpec,
    PluginContext, PluginError, ScoreRecord,
};

use crate::audio_backend::{self, AudioBackend};
use crate::models::whisper;

/// `model_class` values: `auto` decides from the checkpoint.
pub const MODEL_CLASSES: &[&str] = &["auto", "causal_lm", "whisper"];

pub struct CandleSpeech {
    model_id: String,
    audio: Mutex<Option<AudioBackend>>,
}

impl Backend for CandleSpeech {
    const NAME: &'static str = "candle";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn options() -> Vec<OptionSpec> {
        let mut options = vec![OptionSpec::choice(
            "model_class",
            MODEL_CLASSES,
            "auto",
            "model class: `auto` reads config.json / model.bin; `whisper` forces the speech path",
        )];
        options.extend(audio_backend::options());
        options
    }

    fn new(context: PluginContext) -> Result<Self, PluginError> {
        let options = context.options()?;
        let model_id = context.model_id.to_string();
        let dir = Path::new(&model_id);
        let class = options
            .get("model_class")
            .and_then(|v| v.as_str())
            .unwrap_or("auto");
        let speech = match class {
            "whisper" => true,
            "auto" => whisper::detect(dir),
            _ => false,
        };
        if !speech {
            return Err(PluginError::unsupported(format!(
                "model `{model_id}` is not a speech model (model_class `{class}`); this build of \
                 the candle plugin serves only the audio path (Whisper)"
            )));
        }
        let audio = AudioBackend::load(&model_id, dir, &options)?;
        Ok(CandleSpeech {
            model_id,
            audio: Mutex::new(Some(audio)),
        })
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn capabilities(&self) -> Capabilities {
        AudioBackend::capabilities()
    }

    fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord, PluginError> {
        self.with(|audio| audio.generate(snapshot, config))
    }

    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        self.with(|audio| audio.score(snapshot, reply))
    }

    fn close(&self) {
        if let Ok(mut audio) = self.audio.lock() {
            *audio = None;
        }
    }
}

impl CandleSpeech {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut AudioBackend) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let mut guard = self.audio.lock().unwrap_or_else(|e| e.into_inner());
        match guard.as_mut() {
            Some(audio) => f(audio),
            None => Err(PluginError::unavailable(format!(
                "backend for `{}` was closed",
                self.model_id
            ))),
        }
    }
}
