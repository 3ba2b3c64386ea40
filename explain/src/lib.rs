//! Shapley and Banzhaf attributions of a conversation's parts to a model's answer.
//!
//! Architecture invariant: this crate is pure computation, which its dependencies enforce (the
//! plugin API's types, serde, rand; never the host). It knows nothing of plugins,
//! backends, files or terminals: it splits a conversation into [`players`], plans the
//! [`coalition`]s an [`estimators`] needs, renders and [`schedule`]s their prompts, and turns
//! their values into an [`Explanation`]. The values themselves come from a [`value`] function
//! over a [`value::Model`] that the caller supplies and runs; the caller owns IO, persistence
//! and progress.
//!
//! ```text
//! Players::split ─▶ Plan::new ─▶ Job::with_holdout (render, dedup, sort) ─▶ caller evaluates
//!                                 Job::prompts()                             each prompt
//!                                                 Job::finish(values) ─▶ Explanation (+ Trust)
//! ```
//!
//! A sampled plan's job also holds a few random [`trust`] coalitions the estimator never sees;
//! their values say how well the attribution predicts the model.

pub mod coalition;
pub mod error;
pub mod estimators;
pub mod hierarchy;
pub mod interactions;
pub mod media;
pub mod normalize;
pub mod players;
pub mod schedule;
pub mod settings;
pub mod stopping;
pub mod trust;
pub mod value;

use lmhost_plugin_api::ConversationSnapshot;
use serde::Serialize;

pub use coalition::{render, Coalition};
pub use error::ExplainError;
pub use estimators::{Estimates, EstimatorSettings, Plan};
pub use interactions::{Interaction, InteractionValues};
pub use media::{ImageRegions, MediaSpec, Piece, Region};
pub use players::{HiddenParts, Player, PlayerSpec, Players};
pub use schedule::Schedule;
pub use settings::{
    Absence, AbsenceKind, AudioPlayers, Estimand, EstimatorKind, Fill, Granularity, ImagePlayers,
    InteractionIndex, Interactions, Normalizer, ValueKind,
};
pub use stopping::{StopReason, Stopped, Stopping};
pub use trust::Trust;
pub use value::{BaseAnswer, Evaluation, Model, Need, ValueFunction};

use settings::EstimatorKind as Kind;

/// A planned explanation: the unique prompts to evaluate, in the order to evaluate them.
#[derive(Debug, Clone)]
pub struct Job {
    players: Players,
    plan: Plan,
    /// Random coalitions evaluated only to test the attribution (after the plan's, in the
    /// schedule's coalition order).
    holdout: Vec<Coalition>,
    schedule: Schedule,
}

impl Job {
    /// Renders every coalition of `plan` under `absence`, deduplicates the prompts and, with
    /// `sort`, orders them for prefix sharing. No held-out coalitions.
    pub fn new(players: Players, plan: Plan, absence: &Absence, sort: bool) -> Job {
        Job::with_holdout(players, plan, 0, absence, sort)
    }

    /// As [`Job::new`], plus `holdout` random coalitions (from the plan's seed, on a stream of
    /// their own) evaluated with the rest, to score the attribution; none for `exact`, whose
    /// attribution is not an estimate.
    pub fn with_holdout(
        players: Players,
        plan: Plan,
        holdout: usize,
        absence: &Absence,
        sort: bool,
    ) -> Job {
        let settings = plan.settings();
        let holdout = match settings.kind {
            Kind::Exact => Vec::new(),
            _ => trust::draw(plan.n(), holdout, settings.seed),
        };
        let rendered: Vec<ConversationSnapshot> = plan
            .coalitions()
            .iter()
            .chain(&holdout)
            .map(|c| render(&players, c, absence))
            .collect();
        let schedule = schedule::schedule(&rendered, sort);
        Job {
            players,
            plan,
            holdout,
            schedule,
        }
    }

