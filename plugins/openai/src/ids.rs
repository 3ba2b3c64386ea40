//! Token ids instead of text. With the `tokenizer` option the model's tokenizer runs here, so a
//! server that takes ids (vLLM's `/v1/completions`, SGLang's and `lmhost serve`'s `/generate`)
//! scores a reply in one request, where text costs one to tokenize the prompt, one for prompt +
//! reply and one to score. The tokenizer is checked against each server's own on first contact.

use std::path::Path;

use lmhost_plugin_api::serde_json::{self, Value};
use lmhost_plugin_api::PluginError;
use lmhost_plugin_kit::gguf::Metadata;
use lmhost_plugin_kit::text::ModelText;

use crate::cluster::Endpoint;

/// The `tokenizer` option's model text: a GGUF file, a `tokenizer.json`, or a directory holding
/// one (with its `tokenizer_config.json` and `config.json`, where they are, for the chat
/// template and special tokens).
pub fn load(option: &str) -> Result<ModelText, PluginError> {
    let path = Path::new(option);
    let error = |e: String| PluginError::config(format!("option `tokenizer`: {e}"));
    if path.extension().is_some_and(|e| e == "gguf") {
        let meta = Metadata::read(path).map_err(|e| error(e.to_string()))?;
        return ModelText::from_gguf(&meta).map_err(error);
    }
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    if !file.is_file() {
        return Err(error(format!(
            "{} is not a file; expected a GGUF file, a tokenizer.json, or a model directory \
             holding one",
            file.display()
        )));
    }
    let beside = |name: &str| Some(file.with_file_name(name)).filter(|p| p.is_file());
    let config = match beside("config.json") {
        Some(p) => {
            let text = std::fs::read_to_string(&p).map_err(|e| error(e.to_string()))?;
            serde_json::from_str(&text).map_err(|e| error(format!("{}: {e}", p.display())))?
        }
        None => Value::Null,
    };
    ModelText::from_hf(&file, beside("tokenizer_config.json").as_deref(), &config).map_err(error)
}

/// Text whose tokens tell tokenizers apart: words, digits, an accent, spaces and a symbol.
pub const PROBE: &str = "lmhost checks its endpoints: 12345 crème brûlée  ->  ok";

/// The probe as the server at `endpoint` tokenizes it must be the probe as `text` does (with
/// the model's special tokens on both sides), else ids would mean other tokens there.
pub fn check(
    text: &ModelText,
    option: &str,
    endpoint: &Endpoint,
    model: &str,
) -> Result<(), PluginError> {
    let Some(tokenizer) = endpoint.abilities.tokenizer else {
        return Err(PluginError::config(format!(
            "the {} server at {} has no tokenizer endpoint to check the `tokenizer` option \
             against; leave the option out for this server",
            endpoint.flavor,
            endpoint.url()
        )));
    };
    let ours = (text.tokenizer.encode(PROBE, true, true))
        .map_err(|e| PluginError::config(format!("option `tokenizer`: {e}")))?;
    let theirs = crate::tokens::tokenize(&endpoint.client, tokenizer, model, PROBE, true)?;
    let theirs = theirs.token_ids.as_slice();
    if theirs != ours.as_slice() {
        return Err(PluginError::config(format!(
            "option `tokenizer` ({option}) tokenizes {PROBE:?} into {ours:?}, the server at {} \
             into {theirs:?}: point `tokenizer` at the served model's tokenizer.json or GGUF",
            endpoint.url()
        )));
    }
    Ok(())
}
