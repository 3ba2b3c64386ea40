//! What the run directory keys answers and values by, so a value is reused only where
//! everything it depends on is the same; `reanalyze` rebuilds the keys without a backend.

use lmhost_plugin_api::ConversationSnapshot;

use super::store::{digest, prompt_key};
use crate::config::{Config, ExplanationConfig};
use crate::explain::{AbsenceKind, BaseAnswer};

/// What the base answer depends on: the plugin, the model, its options and generation settings.
/// The run directory keys answers by it; `reanalyze` rebuilds it without a backend.
pub(crate) fn setup_key(
    config: &Config,
    settings: &ExplanationConfig,
    plugin: &str,
) -> serde_json::Value {
    serde_json::json!({
        "plugin": plugin,
        "model_id": config.backend.model_id,
        "backend_options": crate::config::table_to_json(&config.backend.options),
        "plugin_options": crate::config::table_to_json(&settings.plugin_options),
        "generation": config.generation,
    })
}

/// What a coalition's value depends on besides its prompt: the setup, the value function and
/// the answer it measures. The run directory keys values by it.
pub(crate) fn run_key(
    setup_key: &serde_json::Value,
    settings: &ExplanationConfig,
    base: &BaseAnswer,
) -> String {
    let mut key = serde_json::json!({
        "setup": setup_key,
        "value": settings.value,
        "value_mean": settings.value_mean,
        "answer": base.text,
        "answer_embedding": base.contextual_embedding,
    });
    // Hidden coalitions are keyed by their deleted rendering: the same prompts as `delete`,
    // other values. (Only then: the keys of other absences' stores stay as they were.)
    if settings.absence == AbsenceKind::Hide {
        key["absence"] = serde_json::json!("hide");
    }
    digest(key.to_string().as_bytes())
}

/// What a generated answer depends on: the setup, whether embeddings came with it, and the
/// conversation. The run directory keys answers by it; `reanalyze` looks them up by it.
pub(crate) fn answer_key(
    setup_key: &serde_json::Value,
    settings: &ExplanationConfig,
    conversation: &ConversationSnapshot,
) -> String {
    digest(
        serde_json::json!({
            "setup": setup_key,
            "embeddings": settings.value == crate::explain::ValueKind::EmbeddingCosine,
            "conversation": prompt_key(conversation),
        })
        .to_string()
        .as_bytes(),
    )
}
