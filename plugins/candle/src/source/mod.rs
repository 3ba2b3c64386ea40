//! Finding and opening a model: a local GGUF file, a local checkpoint directory, or a hub id.
//!
//! Every failure becomes `BackendUnavailable` naming the path (or id) and what was wrong; a
//! malformed file never panics (candle's readers return errors, and tensor shapes are checked
//! against the config before use).

mod gguf;
mod hub;
pub mod safetensors;

use std::path::Path;

use lmhost_plugin_api::PluginError;
use lmhost_plugin_kit::template::ChatTemplate;
use lmhost_plugin_kit::tokenizer::TextTokenizer;

use crate::models::llama::BuildOptions;
use crate::models::CausalLm;

/// A model ready to run, with what prompting it needs.
pub struct Loaded {
    pub model: Box<dyn CausalLm>,
    pub tokenizer: TextTokenizer,
    /// The model's own template (with its BOS and EOS strings), if it ships one.
    pub chat_template: Option<ChatTemplate>,
    /// Ids that end generation.
    pub eos_ids: Vec<u32>,
    /// A generation's prompt runs through the decode copies ([`crate::weights::stored_prompts`]).
    pub stored_prompts: bool,
}

/// Loads `model_id`: a `.gguf` file, a checkpoint directory, or else a hub id.
pub fn load(
    model_id: &str,
    revision: &str,
    model_class: Option<&str>,
    build: BuildOptions,
) -> Result<Loaded, PluginError> {
    let path = Path::new(model_id);
    let at = |e: String| PluginError::unavailable(format!("model {}: {e}", path.display()));
    if path.is_file() {
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if !is_gguf {
            return Err(at(
                "a model file must be a .gguf (or give a checkpoint directory)".into(),
            ));
        }
        return gguf::load(path, build).map_err(at);
    }
    if path.is_dir() {
        let files = safetensors::Files::in_dir(path).map_err(at)?;
        return safetensors::load(&files, model_class, build).map_err(at);
    }
    if looks_like_path(model_id) {
        return Err(at("no such file or directory".into()));
    }
    let files = hub::fetch(model_id, revision).map_err(PluginError::unavailable)?;
    safetensors::load(&files, model_class, build)
        .map_err(|e| PluginError::unavailable(format!("hub model {model_id:?}: {e}")))
}

/// Hub ids are `name` or `owner/name`; anything else is meant as a local path.
fn looks_like_path(id: &str) -> bool {
    id.starts_with('.')
        || id.starts_with('/')
        || id.starts_with('~')
        || id.ends_with(".gguf")
        || id.matches('/').count() > 1
}
