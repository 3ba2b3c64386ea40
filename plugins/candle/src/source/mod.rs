//! Finding and opening a model: a local GGUF file, a local checkpoint directory, or a hub id.
//!
//! Every failure becomes `BackendUnavailable` naming the path (or id) and what was wrong; a
//! malformed file never panics (candle's readers return errors, and tensor shapes are checked
//! against the config before use).

mod gguf;
mod hub;
pub mod safetensors;
mod vision;

use std::path::Path;

use lmhost_plugin_api::PluginError;
use lmhost_plugin_kit::text::ModelText;

use lmhost_plugin_kit::multimodal::Vision;

use crate::models::BuildOptions;
use crate::models::CausalLm;

/// A model ready to run, with what prompting it needs.
pub struct LoadedLm {
    pub model: Box<dyn CausalLm>,
    pub text: ModelText,
    /// A generation's prompt runs through the decode copies ([`crate::weights::stored_prompts`]).
    pub stored_prompts: bool,
    /// A vision-language model's processor and image ids.
    pub vision: Option<Vision>,
}

/// Where a model id points.
enum Found<'a> {
    Gguf(&'a Path),
    Dir(&'a Path),
    Hub,
}

/// Where `model_id` points: a `.gguf` file, a checkpoint directory, or else a hub id.
fn find(model_id: &str) -> Result<Found<'_>, PluginError> {
    let path = Path::new(model_id);
    if path.is_file() {
        let is_gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        return match is_gguf {
            true => Ok(Found::Gguf(path)),
            false => Err(unavailable(
                path,
                "a model file must be a .gguf (or give a checkpoint directory)".into(),
            )),
        };
    }
    if path.is_dir() {
        return Ok(Found::Dir(path));
    }
    if looks_like_path(model_id) {
        return Err(unavailable(path, "no such file or directory".into()));
    }
    Ok(Found::Hub)
}

fn unavailable(path: &Path, e: String) -> PluginError {
    PluginError::unavailable(format!("model {}: {e}", path.display()))
}

/// Loads `model_id`: a `.gguf` file, a checkpoint directory, or else a hub id.
pub fn load(
    model_id: &str,
    revision: &str,
    model_class: Option<&str>,
    build: BuildOptions,
) -> Result<LoadedLm, PluginError> {
    match find(model_id)? {
        Found::Gguf(path) => gguf::load(path, build).map_err(|e| unavailable(path, e)),
        Found::Dir(path) => safetensors::Files::in_dir(path)
            .and_then(|files| safetensors::load(&files, model_class, build))
            .map_err(|e| unavailable(path, e)),
        Found::Hub => {
            let files = hub::fetch(model_id, revision).map_err(PluginError::unavailable)?;
            safetensors::load(&files, model_class, build)
                .map_err(|e| PluginError::unavailable(format!("hub model {model_id:?}: {e}")))
        }
    }
}

/// Loads only what prompting `model_id` needs, not its weights: tokenizing and detokenizing
/// work for any GGUF whose tokenizer type is supported (vocabulary-only files included) and
/// any directory with a `tokenizer.json`, whatever the architecture.
pub fn load_text(model_id: &str, revision: &str) -> Result<ModelText, PluginError> {
    match find(model_id)? {
        Found::Gguf(path) => gguf::text(path).map_err(|e| unavailable(path, e)),
        Found::Dir(path) => safetensors::text_in_dir(path).map_err(|e| unavailable(path, e)),
        Found::Hub => hub::fetch_text(model_id, revision).map_err(PluginError::unavailable),
    }
}

/// Hub ids are `name` or `owner/name`; anything else is meant as a local path.
fn looks_like_path(id: &str) -> bool {
    id.starts_with('.')
        || id.starts_with('/')
        || id.starts_with('~')
        || id.ends_with(".gguf")
        || id.matches('/').count() > 1
}
