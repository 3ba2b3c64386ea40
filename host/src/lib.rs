//! `lmhost`: a host for LLM generation backends loaded as plugins.
//!
//! ```no_run
//! # fn main() -> lmhost::Result<()> {
//! let config = lmhost::Config::load("configs/mock.toml".as_ref())?;
//! let host = lmhost::Host::new();
//! let backend = host.open(&config)?;
//! let snapshot = lmhost::ConversationSnapshot::from_prompt("Hello?");
//! let record = backend.generate(&snapshot, &config.generation)?;
//! println!("{}", record.text);
//! # Ok(()) }
//! ```

pub mod audio;
pub mod backend;
pub mod config;
pub mod conversation;
pub mod error;
pub mod explain;
pub mod explain_run;
pub mod logging;
pub mod plugins;
pub mod reanalyze;
pub mod report;
pub mod run_store;
pub mod serve;

use std::path::PathBuf;

pub use backend::Backend;
pub use config::Config;
pub use error::{Error, Result};
pub use lmhost_plugin_api::{
    ConversationSnapshot, GenerationConfig, GenerationRecord, PluginContext, PluginModRef,
    ScoreRecord,
};
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
    /// A host with the backends bundled by cargo features registered in-process.
    pub fn new() -> Self {
        #[allow(unused_mut)]
        let mut registry = Registry::new();
        #[cfg(feature = "mock")]
        registry.register(lmhost_mock::plugin_module());
        Host { registry }
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
