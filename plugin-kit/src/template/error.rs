//! What can go wrong with a chat template; every error names where the template came from.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::python::Raised;

/// A chat template that cannot be read, compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot read chat template {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin} is not valid JSON: {source}")]
    Json {
        origin: String,
        source: serde_json::Error,
    },
    #[error("{origin} holds no `chat_template` (a string, or a list of named templates)")]
    Missing { origin: String },
    #[error("{origin} holds chat templates named {names:?} but none named \"default\"")]
    NoDefault { origin: String, names: Vec<String> },
    /// The template is not valid Jinja, or uses a construct lmhost does not support.
    #[error("chat template from {origin} does not compile{line}: {detail}")]
    Compile {
        origin: String,
        line: Line,
        detail: String,
    },
    /// The template called `raise_exception(message)`, refusing the conversation.
    #[error("chat template from {origin} raised{line}: {message}")]
    Raised {
        origin: String,
        line: Line,
        message: String,
    },
    /// The render went past one of [`super::limits`].
    #[error("chat template from {origin} exceeds {limit}; refused, as a template that never ends or fills memory would be")]
    Limit { origin: String, limit: String },
    /// Rendering failed otherwise (an undefined attribute, a method Python lacks...).
    #[error("chat template from {origin} fails{line}: {detail}")]
    Render {
        origin: String,
        line: Line,
        detail: String,
    },
}

/// The template line an error is on, where minijinja reports one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line(pub Option<usize>);

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(line) => write!(f, " at line {line}"),
            None => Ok(()),
        }
    }
}

impl TemplateError {
    pub(super) fn compile(origin: &str, err: &minijinja::Error) -> Self {
        TemplateError::Compile {
            origin: origin.to_string(),
            line: Line(err.line()),
            detail: describe(err),
        }
    }

    /// `failure` of the template from `origin`.
    pub(super) fn failed(origin: &str, failure: Failure) -> Self {
        let origin = origin.to_string();
        match failure {
            Failure::Limit(limit) => TemplateError::Limit { origin, limit },
            Failure::Raised { line, message } => TemplateError::Raised {
                origin,
                line: Line(line),
                message,
            },
            Failure::Render { line, detail } => TemplateError::Render {
                origin,
                line: Line(line),
                detail,
            },
        }
    }
}

/// How a render failed, before it is tied to its template's origin: what the sandbox's child
/// sends back to its parent.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Failure {
    /// Past one of [`super::limits`], named.
    Limit(String),
    Raised {
        line: Option<usize>,
        message: String,
    },
    Render {
        line: Option<usize>,
        detail: String,
    },
}

impl Failure {
    /// A failure of the sandbox's process rather than of a template line.
    #[cfg(target_os = "linux")]
    pub(super) fn process(detail: String) -> Self {
        Failure::Render { line: None, detail }
    }

    pub(super) fn of(err: &minijinja::Error) -> Self {
        use super::limits;
        match err.kind() {
            minijinja::ErrorKind::OutOfFuel => {
                return Failure::Limit(format!("its fuel of {} instructions", limits::FUEL));
            }
            minijinja::ErrorKind::InvalidOperation
                if err.detail().is_some_and(|d| d.contains("recursion limit")) =>
            {
                return Failure::Limit(format!("its recursion depth of {}", limits::DEPTH));
            }
            _ => {}
        }
        let line = err.line();
        match raised(err) {
            Some(message) => Failure::Raised { line, message },
            None => Failure::Render {
                line,
                detail: describe(err),
            },
        }
    }
}

/// "syntax error: unknown statement generation": the kind of error and what minijinja expected.
fn describe(err: &minijinja::Error) -> String {
    match err.detail() {
        Some(detail) => format!("{}: {detail}", err.kind()),
        None => err.kind().to_string(),
    }
}

/// The message of a `raise_exception` call, wherever it sits in the error's chain.
fn raised(err: &minijinja::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(Raised(message)) = e.downcast_ref::<Raised>() {
            return Some(message.clone());
        }
        cause = e.source();
    }
    None
}
