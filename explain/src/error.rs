//! Errors of the explanation computation.

/// What went wrong, with the setting or the player at fault named.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The player filters are wrong or select nothing.
    #[error("players: {0}")]
    Players(String),

    /// The estimator cannot run as configured.
    #[error("estimator: {0}")]
    Estimator(String),

    /// The backend lacks what the value function needs.
    #[error("value `{value}` needs a backend that {needs}; this backend does not")]
    Capability { value: String, needs: String },

    #[error("`{setting}` needs a backend that {needs}; this backend does not")]
    Setting { setting: String, needs: String },

    /// The model failed on one coalition's prompt, or returned something unusable.
    #[error("evaluating {what}: {message}")]
    Model { what: String, message: String },
}
