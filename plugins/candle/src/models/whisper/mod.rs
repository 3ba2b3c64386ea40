//! Whisper, the first audio model: an encoder over log-mel windows and a text decoder that
//! cross-attends to it (<https://arxiv.org/abs/2212.04356>; reference code
//! `openai/whisper`, Hugging Face `modeling_whisper.py`, candle-transformers' `whisper/`).
//!
//! - [`model`]: the network, over Hugging Face tensor names.
//! - [`ct2`]: CTranslate2 `model.bin` (faster-whisper's format) read directly and renamed.
//! - [`load`]: a model folder in either format, with its tokenizer and special tokens.
//! - [`decode`]: transcription (greedy or sampled, logprobs from raw logits) and scoring.

pub mod ct2;
pub mod decode;
pub mod model;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use tokenizers::Tokenizer;

use lmhost_plugin_api::PluginError;
pub use model::Whisper;

fn default_ffn() -> usize {
    1536
}

/// The fields of a Hugging Face Whisper `config.json` the model needs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Config {
    pub num_mel_bins: usize,
    pub d_model: usize,
    pub vocab_size: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub decoder_attention_heads: usize,
    #[serde(default = "default_ffn")]
    pub encoder_ffn_dim: usize,
    #[serde(default = "default_ffn")]
    pub decoder_ffn_dim: usize,
    pub max_source_positions: usize,
    pub max_target_positions: usize,
    /// Never generated.
    #[serde(default)]
    pub suppress_tokens: Vec<u32>,
    /// Not generated as the first token (a blank or end of text).
    #[serde(default)]
    pub begin_suppress_tokens: Vec<u32>,
}

/// The token ids decoding needs, looked up in the tokenizer by their text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    pub start_of_transcript: u32,
    pub end_of_text: u32,
    pub no_timestamps: u32,
    /// `<|startofprev|>`: text before it conditions the decoder (the conversation's text parts).
    pub start_of_prev: Option<u32>,
    /// For multilingual models: `<|en|>` and `<|transcribe|>` after the start token.
    pub task: Vec<u32>,
}

impl SpecialTokens {
    fn from_tokenizer(tokenizer: &Tokenizer, multilingual: bool) -> Result<Self, String> {
        let id = |t: &str| tokenizer.token_to_id(t);
        let need = |t: &str| id(t).ok_or_else(|| format!("the tokenizer has no `{t}` token"));
        let task = if multilingual {
            vec![need("<|en|>")?, need("<|transcribe|>")?]
        } else {
            Vec::new()
        };
        Ok(SpecialTokens {
            start_of_transcript: need("<|startoftranscript|>")?,
            end_of_text: need("<|endoftext|>")?,
            no_timestamps: need("<|notimestamps|>")?,
            start_of_prev: id("<|startofprev|>"),
            task,
        })
    }

    /// The decoder prompt: `[<|startofprev|> text...] <|startoftranscript|> [task] <|notimestamps|>`.
    pub fn prompt(&self, previous_text: &[u32]) -> Vec<u32> {
        let mut ids = Vec::new();
        if let (Some(prev), false) = (self.start_of_prev, previous_text.is_empty()) {
            ids.push(prev);
            ids.extend_from_slice(previous_text);
        }
        ids.push(self.start_of_transcript);
        ids.extend_from_slice(&self.task);
        ids.push(self.no_timestamps);
        ids
    }
}

/// A loaded Whisper: the network, its tokenizer and the tokens decoding needs.
pub struct LoadedWhisper {
    pub model: Whisper,
    pub tokenizer: Tokenizer,
    pub tokens: SpecialTokens,
    /// `ctranslate2` or `safetensors`.
    pub format: &'static str,
}

/// Whether `dir` holds a Whisper checkpoint: a Hugging Face `config.json` with
/// `model_type = "whisper"`, or a CTranslate2 `model.bin` of a `WhisperSpec`.
pub fn detect(dir: &Path) -> bool {
    if let Ok(text) = std::fs::read_to_string(dir.join("config.json")) {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) {
            if value.get("model_type").and_then(|v| v.as_str()) == Some("whisper") {
                return true;
            }
        }
    }
    let mut head = [0u8; 64];
    std::fs::File::open(dir.join("model.bin"))
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .is_ok_and(|n| head[..n].windows(7).any(|w| w == b"Whisper"))
}

/// CTranslate2's `config.json` beside `model.bin` (not Hugging Face's): the suppressed tokens.
#[derive(Deserialize, Default)]
struct Ct2Config {
    #[serde(default)]
    suppress_ids: Vec<u32>,
    #[serde(default)]
    suppress_ids_begin: Vec<u32>,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, PluginError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PluginError::unavailable(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| PluginError::unavailable(format!("{}: {e}", path.display())))
}

/// Loads the Whisper checkpoint in `dir`: `model.bin` (CTranslate2) if present, else
/// `model.safetensors` with `config.json` (Hugging Face); `tokenizer.json` in both cases. The
/// network computes in `dtype` on `device`.
pub fn load(dir: &Path, device: &Device, dtype: DType) -> Result<LoadedWhisper, PluginError> {
    let file = |name: &str| dir.join(name);
    let unavailable = |path: PathBuf, e: String| {
        PluginError::unavailable(format!("cannot load Whisper from {}: {e}", path.display()))
    };
    let (config, tensors, format) = if file("model.bin").is_file() {
        let (mut config, tensors) =
            ct2::load(&file("model.bin")).map_err(|e| unavailable(file("model.bin"), e))?;
        if file("config.json").is_file() {
            let extra: Ct2Config = read_json(&file("config.json"))?;
            config.suppress_tokens = extra.suppress_ids;
            config.begin_suppress_tokens = extra.suppress_ids_begin;
        }
        (config, tensors, "ctranslate2")
    } else if file("model.safetensors").is_file() {
        let config: Config = read_json(&file("config.json"))?;
        let tensors = candle_core::safetensors::load(file("model.safetensors"), &Device::Cpu)
            .map_err(|e| unavailable(file("model.safetensors"), e.to_string()))?;
        (config, tensors, "safetensors")
    } else {
        return Err(PluginError::unavailable(format!(
            "{} holds no Whisper weights; expected model.bin (CTranslate2) or \
             model.safetensors with config.json (Hugging Face)",
            dir.display()
        )));
    };
    let model = build(config, tensors, device, dtype)
        .map_err(|e| unavailable(dir.to_path_buf(), e.to_string()))?;
    let tokenizer = Tokenizer::from_file(file("tokenizer.json"))
        .map_err(|e| unavailable(file("tokenizer.json"), e.to_string()))?;
    let multilingual = model.config.vocab_size >= 51865;
    let tokens = SpecialTokens::from_tokenizer(&tokenizer, multilingual)
        .map_err(|e| unavailable(file("tokenizer.json"), e))?;
    Ok(LoadedWhisper {
        model,
        tokenizer,
        tokens,
        format,
    })
}

/// Builds the network from Hugging Face-named tensors of any float dtype, computing in `dtype`.
pub fn build(
    config: Config,
    tensors: HashMap<String, Tensor>,
    device: &Device,
    dtype: DType,
) -> candle_core::Result<Whisper> {
    let vb = VarBuilder::from_tensors(tensors, dtype, device);
    Whisper::load(vb, config)
}
