//! What every handler shares, and what each asks of it: the model check, response ids, the
//! error for a request the queue turned away.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use lmhost_plugin_api::GenerationConfig;

use super::error::ApiError;
use super::metrics::Metrics;
use super::queue::{Queue, QueueError};
use super::{Limits, StopFlag};
use crate::Backend;

pub(super) type Shared = State<Arc<AppState>>;

/// What every handler shares.
pub(crate) struct AppState {
    pub(super) backend: Arc<Backend>,
    pub(super) defaults: GenerationConfig,
    pub(super) model: String,
    pub(super) queue: Queue,
    pub(super) metrics: Metrics,
    pub(super) api_key: Option<String>,
    pub(super) next_id: AtomicU64,
    pub(super) limits: Limits,
    pub(super) stop: StopFlag,
}

impl AppState {
    /// Whether a generation may go on: its request's time is not up and the server is not
    /// cancelling what runs.
    pub(super) fn live(&self, deadline: std::time::Instant) -> bool {
        !self.stop.is_set() && std::time::Instant::now() < deadline
    }

    pub(super) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if model == self.model {
            Ok(())
        } else {
            Err(ApiError::model_not_found(model, &self.model))
        }
    }

    /// A response id: `prefix`, the Unix time and a counter.
    pub(super) fn next_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", now())
    }

    pub(super) fn queue_error(&self, error: QueueError) -> ApiError {
        match error {
            QueueError::Full => {
                self.metrics.record_rejected();
                ApiError::overloaded(1)
            }
            QueueError::Timeout => ApiError::timeout(self.queue.timeout().as_secs_f64()),
            QueueError::Panicked => ApiError::internal("the backend call failed unexpectedly"),
        }
    }
}

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