    /// The prompts to evaluate, each once, in evaluation order.
    pub fn prompts(&self) -> &[ConversationSnapshot] {
        &self.schedule.prompts
    }

    /// Per prompt, in the order of [`Job::prompts`], the players absent from the first
    /// coalition rendered to it: what [`Absence::Hide`] hides.
    pub fn absent(&self) -> Vec<Vec<u32>> {
        let mut absent = vec![None; self.schedule.prompts.len()];
        let coalitions = self.plan.coalitions().iter().chain(&self.holdout);
        for (c, &p) in coalitions.zip(&self.schedule.of_coalition) {
            absent[p].get_or_insert_with(|| {
                (0..c.n())
                    .filter(|&i| !c.contains(i))
                    .map(|i| i as u32)
                    .collect()
            });
        }
        absent.into_iter().map(Option::unwrap_or_default).collect()
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn players(&self) -> &Players {
        &self.players
    }

    /// Attributions from `values`, one per prompt in the order of `prompts()`.
    pub fn finish(&self, values: &[f64]) -> Explanation {
        assert_eq!(
            values.len(),
            self.schedule.prompts.len(),
            "one value per prompt"
        );
        let per_coalition: Vec<f64> = self
            .schedule
            .of_coalition
            .iter()
            .map(|&p| values[p])
            .collect();
        let (per_coalition, held_out) = per_coalition.split_at(self.plan.coalitions().len());
        let estimates = self.plan.estimate(per_coalition);
        let v_all = per_coalition[self.plan.full_index()];
        let v_none = per_coalition[self.plan.empty_index()];
        let settings = self.plan.settings();
        // Exact Shapley and KernelSHAP are efficient by construction: the report shows it.
        let efficient = matches!(settings.kind, Kind::Exact | Kind::Kernel);
        let efficiency = (efficient && settings.estimand == Estimand::Shapley).then(|| {
            let sum: f64 = estimates.values.iter().sum();
            Efficiency {
                sum,
                expected: v_all - v_none,
                gap: sum - (v_all - v_none),
            }
        });
        let trust = (!self.holdout.is_empty())
            .then(|| Trust::assess(&estimates, v_none, &self.holdout, held_out));
        let ranks = ranks(&estimates.values);
        let attributions = self
            .players
            .players()
            .iter()
            .enumerate()
            .map(|(i, player)| Attribution {
                player: player.clone(),
                value: estimates.values[i],
                std_error: estimates.std_errors.as_ref().map(|se| se[i]),
                rank: ranks[i],
            })
            .collect();
        Explanation {
            attributions,
            v_all,
            v_none,
            efficiency,
            trust,
            coalitions: self.plan.coalitions().len(),
            unique_prompts: self.schedule.prompts.len(),
            per_token: None,
            interactions: estimates.interactions,
        }
    }

    /// Attributions to each answer token from `tokens`, one list of token parts per prompt
    /// in the order of `prompts()` (see [`Evaluation::tokens`]): `[player][token]`, each
    /// column estimated from that token's values as [`Job::finish`] estimates the totals, so
    /// a player's row sums to its value where the value is the tokens' sum. A prompt's list
    /// shorter than the longest (a shorter generated reply) counts 0 for the tokens it lacks.
    /// `None` when any prompt has no token parts.
    pub fn per_token(&self, tokens: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
        assert_eq!(
            tokens.len(),
            self.schedule.prompts.len(),
            "one list per prompt"
        );
        if tokens.iter().any(Vec::is_empty) {
            return None;
        }
        let width = tokens.iter().map(Vec::len).max().unwrap_or(0);
        let planned = &self.schedule.of_coalition[..self.plan.coalitions().len()];
        let columns: Vec<Vec<f64>> = (0..width)
            .map(|t| {
                let column: Vec<f64> = planned
                    .iter()
                    .map(|&p| tokens[p].get(t).copied().unwrap_or(0.0))
                    .collect();
                self.plan.estimate(&column).values
            })
            .collect();
        Some(
            (0..self.players.len())
                .map(|i| columns.iter().map(|column| column[i]).collect())
                .collect(),
        )
    }
}

/// 1 for the largest |value|, ties broken by player order.
fn ranks(values: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].abs().total_cmp(&values[a].abs()).then(a.cmp(&b)));
    let mut ranks = vec![0; values.len()];
    for (r, &i) in order.iter().enumerate() {
        ranks[i] = r + 1;
    }
    ranks
}

