//! `lmhost._lmhost`: the Python face of the `lmhost` library. Values cross as JSON (Python's own
//! `json` module on this side), so a Python caller gets plain dicts, lists and floats, and every
//! setting is checked by the same serde types the TOML config uses. The GIL is released while a
//! backend runs; errors become the `lmhost.errors` class named for their kind.

use std::path::Path;
use std::sync::{Arc, Mutex};

use lmhost::config::ExplanationConfig;
use lmhost::explain::ImageRegions;
use lmhost::explain_run::{self, ProgressFn};
use lmhost::{
    Backend, Cancel, Config, ConversationSnapshot, Error, GenerationConfig, Outcome, Progress,
    RunOptions,
};
use lmhost_plugin_api::{ErrorKind, KvCacheSettings};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// Every bundled backend, in-process (this crate turns on none of `lmhost`'s features).
fn host() -> lmhost::Host {
    let mut host = lmhost::Host::empty();
    host.register(lmhost::root_module::<lmhost_candle::Candle>())
        .register(lmhost::root_module::<lmhost_onnx::Onnx>())
        .register(lmhost::root_module::<lmhost_openai::OpenAi>())
        .register(lmhost::root_module::<lmhost_mock::Mock>());
    host
}

/// A backend opened from a config, and the config's settings that calls start from.
#[pyclass(module = "lmhost", frozen)]
struct Host {
    backend: Backend,
    config: Config,
}

#[pymethods]
impl Host {
    /// `config`: a TOML file's path, or the same tables as a dict.
    #[new]
    fn new(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let config = if let Ok(path) = config.extract::<std::path::PathBuf>() {
            Config::load(&path).map_err(|e| raise(py, e))?
        } else if config.is_instance_of::<PyDict>() {
            Config::from_json(to_json(py, config)?, Path::new("<dict>"))
                .map_err(|e| raise(py, e))?
        } else {
            return Err(invalid(
                py,
                "config must be a path to a TOML file or a dict",
            ));
        };
        let backend = py
            .detach(|| host().open(&config))
            .map_err(|e| raise(py, e))?;
        Ok(Host { backend, config })
    }

    #[getter]
    fn plugin(&self) -> &str {
        self.backend.plugin()
    }

    #[getter]
    fn model_id(&self) -> String {
        self.backend.model_id()
    }

    /// The answer to `messages`; keyword arguments override `[generation]` settings.
    #[pyo3(signature = (messages, **settings))]
    fn generate(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let chat = conversation(py, messages)?;
        let generation: GenerationConfig = merged(py, &self.config.generation, settings)?;
        let record = py
            .detach(|| self.backend.generate(&chat, &generation))
            .map_err(|e| raise(py, e))?;
        let logprobs: Vec<f32> = record.logprobs.to_vec();
        to_python(
            py,
            &json!({
                "text": record.text.as_str(),
                "token_ids": record.token_ids.as_slice(),
                "logprobs": logprobs,
                "total_logprob": logprobs.iter().map(|&l| f64::from(l)).sum::<f64>(),
                "finish_reason": record.finish_reason,
                "prompt_tokens": record.prompt_tokens,
                "cached_prompt_tokens": record.cached_prompt_tokens,
                "embedding": record.embedding.as_ref().map(|e| e.as_slice()).into_option(),
                "contextual_embedding": record
                    .contextual_embedding
                    .as_ref()
                    .map(|e| e.as_slice())
                    .into_option(),
            }),
        )
    }

    /// Turns the backend's prompt-prefix cache on or off; `max_entries` and `max_bytes` default
    /// to the config's `[kv_cache]`. Resets the counters of `stats`.
    #[pyo3(signature = (enabled, max_entries = None, max_bytes = None))]
    fn set_kv_cache(
        &self,
        py: Python<'_>,
        enabled: bool,
        max_entries: Option<u64>,
        max_bytes: Option<u64>,
    ) -> PyResult<()> {
        let base = self.config.kv_cache;
        let settings = KvCacheSettings {
            enabled,
            max_entries: max_entries.unwrap_or(base.max_entries),
            max_bytes: max_bytes.unwrap_or(base.max_bytes),
        };
        py.detach(|| self.backend.set_kv_cache(settings))
            .map_err(|e| raise(py, e))
    }

