//! Logging: the `tracing` subscriber for the binary, and the callback through which plugin log
//! lines reach it.

use lmhost_plugin_api::abi_stable::std_types::RStr;
use lmhost_plugin_api::{LogLevel, Logger};
use tracing_subscriber::EnvFilter;

/// Installs a stderr subscriber: `warn` by default, more with each `-v`, only errors with `-q`.
/// `RUST_LOG` overrides both.
pub fn init(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// A logger that forwards a plugin's lines to `tracing`, under the target `plugin`.
pub fn plugin_logger(plugin: &str) -> Logger {
    Logger::new(plugin, forward)
}

extern "C" fn forward(level: LogLevel, source: RStr<'_>, message: RStr<'_>) {
    let (source, message) = (source.as_str(), message.as_str());
    match level {
        LogLevel::Error => tracing::error!(target: "plugin", plugin = source, "{message}"),
        LogLevel::Warn => tracing::warn!(target: "plugin", plugin = source, "{message}"),
        LogLevel::Info => tracing::info!(target: "plugin", plugin = source, "{message}"),
        LogLevel::Debug => tracing::debug!(target: "plugin", plugin = source, "{message}"),
        LogLevel::Trace => tracing::trace!(target: "plugin", plugin = source, "{message}"),
    }
}
