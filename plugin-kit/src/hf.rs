//! The text side of a Hugging Face model directory: `tokenizer.json`, `tokenizer_config.json`
//! (chat template, special tokens), `chat_template.jinja` (where Transformers writes the
//! template since 4.50, ahead of tokenizer_config.json's) and `config.json`'s
//! end-of-sequence ids. candle's
//! safetensors checkpoints and onnx's Optimum exports are read through this, the same way.

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::template::ChatTemplate;
use crate::text::ModelText;
use crate::tokenizer::TextTokenizer;

impl ModelText {
    /// Reads `tokenizer` and, when there is one, `tokenizer_config`; `config` is the model's
    /// parsed config.json. Errors name the file.
    pub fn from_hf(
        tokenizer: &Path,
        tokenizer_config: Option<&Path>,
        config: &Value,
    ) -> Result<ModelText, String> {
        let hf =
            Tokenizer::from_file(tokenizer).map_err(|e| format!("{}: {e}", tokenizer.display()))?;
        let tok_config: Value = match tokenizer_config {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => Value::Null,
        };
        let id_of = |key: &str| token_text(tok_config.get(key)).and_then(|t| hf.token_to_id(&t));
        let (bos, eos_token) = (id_of("bos_token"), token_text(tok_config.get("eos_token")));
        let eos_ids = eos_ids(config, eos_token.as_deref(), &hf);
        let jinja = tokenizer.with_file_name("chat_template.jinja");
        let chat_template = match (tokenizer_config, tok_config.get("chat_template")) {
            _ if jinja.is_file() => Some(
                ChatTemplate::from_file(&jinja)
                    .map_err(|e| e.to_string())?
                    .with_special_tokens(
                        token_text(tok_config.get("bos_token")),
                        token_text(tok_config.get("eos_token")),
                    ),
            ),
            (Some(path), Some(_)) => Some(
                ChatTemplate::from_json(&tok_config, path.display().to_string())
                    .map_err(|e| e.to_string())?,
            ),
            _ => None,
        };
        Ok(ModelText {
            tokenizer: TextTokenizer::from_hf(hf, bos, eos_ids.first().copied()),
            chat_template,
            eos_ids,
        })
    }
}

/// A special token in tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// EOS ids: config.json's `eos_token_id` (a number or a list), else the tokenizer's eos token.
fn eos_ids(config: &Value, eos_token: Option<&str>, tokenizer: &Tokenizer) -> Vec<u32> {
    match config.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64().map(|n| n as u32))
            .collect(),
        _ => eos_token
            .and_then(|t| tokenizer.token_to_id(t))
            .into_iter()
            .collect(),
    }
}
