//! Runs an explanation against a backend: the IO around the pure [`crate::explain`] module.
//! Checks the value function's capability, makes the base answer, evaluates the scheduled
//! prompts in batches of `batch_size` (taking those already in the run directory from there,
//! storing each batch's values the moment it is computed, and a failed batch's prompts one at
//! a time so nothing computable is lost), shows progress, and gathers the figures the report
//! needs.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lmhost_plugin_api::{BackendStats, ConversationSnapshot, KvCacheSettings};

use crate::backend::Backend;
use crate::config::{Config, ExplanationConfig};
use crate::error::{Error, Result};
use crate::explain::value::ValueFunction;
use crate::explain::{
    hierarchy, media, value, AbsenceKind, BaseAnswer, EstimatorSettings, Evaluation, Explanation,
    Granularity, Job, Model, Need, Plan, Players, Stopped,
};
use crate::outcome::{width, Outcome, Refinement, ReplySource, RunStats};

mod keys;
mod models;
mod options;
pub mod reanalyze;
pub mod store;

pub(crate) use keys::{answer_key, run_key, setup_key};
use models::{BackendModel, HidingModel};
pub use options::{Cancel, Progress, ProgressFn, RunOptions};
use store::{prompt_key, RunStore};

/// What a run found: the first level (the only one unless `players = "auto"`) and the levels
/// refining it.
pub(crate) struct Levels {
    pub job: Job,
    pub explanation: Explanation,
    pub stopped: Option<Stopped>,
    pub refinements: Vec<Refinement>,
}

/// Explains `backend`'s answer to `conversation` as `config.explanation` says.
pub fn run(
    config: &Config,
    backend: &Backend,
    conversation: &ConversationSnapshot,
    options: &RunOptions,
) -> Result<Outcome> {
    let started = Instant::now();
    let settings = config.explanation.clone();
    // Everything that can be refused is refused before the first model call.
    let caps = backend.capabilities();
    Need::of(settings.value).check(settings.value, &caps)?;
    let hide = settings.absence == AbsenceKind::Hide;
    media::check_backend(&settings.player_spec().media, hide, conversation, &caps)?;
    let players = Players::split(conversation, &settings.player_spec())?;
    if hide {
        players.check_hideable()?;
    }
    let plan = Plan::new(players.len(), &settings.estimator_settings())?;
    let store = options.run_dir.as_deref().map(RunStore::open).transpose()?;

    backend.set_kv_cache(KvCacheSettings {
        enabled: settings.kv_cache,
        ..config.kv_cache.into()
    })?;
    let stats_before = backend.stats();
    let model = BackendModel {
        backend,
        generation: &config.generation,
    };

    let setup_key = setup_key(config, &settings, backend.plugin());
    let (base, reply_source) = base_answer(
        &model,
        &settings,
        conversation,
        options,
        store.as_ref(),
        &setup_key,
    )?;
    let value_fn = value::build(settings.value, settings.value_mean, &base, conversation)?;
    let run_key = run_key(&setup_key, &settings, &base);

    let stored = match &store {
        Some(store) => store.load(&run_key)?,
        None => Default::default(),
    };
    let mut evaluator = Evaluator {
        model: &model,
        value_fn: value_fn.as_ref(),
        store: store.as_ref(),
        run_key: &run_key,
        stored,
        known: HashMap::new(),
        batch_size: settings.batch_size,
        bar: progress_bar(options.progress),
        on_progress: options.on_progress.clone(),
        cancel: options.cancel.clone(),
        stats: RunStats {
            kv_cache_enabled: settings.kv_cache,
            ..RunStats::default()
        },
        backend,
        stats_before: &stats_before,
        started,
    };
    let levels = explain_levels(players, plan, &settings, |job| {
        evaluator.values(job, settings.absence)
    })?;
    let widest = levels.token_width();
    let Levels {
        job,
        explanation,
        stopped,
        refinements,
    } = levels;
    evaluator.bar.finish_and_clear();
    let mut stats = evaluator.stats;
    let after = backend.stats();
    stats.kv_cache_hits = after
        .kv_cache_hits
        .saturating_sub(stats_before.kv_cache_hits);
    stats.kv_cache_misses = after
        .kv_cache_misses
        .saturating_sub(stats_before.kv_cache_misses);
    stats.kv_cache_evictions = after
        .kv_cache_evictions
        .saturating_sub(stats_before.kv_cache_evictions);
    let answer_tokens = match widest {
        0 => Vec::new(),
        widest => answer_tokens(backend, conversation, &base.text, widest),
    };
    stats.wall_time_s = started.elapsed().as_secs_f64();
    Ok(Outcome {
        explanation,
        players: job.players().clone(),
        reply: base.text,
        answer_tokens,
        reply_source,
        settings,
        plugin: backend.plugin().to_string(),
        model_id: backend.model_id(),
        stats,
        stopped,
        refinements,
    })
}

