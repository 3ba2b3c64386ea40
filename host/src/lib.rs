//! `lmhost`: a host for LLM generation backends, and the explainer of their answers.
//!
//! A [`Host`] opens the backend a [`Config`] names. Backends come two ways:
//! - **in-process**: compiled into the application by this crate's cargo features (`candle`,
//!   `onnx`, `openai`, `mock`), or any [`lmhost_plugin_api::Backend`] registered with
//!   [`Host::register`];
//! - **plugin libraries**: `liblmhost_<name>.so` found in the config's `plugin_dirs`, then
//!   `$LMHOST_PLUGIN_PATH`, the executable's directory and its `../lib/lmhost`.
//!
//! A name found both ways resolves to the in-process backend: what an application was built and
//! tested with is what it runs, whatever libraries lie beside it.
//!
//! # Generating, scoring, tokenizing
//! ```
//! use lmhost::{conversation, Config, Host, Message, Role};
//!
//! # fn main() -> lmhost::Result<()> {
//! let mut host = Host::new(); // with `features = ["mock"]` it is registered already
//! host.register(lmhost::root_module::<lmhost_mock::Mock>());
//! let config = Config::new("mock", "demo"); // or Config::load("configs/mock.toml".as_ref())?
//! let backend = host.open(&config)?;
//!
//! let chat = conversation::from_messages([
//!     Message::text(Role::System, "You are terse."),
//!     Message::text(Role::User, "Which planet is largest?"),
//! ])?;
//! let answer = backend.generate(&chat, &config.generation)?;
//! let score = backend.score(&chat, &answer.text)?;
//! // A model scores its own answer exactly as it generated it.
//! assert_eq!(score.logprobs, answer.logprobs);
//! let tokens = backend.tokenize(&chat, true)?;
//! assert_eq!(tokens.token_ids.len(), tokens.pieces.len());
//! # Ok(()) }
//! ```
//!
//! # Explaining an answer
//! [`explain_run::run`] attributes the answer to the conversation's players (here its
//! messages), reporting progress after every batch and stopping early when a [`Cancel`] is set.
//! ```
//! use std::sync::Arc;
//! use lmhost::explain::Granularity;
//! use lmhost::{conversation, Cancel, Config, Host, Message, Progress, Role, RunOptions};
//!
//! # fn main() -> lmhost::Result<()> {
//! # let mut host = Host::new();
//! # host.register(lmhost::root_module::<lmhost_mock::Mock>());
//! let mut config = Config::new("mock", "demo");
//! config.explanation.players = Granularity::Messages;
//! let backend = host.open(&config)?;
//! let chat = conversation::from_messages([
//!     Message::text(Role::System, "Answer in one word."),
//!     Message::text(Role::User, "The sky is blue."),
//!     Message::text(Role::User, "What colour is the sky?"),
//! ])?;
//! let cancel = Cancel::new(); // cancel.cancel() from any thread stops the run
//! let options = RunOptions {
//!     on_progress: Some(Arc::new(|p: &Progress| eprintln!("{}/{}", p.done, p.planned))),
//!     cancel: Some(cancel.clone()),
//!     ..RunOptions::default()
//! };
//! let outcome = lmhost::explain_run::run(&config, &backend, &chat, &options)?;
//! let explanation = &outcome.explanation;
//! assert_eq!(explanation.attributions.len(), 3);
//! // Exact Shapley values add up to what the whole conversation adds over none of it.
//! let sum: f64 = explanation.attributions.iter().map(|a| a.value).sum();
//! assert!((sum - (explanation.v_all - explanation.v_none)).abs() < 1e-9);
//! // Everything `lmhost explain --json` writes:
//! let report: serde_json::Value = serde_json::from_str(&outcome.to_json()).expect("JSON");
//! assert_eq!(report["players"][2]["text"], "What colour is the sky?");
//! # Ok(()) }
//! ```

pub mod audio;
pub mod backend;
pub mod config;
pub mod conversation;
pub mod error;
pub use lmhost_explain as explain;
pub mod explain_run;
pub mod images;
pub mod logging;
pub mod outcome;
pub mod plugins;
pub mod report;
pub mod runtime_libraries;
pub mod serve;

use std::path::PathBuf;

pub use backend::Backend;
pub use config::Config;
pub use error::{Error, Result};
pub use explain_run::{Cancel, Progress, RunOptions};
pub use lmhost_plugin_api::{
    root_module, ConversationSnapshot, GenerationConfig, GenerationRecord, Message, PluginContext,
    PluginModRef, Role, ScoreRecord,
};
pub use outcome::Outcome;
pub use plugins::{Origin, Plugin, Registry};

/// Finds plugins and opens backends from configs.
pub struct Host {
    registry: Registry,
}

impl Default for Host {
    fn default() -> Self {
        Self::new()
    }
}

impl Host {
    /// A host with the backends bundled by cargo features (`candle`, `onnx`, `openai`, `mock`)
    /// registered in-process.
    pub fn new() -> Self {
        #[allow(unused_mut)]
        let mut registry = Registry::new();
        #[cfg(feature = "candle")]
        registry.register(root_module::<lmhost_candle::Candle>());
        #[cfg(feature = "onnx")]
        registry.register(root_module::<lmhost_onnx::Onnx>());
        #[cfg(feature = "openai")]
        registry.register(root_module::<lmhost_openai::OpenAi>());
        #[cfg(feature = "mock")]
        registry.register(root_module::<lmhost_mock::Mock>());
        Host { registry }
    }

    /// A host with nothing in-process, whatever features are on: every name resolves to a plugin
    /// library (or to what [`Host::register`] adds).
    pub fn empty() -> Self {
        Host {
            registry: Registry::new(),
        }
    }

    /// Registers a backend type in-process, selectable by its name like a library.
    pub fn register(&mut self, module: PluginModRef) -> &mut Self {
        self.registry.register(module);
        self
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Finds the plugin the config names and makes its backend: options are validated against
    /// the plugin's description first, and the `[kv_cache]` settings applied.
    pub fn open(&self, config: &Config) -> Result<Backend> {
        let dirs = plugins::search_dirs(&config.plugin_dirs);
        let (plugin, origin) = self.registry.find(&config.backend.kind, &dirs)?;
        tracing::debug!(plugin = %plugin.name(), ?origin, "plugin found");
        let name = plugin.name();
        let plugin_error = |source| Error::Plugin {
            plugin: name.clone(),
            source,
        };
        let options = config::table_to_json(&config.backend.options);
        lmhost_plugin_api::validate_options(&name, &plugin.options(), &options)
            .map_err(plugin_error)?;
        let context = PluginContext {
            kind: config.backend.kind.as_str().into(),
            model_id: config.backend.model_id.as_str().into(),
            options_json: serde_json::Value::Object(options).to_string().into(),
            plugin_options_json: serde_json::Value::Object(config::table_to_json(
                &config.explanation.plugin_options,
            ))
            .to_string()
            .into(),
            cache_dir: cache_dir().to_string_lossy().as_ref().into(),
            logger: logging::plugin_logger(&name),
        };
        let inner = (plugin.module().new_backend())(context)
            .into_result()
            .map_err(plugin_error)?;
        let backend = Backend::new(name, inner);
        backend.set_kv_cache(config.kv_cache.into())?;
        Ok(backend)
    }
}

/// `$LMHOST_CACHE_DIR`, else `$XDG_CACHE_HOME/lmhost`, else `~/.cache/lmhost`.
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LMHOST_CACHE_DIR") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("lmhost")
}
