//! `lmhost-plugin-api`: the stable ABI between the lmhost host and its generation backends.
//!
//! A plugin author implements [`Backend`] and calls [`export_plugin!`]; see the `lmhost-mock`
//! crate for a complete plugin. This crate holds only stable types, the backend trait object,
//! the root module, errors and the safe authoring layer: it knows nothing of any model library,
//! async runtime or of the host.

pub mod abi;
pub mod author;
pub mod error;
pub mod identity;
pub mod options;
pub mod types;

pub use abi::{
    BackendBox, GenerationBackend, GenerationBackend_TO, LogLevel, Logger, PluginContext,
    PluginMod, PluginModRef, TokenSink, TokenSinkRef, TokenSink_TO, API_VERSION,
};
pub use author::{lock_or_reset, root_module, Backend};
pub use error::{ErrorKind, PluginError};
pub use options::{validate_options, OptionKind, OptionSpec};
pub use types::*;

/// Re-exported so that `export_plugin!` and plugin authors use the exact version the ABI is
/// built on (each abi_stable 0.y is a different ABI).
pub use abi_stable;
pub use serde_json;
