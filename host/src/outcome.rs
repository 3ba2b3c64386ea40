//! What an explanation run hands back: the explanation with the figures of the run that made it.
//! The reports (`report/`) render it; the run (`explain_run`) makes it.

use serde::Serialize;

use crate::config::ExplanationConfig;
use crate::explain::{Explanation, Players, Stopped};

/// Where the explained answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplySource {
    Generated,
    Given,
    RunDir,
}

/// An explanation with the figures of the run that made it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub explanation: Explanation,
    pub players: Players,
    pub reply: String,
    /// The answer's tokens as text, one per column of `explanation.per_token` (empty without
    /// it); `#1`, `#2`… where the backend cannot say.
    pub answer_tokens: Vec<String>,
    pub reply_source: ReplySource,
    pub settings: ExplanationConfig,
    pub plugin: String,
    pub model_id: String,
    pub stats: RunStats,
    /// How the rounds went, for a run with a stopping rule.
    pub stopped: Option<Stopped>,
    /// With `players = "auto"`, the levels after the first, in the order they ran.
    pub refinements: Vec<Refinement>,
}

/// A level of a hierarchical run: the parts of the players the level before refined, with
/// the rest of the conversation present (see [`crate::explain::hierarchy`]).
#[derive(Debug, Clone)]
pub struct Refinement {
    /// In player order, the id of the player each one is a part of.
    pub parents: Vec<String>,
    pub players: Players,
    pub explanation: Explanation,
    pub stopped: Option<Stopped>,
}

/// Counts and times of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RunStats {
    /// Prompts evaluated by the backend in this run.
    pub evaluated: usize,
    /// Prompts whose values came from the run directory.
    pub reused_from_run_dir: usize,
    /// Prompt tokens the backend computed for the evaluated prompts.
    pub prompt_tokens_computed: u64,
    /// Prompt tokens it took from its prefix cache instead.
    pub prompt_tokens_reused: u64,
    pub kv_cache_enabled: bool,
    /// The backend's cache counters over the run (base answer included).
    pub kv_cache_hits: u64,
    pub kv_cache_misses: u64,
    pub kv_cache_evictions: u64,
    pub wall_time_s: f64,
}

/// Answer tokens in a `[player][token]` matrix.
pub fn width(matrix: &[Vec<f64>]) -> usize {
    matrix.first().map_or(0, Vec::len)
}
