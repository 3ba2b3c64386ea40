//! The host's error type: each variant names what was wrong and where.

use std::fmt;
use std::path::PathBuf;

use lmhost_plugin_api::{ErrorKind, PluginError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}:{line}:{column}: {message}", path.display())]
    Config {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },

    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{}: {message}", path.display())]
    Conversation { path: PathBuf, message: String },

    /// Bad audio in a conversation (not WAV, corrupt, empty, too long); `path` is the audio file,
    /// or the conversation file for inline PCM.
    #[error("{}: {message}", path.display())]
    Audio { path: PathBuf, message: String },

    /// A bad image in a conversation or request (not an image, corrupt, empty, too large);
    /// `path` is the image file, or the conversation file for inline data.
    #[error("{}: {message}", path.display())]
    Image { path: PathBuf, message: String },

    #[error("no plugin named `{name}`; {}", SearchReport(searched, found))]
    PluginNotFound {
        name: String,
        searched: Vec<PathBuf>,
        found: Vec<String>,
    },

    #[error("{} is not an lmhost plugin: {detail}", path.display())]
    NotAPlugin { path: PathBuf, detail: String },

    /// A plugin library links a shared library that no folder of the search holds
    /// ([`crate::runtime_libraries`]).
    #[error("{} needs {library}: {detail}", path.display())]
    MissingLibrary {
        path: PathBuf,
        library: String,
        detail: String,
    },

    #[error("{0}")]
    IncompatiblePlugin(Box<Incompatible>),

    #[error("backend `{plugin}`: {source}")]
    Plugin { plugin: String, source: PluginError },

    #[error(transparent)]
    Explain(#[from] crate::explain::ExplainError),

    #[error("run directory {}: {message}", path.display())]
    RunStore { path: PathBuf, message: String },

    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{0}")]
    Invalid(String),

    #[error("cancelled after {evaluated} coalitions were evaluated (a run directory keeps them)")]
    Cancelled { evaluated: usize },
}

impl Error {
    /// The stable kind, where there is one: a plugin error's own, `InvalidInput` for bad audio or images.
    pub fn plugin_kind(&self) -> Option<ErrorKind> {
        match self {
            Error::Plugin { source, .. } => Some(source.kind),
            Error::Audio { .. } | Error::Image { .. } => Some(ErrorKind::InvalidInput),
            _ => None,
        }
    }
}

/// A plugin library this host refuses to use.
#[derive(Debug, thiserror::Error)]
#[error(
    "plugin `{name}` at {} is incompatible with this host: {reason} (plugin built against \
     lmhost-plugin-api {api_version}, host uses {host_api_version}); rebuild it against \
     {host_api_version}{}",
    path.display(),
    if report.is_empty() { "" } else { " (run with --verbose for the layout report)" }
)]
pub struct Incompatible {
    pub path: PathBuf,
    pub name: String,
    pub api_version: String,
    pub host_api_version: String,
    pub reason: String,
    /// abi_stable's layout report, shown only with `--verbose`.
    pub report: String,
}

struct SearchReport<'a>(&'a [PathBuf], &'a [String]);

impl fmt::Display for SearchReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dirs: Vec<String> = self.0.iter().map(|d| d.display().to_string()).collect();
        write!(
            f,
            "searched: {}",
            if dirs.is_empty() {
                "nothing".into()
            } else {
                dirs.join(", ")
            }
        )?;
        let found = if self.1.is_empty() {
            "none".into()
        } else {
            self.1.join(", ")
        };
        write!(f, "; plugins found: {found}")
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
