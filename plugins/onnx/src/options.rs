//! The plugin's options, their parsed form, and the session they configure.

use std::path::Path;

use lmhost_plugin_api::serde_json::{json, Map, Value};
use lmhost_plugin_api::{OptionKind, OptionSpec, PluginError};
use ort::environment::Environment;
use ort::session::builder::SessionBuilder;
use ort::session::Session;

/// Parsed `[backend.options]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The ONNX Runtime library; `None`: ORT_DYLIB_PATH, then the system's search.
    pub ort_library: Option<String>,
    /// 0: ONNX Runtime's default (one per physical core).
    pub intra_threads: usize,
    pub execution_provider: String,
    /// 0: the model's `max_position_embeddings`.
    pub max_context: usize,
    pub chat_template: Option<String>,
}

pub fn specs() -> Vec<OptionSpec> {
    vec![
        OptionSpec::new(
            "ort_library",
            OptionKind::String,
            json!(""),
            "The ONNX Runtime shared library (libonnxruntime.so.1.x, from `pip install \
             onnxruntime`); empty: ORT_DYLIB_PATH, then the system library path.",
        ),
        OptionSpec::new(
            "intra_threads",
            OptionKind::Integer,
            json!(0),
            "Threads ONNX Runtime uses inside an operator (0 = one per physical core).",
        ),
        OptionSpec::choice(
            "execution_provider",
            &["cpu", "cuda"],
            "cpu",
            "Where the graph runs; cuda needs an ONNX Runtime build with CUDA \
             (onnxruntime-gpu).",
        ),
        OptionSpec::new(
            "max_context",
            OptionKind::Integer,
            json!(0),
            "Longest prompt + reply in tokens (0 = config.json's max_position_embeddings).",
        ),
        OptionSpec::new(
            "chat_template",
            OptionKind::String,
            json!(""),
            "A Jinja chat template file or tokenizer_config.json to use instead of the model's \
             own; \"plain\" for `role: content` lines.",
        ),
    ]
}

fn string(options: &Map<String, Value>, key: &str) -> Option<String> {
    options
        .get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from)
}

fn integer(options: &Map<String, Value>, key: &str) -> usize {
    options.get(key).and_then(Value::as_u64).unwrap_or(0) as usize
}

impl Settings {
    /// Parses options the host already validated.
    pub fn parse(options: &Map<String, Value>) -> Settings {
        Settings {
            ort_library: string(options, "ort_library"),
            intra_threads: integer(options, "intra_threads"),
            execution_provider: string(options, "execution_provider").unwrap_or("cpu".into()),
            max_context: integer(options, "max_context"),
            chat_template: string(options, "chat_template"),
        }
    }

    /// A session over `model` with these settings.
    pub fn session(&self, env: &Environment, model: &Path) -> Result<Session, PluginError> {
        let config = |e: ort::Error| PluginError::config(format!("onnx session options: {e}"));
        let mut builder = Session::builder(env).map_err(config)?;
        if self.intra_threads > 0 {
            builder = builder
                .with_intra_threads(self.intra_threads)
                .map_err(|e| config(e.into()))?;
        }
        if self.execution_provider == "cuda" {
            builder = with_cuda(builder)?;
        }
        builder.commit_from_file(model).map_err(|e| {
            PluginError::unavailable(format!(
                "{}: ONNX Runtime cannot load it as a model: {e}",
                model.display()
            ))
        })
    }
}

/// Registers CUDA, refusing a library that lacks it rather than running on the CPU unasked.
#[cfg(feature = "cuda")]
fn with_cuda(builder: SessionBuilder) -> Result<SessionBuilder, PluginError> {
    use ort::ep::{ExecutionProvider, CUDA};
    if !CUDA::is_available().unwrap_or(false) {
        return Err(PluginError::config(
            "option `execution_provider = \"cuda\"`: the loaded ONNX Runtime library has no \
             CUDA execution provider; point `ort_library` at onnxruntime-gpu's library (with \
             CUDA installed), or use `cpu`",
        ));
    }
    builder
        .with_execution_providers([CUDA::default().build().error_on_failure()])
        .map_err(|e| PluginError::config(format!("onnx CUDA execution provider: {e}")))
}

#[cfg(not(feature = "cuda"))]
fn with_cuda(_: SessionBuilder) -> Result<SessionBuilder, PluginError> {
    Err(PluginError::config(
        "option `execution_provider = \"cuda\"`: this build of lmhost-onnx has no CUDA support; \
         rebuild it with `--features cuda` (and use onnxruntime-gpu's library), or use `cpu`",
    ))
}