impl Levels {
    /// The most answer tokens any level's per-token matrix has (0: none has one).
    pub fn token_width(&self) -> usize {
        std::iter::once(&self.explanation)
            .chain(self.refinements.iter().map(|level| &level.explanation))
            .filter_map(|e| e.per_token.as_deref().map(width))
            .max()
            .unwrap_or(0)
    }
}

/// Explains the first level with `plan` and, with `players = "auto"`, refines it level by
/// level (each through [`in_rounds`]) until no strong player can split further. `reanalyze`
/// replays the same levels from the run directory: each choice depends only on values.
pub(crate) fn explain_levels(
    players: Players,
    plan: Plan,
    settings: &ExplanationConfig,
    mut values: impl FnMut(&Job) -> Result<Vec<Evaluation>>,
) -> Result<Levels> {
    let (job, explanation, stopped) = in_rounds(players, plan, settings, &mut values)?;
    let mut refinements: Vec<Refinement> = Vec::new();
    if settings.players == Granularity::Auto {
        loop {
            let (players, explanation) = match refinements.last() {
                Some(level) => (&level.players, &level.explanation),
                None => (job.players(), &explanation),
            };
            let Some((parts, parents)) = hierarchy::refine(
                players,
                explanation,
                settings.refine_top,
                settings.refine_to,
            ) else {
                break;
            };
            let plan = Plan::new(parts.len(), &settings.estimator_settings())?;
            let (job, explanation, stopped) = in_rounds(parts, plan, settings, &mut values)?;
            refinements.push(Refinement {
                parents,
                players: job.players().clone(),
                explanation,
                stopped,
            });
        }
    }
    Ok(Levels {
        job,
        explanation,
        stopped,
        refinements,
    })
}

/// `width` labels for the answer's tokens: the pieces of `reply` as the backend scores it
/// after `conversation`, each detokenized on its own; `#n` for the `n`th where it cannot
/// score or detokenize, or where a generated reply ran longer than the answer.
fn answer_tokens(
    backend: &Backend,
    conversation: &ConversationSnapshot,
    reply: &str,
    width: usize,
) -> Vec<String> {
    let pieces: Vec<String> = backend
        .score(conversation, reply)
        .ok()
        .and_then(|record| {
            let each = record
                .token_ids
                .iter()
                .map(|&id| backend.detokenize(&[id]).ok());
            each.collect()
        })
        .unwrap_or_default();
    positional(pieces, width)
}

/// `pieces` cut or filled with `#n` labels to `width`.
pub(crate) fn positional(mut pieces: Vec<String>, width: usize) -> Vec<String> {
    pieces.truncate(width);
    let known = pieces.len();
    pieces.extend((known..width).map(|t| format!("#{}", t + 1)));
    pieces
}

/// Gives prompts their values: from this run's earlier rounds, the run directory or the
/// backend, in batches, storing each batch the moment it is computed.
struct Evaluator<'a> {
    model: &'a BackendModel<'a>,
    value_fn: &'a dyn ValueFunction,
    store: Option<&'a RunStore>,
    run_key: &'a str,
    /// What the run directory held when the run began.
    stored: HashMap<String, Evaluation>,
    /// Values this run has so far, by prompt key.
    known: HashMap<String, Evaluation>,
    batch_size: usize,
    bar: ProgressBar,
    on_progress: Option<ProgressFn>,
    cancel: Option<Cancel>,
    stats: RunStats,
    backend: &'a Backend,
    stats_before: &'a BackendStats,
    started: Instant,
}

