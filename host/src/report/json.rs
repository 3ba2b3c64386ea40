//! The JSON document of `lmhost explain --json FILE`; its fields are documented in docs/explain.md.

use serde::Serialize;

use crate::config::ExplanationConfig;
use crate::explain::{Attribution, Efficiency, Explanation, Stopped, Trust};
use crate::outcome::{width, Outcome, Refinement, ReplySource, RunStats};

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
    /// The players' values as the table and the HTML page show them (`settings.normalize`), in
    /// the order of `players`; null with `identity`.
    pub normalized: Option<Vec<f64>>,
    pub v_all: f64,
    pub v_none: f64,
    pub efficiency: Option<Efficiency>,
    /// How well the attribution predicts held-out coalitions; null for exact or `holdout = 0`.
    pub trust: Option<&'a Trust>,
    /// How a run with a stopping rule went; null without one.
    pub stopped: Option<Stopped>,
    /// Attributions to each answer token, for the logprob values; null for the others.
    pub per_token: Option<PerToken<'a>>,
    /// With `interactions`: every subset of up to `interactions`' order, by size, then in
    /// player order (the table and the page list the strongest); null without.
    pub interactions: Option<Vec<InteractionDoc<'a>>>,
    /// With `players = "auto"`, each level after the first; empty otherwise.
    pub refinements: Vec<RefinementDoc<'a>>,
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

/// The players × answer-tokens matrix.
#[derive(Debug, Serialize)]
pub struct PerToken<'a> {
    /// The answer's tokens as text, one per column.
    pub tokens: &'a [String],
    /// `values[i][t]`: player `i` (in the order of `players`) to token `t`.
    pub values: &'a [Vec<f64>],
}

/// One subset's interaction value, its players by id.
#[derive(Debug, Serialize)]
pub struct InteractionDoc<'a> {
    pub players: Vec<&'a str>,
    pub value: f64,
    /// Of a sampled estimate; null for exact.
    pub std_error: Option<f64>,
}

/// A level of a hierarchical run.
#[derive(Debug, Serialize)]
pub struct RefinementDoc<'a> {
    /// The players refined, whose parts this level's players are.
    pub refined: Vec<&'a str>,
    pub players: Vec<Part<'a>>,
    /// As `normalized` at the top.
    pub normalized: Option<Vec<f64>>,
    pub v_all: f64,
    /// Without the refined players (the rest of the conversation present).
    pub v_none: f64,
    pub efficiency: Option<Efficiency>,
    pub trust: Option<&'a Trust>,
    pub stopped: Option<Stopped>,
    pub per_token: Option<PerToken<'a>>,
    pub interactions: Option<Vec<InteractionDoc<'a>>>,
    /// This level's coalitions, and the distinct prompts they rendered to.
    pub planned: usize,
    pub unique_prompts: usize,
}

/// A refined player's part.
#[derive(Debug, Serialize)]
pub struct Part<'a> {
    #[serde(flatten)]
    pub attribution: &'a Attribution,
    /// The id of the player it is a part of.
    pub parent: &'a str,
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
        normalized: super::normalized_values(e, &outcome.settings),
        v_all: e.v_all,
        v_none: e.v_none,
        efficiency: e.efficiency,
        trust: e.trust.as_ref(),
        stopped: outcome.stopped,
        per_token: per_token(outcome, e.per_token.as_deref()),
        interactions: interactions(e),
        refinements: outcome
            .refinements
            .iter()
            .map(|level| refinement(outcome, level))
            .collect(),
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

/// A level's matrix with the answer tokens its columns stand for.
fn per_token<'a>(outcome: &'a Outcome, values: Option<&'a [Vec<f64>]>) -> Option<PerToken<'a>> {
    let values = values?;
    let width = width(values).min(outcome.answer_tokens.len());
    Some(PerToken {
        tokens: &outcome.answer_tokens[..width],
        values,
    })
}

/// A level's `interactions[]`, as the document and Python's `Explanation.interactions` give
/// them.
pub fn interactions(e: &Explanation) -> Option<Vec<InteractionDoc<'_>>> {
    let interactions = e.interactions.as_ref()?;
    let each = interactions.values.iter().map(|i| InteractionDoc {
        players: super::player_ids(e, &i.players),
        value: i.value,
        std_error: i.std_error,
    });
    Some(each.collect())
}

fn refinement<'a>(outcome: &'a Outcome, level: &'a Refinement) -> RefinementDoc<'a> {
    let e = &level.explanation;
    let mut refined: Vec<&str> = level.parents.iter().map(String::as_str).collect();
    refined.dedup();
    RefinementDoc {
        refined,
        players: e
            .attributions
            .iter()
            .zip(&level.parents)
            .map(|(attribution, parent)| Part {
                attribution,
                parent,
            })
            .collect(),
        normalized: super::normalized_values(e, &outcome.settings),
        v_all: e.v_all,
        v_none: e.v_none,
        efficiency: e.efficiency,
        trust: e.trust.as_ref(),
        stopped: level.stopped,
        per_token: per_token(outcome, e.per_token.as_deref()),
        interactions: interactions(e),
        planned: e.coalitions,
        unique_prompts: e.unique_prompts,
    }
}

/// The document as pretty JSON.
pub fn render(outcome: &Outcome) -> String {
    serde_json::to_string_pretty(&document(outcome))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