    /// The backend's counters since it opened or its cache was last set: prefix-cache hits,
    /// misses, reused tokens, evictions and bytes; prompt and generated tokens.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.backend.stats())
    }

    /// The log-probability of each token of `reply` after `messages`.
    fn score(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        reply: &str,
    ) -> PyResult<Py<PyAny>> {
        let chat = conversation(py, messages)?;
        let record = py
            .detach(|| self.backend.score(&chat, reply))
            .map_err(|e| raise(py, e))?;
        to_python(
            py,
            &json!({
                "token_ids": record.token_ids.as_slice(),
                "logprobs": record.logprobs.as_slice(),
                "total_logprob": record.total_logprob(),
                "prompt_tokens": record.prompt_tokens,
                "cached_prompt_tokens": record.cached_prompt_tokens,
            }),
        )
    }

    /// The token ids the model reads for `messages`, and each token's text.
    #[pyo3(signature = (messages, add_special = true))]
    fn tokenize(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        add_special: bool,
    ) -> PyResult<Py<PyAny>> {
        let chat = conversation(py, messages)?;
        let record = py
            .detach(|| self.backend.tokenize(&chat, add_special))
            .map_err(|e| raise(py, e))?;
        to_python(py, &record)
    }

    /// Explains the answer to `messages` (generated unless `reply` is given); keyword arguments
    /// override `[explanation]` settings (`players`, `estimator`, `budget`, `value`, ...).
    /// `progress(done, planned)` is called after every batch; an exception it raises, or
    /// Ctrl-C, stops the run (a `run_dir` keeps what was computed).
    #[pyo3(signature = (messages, reply = None, run_dir = None, progress = None, **settings))]
    fn explain(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        reply: Option<String>,
        run_dir: Option<std::path::PathBuf>,
        progress: Option<Py<PyAny>>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Explanation> {
        let (chat, regions) = conversation_with_regions(py, messages)?;
        let mut explanation: ExplanationConfig = merged(py, &self.config.explanation, settings)?;
        explanation.regions = regions;
        explanation
            .validate()
            .map_err(|message| invalid(py, &message))?;
        let config = Config {
            explanation,
            ..self.config.clone()
        };
        let cancel = Cancel::new();
        let interrupted: Arc<Mutex<Option<PyErr>>> = Arc::default();
        let options = RunOptions {
            reply,
            run_dir,
            on_progress: Some(progress_fn(progress, cancel.clone(), interrupted.clone())),
            cancel: Some(cancel),
            ..RunOptions::default()
        };
        let outcome = py.detach(|| explain_run::run(&config, &self.backend, &chat, &options));
        match outcome {
            Ok(outcome) => Ok(Explanation { outcome }),
            Err(e) => Err(interrupted
                .lock()
                .ok()
                .and_then(|mut slot| slot.take())
                .unwrap_or_else(|| raise(py, e))),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "lmhost.Host(plugin={:?}, model_id={:?})",
            self.backend.plugin(),
            self.backend.model_id()
        )
    }
}

/// Calls the user's `progress` and checks for Ctrl-C after every batch; either one failing
/// cancels the run and keeps the exception to raise in its place.
fn progress_fn(
    callback: Option<Py<PyAny>>,
    cancel: Cancel,
    interrupted: Arc<Mutex<Option<PyErr>>>,
) -> ProgressFn {
    Arc::new(move |p: &Progress| {
        Python::attach(|py| {
            let result = py.check_signals().and_then(|()| match &callback {
                Some(f) => f.call1(py, (p.done, p.planned)).map(drop),
                None => Ok(()),
            });
            if let Err(e) = result {
                if let Ok(mut slot) = interrupted.lock() {
                    slot.get_or_insert(e);
                }
                cancel.cancel();
            }
        })
    })
}

/// An explained answer: per-player values, the players, and the reports `lmhost explain`
/// writes.
#[pyclass(module = "lmhost", frozen)]
struct Explanation {
    outcome: Outcome,
}

#[pymethods]
impl Explanation {
    /// One value per player, in player order.
    #[getter]
    fn values(&self) -> Vec<f64> {
        let attributions = &self.outcome.explanation.attributions;
        attributions.iter().map(|a| a.value).collect()
    }

    /// Standard errors of a sampling estimate (`None` where the value is exact).
    #[getter]
    fn std_errors(&self) -> Vec<Option<f64>> {
        let attributions = &self.outcome.explanation.attributions;
        attributions.iter().map(|a| a.std_error).collect()
    }

    /// Each player as a dict: `id`, `text`, `role`, `turn`, `message`.
    #[getter]
    fn players(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.outcome.players.players())
    }

    /// With `interactions`: each subset's dict, `players` (ids), `value`, `std_error`, in the
    /// JSON report's order; `None` without.
    #[getter]
    fn interactions(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        lmhost::report::json::interactions(&self.outcome.explanation)
            .map(|list| to_python(py, &list))
            .transpose()
    }

    #[getter]
    fn v_all(&self) -> f64 {
        self.outcome.explanation.v_all
    }

    #[getter]
    fn v_none(&self) -> f64 {
        self.outcome.explanation.v_none
    }

    /// The explained answer.
    #[getter]
    fn reply(&self) -> &str {
        &self.outcome.reply
    }

    /// The JSON report, as `lmhost explain --json` writes it.
    fn to_json(&self) -> String {
        self.outcome.to_json()
    }

    /// The self-contained HTML page, as `lmhost explain --html` writes it.
    fn to_html(&self) -> String {
        self.outcome.to_html()
    }

    fn __len__(&self) -> usize {
        self.outcome.explanation.attributions.len()
    }

    fn __repr__(&self) -> String {
        let e = &self.outcome.explanation;
        format!(
            "lmhost.Explanation({} players, v_all={:.4}, v_none={:.4})",
            e.attributions.len(),
            e.v_all,
            e.v_none
        )
    }
}

