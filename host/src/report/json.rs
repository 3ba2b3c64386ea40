//! The JSON document of `lmhost explain --json FILE`; its fields are documented in the README.

use serde::Serialize;

use crate::config::ExplanationConfig;
use crate::explain::{Attribution, Efficiency, Stopped, Trust};
use crate::explain_run::{Outcome, ReplySource, RunStats};

#[derive(Debug, Serialize)]
pub struct Document<'a> {
    pub lmhost_version: &'static str,
    pub backend: &'a str,
    pub model_id: &'a str,
    pub reply: &'a str,
    pub reply_source: ReplySource,
    pub settings: &'a ExplanationConfig,
    pub conversation: Vec<MessageDoc>,
    pub players: &'a [Attribution],
    pub v_all: f64,
    pub v_none: f64,
    pub efficiency: Option<Efficiency>,
    /// How well the attribution predicts held-out coalitions; null for exact or `holdout = 0`.
    pub trust: Option<&'a Trust>,
    /// How a run with a stopping rule went; null without one.
    pub stopped: Option<Stopped>,
    pub coalitions: Coalitions,
    pub tokens: Tokens,
    pub kv_cache: KvCache,
    pub wall_time_s: f64,
}

#[derive(Debug, Serialize)]
pub struct MessageDoc {
    pub message: usize,
    pub turn: usize,
    pub role: &'static str,
    pub text: String,
}

#[derive(Debug, Serialize)]
pub struct Coalitions {
    pub planned: usize,
    pub unique_prompts: usize,
    pub evaluated: usize,
    pub reused_from_run_dir: usize,
}

#[derive(Debug, Serialize)]
pub struct Tokens {
    pub prompt_tokens_computed: u64,
    pub prompt_tokens_reused: u64,
}

#[derive(Debug, Serialize)]
pub struct KvCache {
    pub enabled: bool,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

pub fn document(outcome: &Outcome) -> Document<'_> {
    let e = &outcome.explanation;
    let RunStats {
        evaluated,
        reused_from_run_dir,
        prompt_tokens_computed,
        prompt_tokens_reused,
        kv_cache_enabled,
        kv_cache_hits,
        kv_cache_misses,
        kv_cache_evictions,
        wall_time_s,
    } = outcome.stats;
    let conversation = outcome
        .players
        .conversation()
        .turns
        .iter()
        .enumerate()
        .flat_map(|(t, turn)| turn.messages.iter().map(move |m| (t, m)))
        .enumerate()
        .map(|(i, (t, m))| MessageDoc {
            message: i,
            turn: t,
            role: m.role.as_str(),
            text: m.text_content(),
        })
        .collect();
    Document {
        lmhost_version: env!("CARGO_PKG_VERSION"),
        backend: &outcome.plugin,
        model_id: &outcome.model_id,
        reply: &outcome.reply,
        reply_source: outcome.reply_source,
        settings: &outcome.settings,
        conversation,
        players: &e.attributions,
        v_all: e.v_all,
        v_none: e.v_none,
        efficiency: e.efficiency,
        trust: e.trust.as_ref(),
        stopped: outcome.stopped,
        coalitions: Coalitions {
            planned: e.coalitions,
            unique_prompts: e.unique_prompts,
            evaluated,
            reused_from_run_dir,
        },
        tokens: Tokens {
            prompt_tokens_computed,
            prompt_tokens_reused,
        },
        kv_cache: KvCache {
            enabled: kv_cache_enabled,
            hits: kv_cache_hits,
            misses: kv_cache_misses,
            evictions: kv_cache_evictions,
        },
        wall_time_s,
    }
}

/// The document as pretty JSON.
pub fn render(outcome: &Outcome) -> String {
    serde_json::to_string_pretty(&document(outcome))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