impl Evaluator<'_> {
    /// One value per prompt of `job`, in order; with `hide`, each scored with its coalition's
    /// absent players hidden.
    fn values(&mut self, job: &Job, absence: AbsenceKind) -> Result<Vec<Evaluation>> {
        let prompts = job.prompts();
        let keys: Vec<String> = prompts.iter().map(prompt_key).collect();
        let hiding = match absence {
            AbsenceKind::Hide => Some(HidingModel {
                backend: self.model.backend,
                conversation: job.players().conversation(),
                parts: job.players().hidden_parts(),
                absent: keys.iter().cloned().zip(job.absent()).collect(),
            }),
            _ => None,
        };
        let new: Vec<(&ConversationSnapshot, &String)> = prompts
            .iter()
            .zip(&keys)
            .filter(|(_, key)| !self.known.contains_key(*key))
            .collect();
        self.bar.inc_length(new.len() as u64);
        let planned = self.known.len() + new.len();
        for batch in new.chunks(self.batch_size) {
            if self.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
                return Err(Error::Cancelled {
                    evaluated: self.stats.evaluated,
                });
            }
            self.evaluate_batch(batch, hiding.as_ref())?;
            if let Some(report) = &self.on_progress {
                report(&Progress {
                    done: self.known.len(),
                    planned,
                    elapsed_s: self.started.elapsed().as_secs_f64(),
                });
            }
        }
        Ok(keys.iter().map(|key| self.known[key].clone()).collect())
    }

    fn evaluate_batch(
        &mut self,
        batch: &[(&ConversationSnapshot, &String)],
        hiding: Option<&HidingModel<'_>>,
    ) -> Result<()> {
        let missing: Vec<ConversationSnapshot> = batch
            .iter()
            .filter(|(_, key)| !self.stored.contains_key(*key))
            .map(|(prompt, _)| (*prompt).clone())
            .collect();
        let (model, value_fn): (&dyn Model, _) = match hiding {
            Some(hiding) => (hiding, self.value_fn),
            None => (self.model, self.value_fn),
        };
        // A batch the run directory holds whole never reaches the backend (nor loads its model).
        let batched = if missing.is_empty() {
            Ok(Vec::new())
        } else {
            value_fn.evaluate_batch(model, &missing)
        };
        // A failed batch keeps what it can: its prompts run one at a time, each stored as it
        // comes, up to the one that fails (whose own error is then the run's).
        let mut fresh: Box<dyn Iterator<Item = std::result::Result<_, _>>> = match batched {
            Ok(values) => Box::new(values.into_iter().map(Ok)),
            Err(_) => Box::new(missing.iter().map(|p| value_fn.evaluate(model, p))),
        };
        for &(prompt, key) in batch {
            let evaluation = match self.stored.get(key) {
                Some(e) => {
                    self.stats.reused_from_run_dir += 1;
                    e.clone()
                }
                None => {
                    let e = fresh
                        .next()
                        .ok_or_else(|| crate::explain::ExplainError::Model {
                            what: "a batch of coalitions".into(),
                            message: "fewer values came back than prompts were sent".into(),
                        })??;
                    if let Some(store) = self.store {
                        store.put(self.run_key, prompt, &e)?;
                    }
                    self.stats.evaluated += 1;
                    self.stats.prompt_tokens_computed +=
                        e.prompt_tokens - e.cached_prompt_tokens.min(e.prompt_tokens);
                    self.stats.prompt_tokens_reused += e.cached_prompt_tokens;
                    e
                }
            };
            if !evaluation.value.is_finite() {
                return Err(crate::explain::ExplainError::Model {
                    what: "a coalition".into(),
                    message: format!("its value is {} (not a finite number)", evaluation.value),
                }
                .into());
            }
            self.known.insert(key.clone(), evaluation);
            self.bar.inc(1);
        }
        let rate = self.bar.position() as f64 / self.started.elapsed().as_secs_f64().max(1e-3);
        self.bar.set_message(format!(
            "{rate:.1}/s  {}",
            hit_rate(self.stats_before, &self.backend.stats())
        ));
        Ok(())
    }
}