/// Messages in the OpenAI chat shape (or one string, a user message, or a conversation file's
/// `{"messages": [...], "tools": [...], "documents": [...]}`) as a conversation, refused with
/// the conversation file's own messages.
fn conversation(py: Python<'_>, messages: &Bound<'_, PyAny>) -> PyResult<ConversationSnapshot> {
    conversation_with_regions(py, messages).map(|(conversation, _)| conversation)
}

/// [`conversation`], and the regions its image parts give (`"regions"`, for explain).
fn conversation_with_regions(
    py: Python<'_>,
    messages: &Bound<'_, PyAny>,
) -> PyResult<(ConversationSnapshot, Vec<ImageRegions>)> {
    if messages.is_instance_of::<PyString>() {
        let prompt = ConversationSnapshot::from_prompt(messages.extract::<String>()?);
        return Ok((prompt, Vec::new()));
    }
    // JSON text straight from Python's dicts, whose keys keep their order (a tool's schema
    // renders in it).
    let file = match messages.cast::<PyDict>() {
        Ok(file) => file.clone(),
        Err(_) => {
            let file = PyDict::new(py);
            file.set_item("messages", messages)?;
            file
        }
    };
    let text: String = (py.import("json")?)
        .call_method1("dumps", (file,))?
        .extract()?;
    lmhost::conversation::parse_with_regions(&text, Path::new("<messages>"))
        .map_err(|e| raise(py, e))
}

/// `base` with the keyword arguments `overrides` laid over it, checked by `T`'s serde rules.
fn merged<T: Serialize + DeserializeOwned>(
    py: Python<'_>,
    base: &T,
    overrides: Option<&Bound<'_, PyDict>>,
) -> PyResult<T> {
    let mut value = serde_json::to_value(base).map_err(|e| invalid(py, &e.to_string()))?;
    if let (Some(overrides), Value::Object(fields)) = (overrides, &mut value) {
        if let Value::Object(given) = to_json(py, overrides.as_any())? {
            fields.extend(given);
        }
    }
    // The path names the setting ("`top_k`: invalid value: integer `-1`, expected u32"); an
    // unknown one is named by the error itself.
    serde_path_to_error::deserialize(value).map_err(|e| match e.path().iter().next() {
        Some(_) => invalid(py, &format!("`{}`: {}", e.path(), e.inner())),
        None => invalid(py, &e.inner().to_string()),
    })
}

fn to_json(py: Python<'_>, object: &Bound<'_, PyAny>) -> PyResult<Value> {
    let text: String = py
        .import("json")?
        .call_method1("dumps", (object,))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| invalid(py, &e.to_string()))
}

fn to_python(py: Python<'_>, value: &impl Serialize) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| invalid(py, &e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// The `lmhost.errors` class for `error`'s kind, carrying its message.
fn raise(py: Python<'_>, error: Error) -> PyErr {
    let class = match &error {
        Error::Config { .. } => "ConfigError",
        Error::Io { .. } | Error::Write { .. } | Error::RunStore { .. } => "FileError",
        Error::Conversation { .. }
        | Error::Audio { .. }
        | Error::Image { .. }
        | Error::Invalid(_) => "InvalidInputError",
        Error::PluginNotFound { .. }
        | Error::NotAPlugin { .. }
        | Error::MissingLibrary { .. }
        | Error::IncompatiblePlugin(_) => "PluginNotFoundError",
        Error::Explain(_) => "ExplainError",
        Error::Cancelled { .. } => "CancelledError",
        Error::Plugin { source, .. } => match source.kind {
            ErrorKind::Config => "ConfigError",
            ErrorKind::BackendUnavailable => "BackendUnavailableError",
            ErrorKind::InvalidInput => "InvalidInputError",
            ErrorKind::Unsupported => "UnsupportedError",
            ErrorKind::Internal => "BackendError",
        },
    };
    new_error(py, class, &error.to_string())
}

fn invalid(py: Python<'_>, message: &str) -> PyErr {
    new_error(py, "InvalidInputError", message)
}

fn new_error(py: Python<'_>, class: &str, message: &str) -> PyErr {
    match py
        .import("lmhost.errors")
        .and_then(|errors| errors.getattr(class))
        .and_then(|class| class.call1((message,)))
    {
        Ok(instance) => PyErr::from_value(instance),
        Err(e) => e,
    }
}

#[pymodule]
fn _lmhost(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Host>()?;
    module.add_class::<Explanation>()?;
    Ok(())
}
