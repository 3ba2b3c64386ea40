//! What an application asks of a run beyond the config: the answer, the run directory, progress
//! and cancellation.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

/// What to run, beyond the config.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// The answer to explain; generated from the whole conversation when absent.
    pub reply: Option<String>,
    /// Persist every value here and resume from it.
    pub run_dir: Option<PathBuf>,
    /// Draw a progress bar on stderr (only where stderr is a terminal).
    pub progress: bool,
    /// Called after every evaluated batch, from the thread running the explanation.
    pub on_progress: Option<ProgressFn>,
    /// Checked before every batch; see [`Cancel`].
    pub cancel: Option<Cancel>,
}

/// A progress callback: an application's own bar, log line or cancel button.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How far a run is. `planned` grows when a stopping rule starts another round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Progress {
    /// Coalitions valued so far (from the backend or the run directory).
    pub done: usize,
    /// Coalitions planned so far.
    pub planned: usize,
    pub elapsed_s: f64,
}

/// Stops a running explanation from another thread. The run checks it before each batch and
/// ends with [`Error::Cancelled`]; every value computed until then is in the run directory, so
/// running again with the same directory resumes where it stopped.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