/// Explains with `plan` (made from the settings, so refused settings fail before any model
/// call). With a stopping rule, in rounds of growing budget (see [`crate::explain::stopping`]),
/// each round's prompts valued by `values`; it returns the job and explanation of the round the
/// run ended with. `reanalyze` replays the same rounds from the run directory.
pub(crate) fn in_rounds(
    players: Players,
    plan: Plan,
    settings: &ExplanationConfig,
    mut values: impl FnMut(&Job) -> Result<Vec<Evaluation>>,
) -> Result<(Job, Explanation, Option<Stopped>)> {
    let stopping = settings.stopping();
    let mut explain = |plan: Plan| -> Result<(Job, Explanation)> {
        let job = job(players.clone(), plan, settings);
        let (totals, tokens): (Vec<f64>, Vec<Vec<f64>>) = values(&job)?
            .into_iter()
            .map(|e| (e.value, e.tokens))
            .unzip();
        let mut explanation = job.finish(&totals);
        explanation.per_token = job.per_token(&tokens);
        Ok((job, explanation))
    };
    if !stopping.is_on() {
        let (job, explanation) = explain(plan)?;
        return Ok((job, explanation, None));
    }
    let budgets = stopping.rounds(settings.budget);
    let of_rounds = budgets.len();
    let stopped = |budget, rounds, reason| Stopped {
        budget,
        rounds,
        of_rounds,
        reason,
    };
    let mut previous: Option<Explanation> = None;
    for (round, &budget) in budgets[..of_rounds - 1].iter().enumerate() {
        let estimator = EstimatorSettings {
            budget,
            ..settings.estimator_settings()
        };
        // A budget too small for the estimator (a singular kernel): on to the next round.
        let Ok(small) = Plan::new(players.len(), &estimator) else {
            continue;
        };
        let (job, explanation) = explain(small)?;
        if let Some(reason) = stopping.reason(previous.as_ref(), &explanation) {
            return Ok((
                job,
                explanation,
                Some(stopped(budget, round + 1, Some(reason))),
            ));
        }
        previous = Some(explanation);
    }
    let (job, explanation) = explain(plan)?;
    let reason = stopping.reason(previous.as_ref(), &explanation);
    Ok((
        job,
        explanation,
        Some(stopped(settings.budget, of_rounds, reason)),
    ))
}

/// The answer to explain: given, stored in the run directory, or generated (and stored).
/// The prompts to evaluate: the plan's coalitions and the held-out ones, rendered and ordered
/// as the settings say. `reanalyze` builds the same job to find them in the run directory.
pub(crate) fn job(players: Players, plan: Plan, settings: &ExplanationConfig) -> Job {
    Job::with_holdout(
        players,
        plan,
        settings.holdout,
        &settings.absence(),
        settings.sort_prompts,
    )
}

fn base_answer(
    model: &BackendModel<'_>,
    settings: &ExplanationConfig,
    conversation: &ConversationSnapshot,
    options: &RunOptions,
    store: Option<&RunStore>,
    setup_key: &serde_json::Value,
) -> Result<(BaseAnswer, ReplySource)> {
    if let Some(reply) = &options.reply {
        let answer = BaseAnswer {
            text: reply.clone(),
            contextual_embedding: None,
        };
        return Ok((answer, ReplySource::Given));
    }
    let embeddings = settings.value == crate::explain::ValueKind::EmbeddingCosine;
    let answer_key = answer_key(setup_key, settings, conversation);
    if let Some(answer) = store
        .map(|s| s.base_answer(&answer_key))
        .transpose()?
        .flatten()
    {
        return Ok((answer, ReplySource::RunDir));
    }
    let record = model
        .generate(conversation, embeddings)
        .map_err(|message| crate::explain::ExplainError::Model {
            what: "the base answer".into(),
            message,
        })?;
    let answer = BaseAnswer {
        text: record.text.to_string(),
        contextual_embedding: record
            .contextual_embedding
            .into_option()
            .map(|e| e.into_vec()),
    };
    if let Some(store) = store {
        store.put_base_answer(&answer_key, &answer)?;
    }
    Ok((answer, ReplySource::Generated))
}

/// A bar whose length grows as rounds add prompts.
fn progress_bar(wanted: bool) -> ProgressBar {
    if !wanted || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{bar:32.cyan/blue} {pos}/{len} coalitions  {msg}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// "cache hits 87%" over the run so far.
fn hit_rate(before: &BackendStats, now: &BackendStats) -> String {
    let hits = now.kv_cache_hits.saturating_sub(before.kv_cache_hits);
    let misses = now.kv_cache_misses.saturating_sub(before.kv_cache_misses);
    if hits + misses == 0 {
        return "cache hits -".into();
    }
    format!(
        "cache hits {:.0}%",
        100.0 * hits as f64 / (hits + misses) as f64
    )
}
