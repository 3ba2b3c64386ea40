//! `lmhost explain --reanalyze`: an explanation computed from the coalition values a run
//! directory already holds, with no model call.
//!
//! The plan is made exactly as [`crate::explain_run::run`] makes it (players, estimator, budget,
//! seed, estimand, held-out coalitions, absence), and every prompt it needs is looked up under
//! the same run key and prompt key that run stores it by. All there: the outcome is the one a
//! normal run would report, with every value counted as taken from the run directory. Any
//! missing: an error naming how many, so a normal run (which computes only those) can follow.
//! A stopping rule's rounds and a hierarchical run's levels are replayed through the same
//! `explain_run::explain_levels`, so they end where the run ended.
//!
//! **Invariant:** no backend is opened; the plugin is only looked up for its name, which is
//! part of the run key.

use std::path::Path;
use std::time::Instant;

use lmhost_plugin_api::ConversationSnapshot;

use super::store::{prompt_key, RunStore};
use crate::config::{Config, ExplanationConfig};
use crate::error::{Error, Result};
use crate::explain::{BaseAnswer, EstimatorKind, Plan, Players};
use crate::explain_run::{
    answer_key, explain_levels, positional, run_key, setup_key, Levels, Outcome, ReplySource,
    RunStats,
};
use crate::{plugins, Host};

/// Explains `conversation` as `config.explanation` says, from the values in `run_dir` alone.
/// `reply` is the explained answer when it was given to the run (`--reply`); otherwise the
/// run directory's stored answer is used.
pub fn run(
    host: &Host,
    config: &Config,
    conversation: &ConversationSnapshot,
    run_dir: &Path,
    reply: Option<&str>,
) -> Result<Outcome> {
    let started = Instant::now();
    let settings = config.explanation.clone();
    let fail = |message: String| Error::RunStore {
        path: run_dir.to_path_buf(),
        message,
    };
    // Opening would create an empty store: a directory that holds none is an error instead.
    if !run_dir.join("values.sqlite").is_file() {
        return Err(fail(
            "holds no run store (values.sqlite); --reanalyze reads the values of an earlier \
             run: run `lmhost explain --run-dir` without --reanalyze first"
                .into(),
        ));
    }
    let players = Players::split(conversation, &settings.player_spec())?;
    let plan = Plan::new(players.len(), &settings.estimator_settings())?;
    let store = RunStore::open(run_dir)?;

    // The plugin's name is part of the keys; finding it loads no model.
    let dirs = plugins::search_dirs(&config.plugin_dirs);
    let plugin = host.registry().find(&config.backend.kind, &dirs)?.0.name();

    // Keys made by the same functions `explain_run::run` uses.
    let setup_key = setup_key(config, &settings, &plugin);
    let (base, reply_source) = match reply {
        Some(text) => (
            BaseAnswer {
                text: text.to_string(),
                contextual_embedding: None,
            },
            ReplySource::Given,
        ),
        None => {
            let answer_key = answer_key(&setup_key, &settings, conversation);
            let answer = store.base_answer(&answer_key)?.ok_or_else(|| {
                fail(format!(
                    "holds no answer to this conversation from `{plugin}` with this model, \
                     these backend options and generation settings; give it with --reply, or \
                     run without --reanalyze"
                ))
            })?;
            (answer, ReplySource::RunDir)
        }
    };
    let run_key = run_key(&setup_key, &settings, &base);

    let stored = store.load(&run_key)?;
    let mut needed = 0;
    let levels = explain_levels(players, plan, &settings, |job| {
        let prompts = job.prompts();
        needed = prompts.len();
        let values: Vec<_> = prompts
            .iter()
            .filter_map(|p| stored.get(&prompt_key(p)).cloned())
            .collect();
        let missing = needed - values.len();
        if missing > 0 {
            return Err(fail(missing_message(
                &settings,
                missing,
                needed,
                stored.is_empty(),
            )));
        }
        if let Some(v) = values.iter().map(|e| e.value).find(|v| !v.is_finite()) {
            return Err(crate::explain::ExplainError::Model {
                what: "a coalition".into(),
                message: format!("its stored value is {v} (not a finite number)"),
            }
            .into());
        }
        Ok(values)
    })?;
    let width = levels.token_width();
    let Levels {
        job,
        explanation,
        stopped,
        refinements,
    } = levels;
    // No backend to name the answer's tokens: they are numbered.
    Ok(Outcome {
        explanation,
        players: job.players().clone(),
        reply: base.text,
        answer_tokens: positional(Vec::new(), width),
        reply_source,
        settings,
        plugin,
        // The backend is not opened: the model is named as the config names it.
        model_id: config.backend.model_id.clone(),
        stopped,
        refinements,
        stats: RunStats {
            reused_from_run_dir: needed,
            kv_cache_enabled: config.explanation.kv_cache,
            wall_time_s: started.elapsed().as_secs_f64(),
            ..RunStats::default()
        },
    })
}

/// Why the run directory cannot answer: how many of the coalitions are missing, and what to do.
fn missing_message(
    settings: &ExplanationConfig,
    missing: usize,
    needed: usize,
    nothing_stored: bool,
) -> String {
    let why = if nothing_stored {
        " (it holds no value for this answer and value function: was it written with \
         another model, generation settings, value or --reply?)"
    } else {
        ""
    };
    let sampled = match settings.estimator {
        EstimatorKind::Exact | EstimatorKind::Loo => String::new(),
        _ => format!(", budget {}, seed {}", settings.budget, settings.seed),
    };
    format!(
        "{missing} of {needed} coalitions that `{}` ({}{sampled}) needs are not in \
         it{why}; run without --reanalyze to compute only the missing ones (the {} there \
         are reused)",
        settings.estimator,
        settings.estimand,
        needed - missing
    )
}