/// One player's attribution.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attribution {
    #[serde(flatten)]
    pub player: Player,
    pub value: f64,
    /// Standard error of a sampling estimate; `None` for exact.
    pub std_error: Option<f64>,
    /// 1 is the largest |value|.
    pub rank: usize,
}

/// Exact Shapley values sum to v(all) - v(none); `gap` is how far they miss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Efficiency {
    pub sum: f64,
    pub expected: f64,
    pub gap: f64,
}

/// The result of an explanation.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// In player order.
    pub attributions: Vec<Attribution>,
    pub v_all: f64,
    pub v_none: f64,
    /// For exact Shapley only.
    pub efficiency: Option<Efficiency>,
    /// How well the attribution predicts held-out coalitions; `None` for `exact` or when no
    /// coalitions were held out.
    pub trust: Option<Trust>,
    /// Distinct coalitions the estimator planned (held-out ones not counted).
    pub coalitions: usize,
    /// Distinct prompts those coalitions and the held-out ones rendered to.
    pub unique_prompts: usize,
    /// `[player][answer token]`: each player's attribution to each answer token's part of the
    /// value (see [`Job::per_token`]); `None` for values not made of tokens.
    pub per_token: Option<Vec<Vec<f64>>>,
    /// What the players do together, when the settings ask (`interactions`).
    pub interactions: Option<InteractionValues>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::abi_stable::std_types::RVec;
    use lmhost_plugin_api::{Message, Role, Turn};

    /// Value: how many times "yes" appears in the prompt.
    fn yes_count(prompt: &ConversationSnapshot) -> f64 {
        prompt
            .messages()
            .map(|m| m.text_content().matches("yes").count())
            .sum::<usize>() as f64
    }

    #[test]
    fn job_turns_prompt_values_into_attributions() {
        let conversation = ConversationSnapshot::new(vec![Turn {
            messages: RVec::from(vec![
                Message::text(Role::System, "say yes"),
                Message::text(Role::User, "no no"),
                Message::text(Role::User, "yes yes"),
            ]),
        }])
        .unwrap();
        let players = Players::split(&conversation, &PlayerSpec::default()).unwrap();
        let plan = Plan::new(players.len(), &EstimatorSettings::default()).unwrap();
        let job = Job::new(players, plan, &Absence::Delete, true);
        assert_eq!(job.prompts().len(), 8);
        let values: Vec<f64> = job.prompts().iter().map(yes_count).collect();
        let e = job.finish(&values);
        let got: Vec<f64> = e.attributions.iter().map(|a| a.value).collect();
        assert_eq!(got, [1.0, 0.0, 2.0]);
        assert_eq!((e.v_all, e.v_none), (3.0, 0.0));
        assert_eq!(e.attributions[2].rank, 1);
        assert!(e.efficiency.unwrap().gap.abs() < 1e-12);
    }

    #[test]
    fn per_token_attributions_split_each_players_value_by_answer_token() {
        let conversation = ConversationSnapshot::from_prompt("yes no yes no no");
        let spec = PlayerSpec {
            granularity: Granularity::Words,
            ..PlayerSpec::default()
        };
        let players = Players::split(&conversation, &spec).unwrap();
        for kind in [EstimatorKind::Exact, EstimatorKind::Kernel] {
            let settings = EstimatorSettings {
                kind,
                budget: 24,
                ..EstimatorSettings::default()
            };
            let plan = Plan::new(players.len(), &settings).unwrap();
            let job = Job::new(players.clone(), plan, &Absence::Delete, true);
            // Two answer tokens: one counts the yeses, one the noes.
            let count = |p: &ConversationSnapshot, word: &str| {
                let text = p.messages().map(|m| m.text_content()).collect::<String>();
                text.split_whitespace().filter(|w| *w == word).count() as f64
            };
            let tokens: Vec<Vec<f64>> = job
                .prompts()
                .iter()
                .map(|p| vec![count(p, "yes"), count(p, "no")])
                .collect();
            let totals: Vec<f64> = tokens.iter().map(|t| t.iter().sum()).collect();
            let e = job.finish(&totals);
            let matrix = job.per_token(&tokens).unwrap();
            for (i, row) in matrix.iter().enumerate() {
                let word = &e.attributions[i].player.text;
                let expected = if word == "yes" {
                    [1.0, 0.0]
                } else {
                    [0.0, 1.0]
                };
                assert!(
                    row.iter().zip(expected).all(|(a, b)| (a - b).abs() < 1e-9),
                    "{kind:?} player {i} ({word}): {row:?}"
                );
                let sum: f64 = row.iter().sum();
                assert!((sum - e.attributions[i].value).abs() < 1e-9);
            }
            let mut without = tokens.clone();
            without[0].clear();
            assert_eq!(job.per_token(&without), None);
        }
    }

    #[test]
    fn held_out_coalitions_join_the_prompts_and_score_the_attribution() {
        let conversation = ConversationSnapshot::from_prompt("yes no yes yes no");
        let spec = PlayerSpec {
            granularity: Granularity::Words,
            ..PlayerSpec::default()
        };
        let players = Players::split(&conversation, &spec).unwrap();
        let job_for = |kind, holdout| {
            let settings = EstimatorSettings {
                kind,
                budget: 40,
                ..EstimatorSettings::default()
            };
            let plan = Plan::new(players.len(), &settings).unwrap();
            Job::with_holdout(players.clone(), plan, holdout, &Absence::Delete, true)
        };
        let finish =
            |job: &Job| job.finish(&job.prompts().iter().map(yes_count).collect::<Vec<_>>());
        // A yes count is additive: the attribution predicts every held-out coalition.
        let job = job_for(EstimatorKind::Antithetic, 16);
        let without = job_for(EstimatorKind::Antithetic, 0);
        assert!(job.prompts().len() >= without.prompts().len());
        assert_eq!(
            job.plan().coalitions().len(),
            without.plan().coalitions().len()
        );
        let trust = finish(&job).trust.unwrap();
        assert_eq!(trust.holdout, 16);
        assert!((trust.spearman.unwrap() - 1.0).abs() < 1e-12, "{trust:?}");
        assert!((trust.r_squared.unwrap() - 1.0).abs() < 1e-12, "{trust:?}");
        assert_eq!(finish(&without).trust, None);
        // Exact holds nothing out.
        let exact = job_for(EstimatorKind::Exact, 16);
        assert_eq!(
            exact.prompts().len(),
            job_for(EstimatorKind::Exact, 0).prompts().len()
        );
        assert_eq!(finish(&exact).trust, None);
    }

    #[test]
    fn identical_words_deleted_give_one_prompt() {
        let conversation = ConversationSnapshot::from_prompt("a a");
        let spec = PlayerSpec {
            granularity: Granularity::Words,
            ..PlayerSpec::default()
        };
        let players = Players::split(&conversation, &spec).unwrap();
        let plan = Plan::new(2, &EstimatorSettings::default()).unwrap();
        let job = Job::new(players, plan, &Absence::Delete, true);
        // {}, {0}, {1}, {0,1}: {0} and {1} both render "a".
        assert_eq!(job.plan().coalitions().len(), 4);
        assert_eq!(job.prompts().len(), 3);
    }
}
