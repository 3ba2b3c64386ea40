//! Ending a sampled run before its budget once the answer is settled.
//!
//! A run with a stopping rule evaluates its budget in [`ROUNDS`] rounds that double: budget/8,
//! budget/4, budget/2, budget. A sampling estimator draws its coalitions one after another from
//! its seed, so a smaller budget's plan is a prefix of a larger one's: each round evaluates only
//! the coalitions the previous rounds lacked, and a run that goes the distance costs what it
//! would have without the rule. After each round the estimate is checked:
//! - `target_se`: every player's standard error is at most this;
//! - `settle_top = k`: the k players of largest |value|, in order, are the same as after the
//!   previous round.
//!
//! The run stops at the first round where any rule given holds.

use serde::Serialize;

use super::settings::EstimatorKind;
use super::Explanation;

/// Rounds of a run with a stopping rule, the last one spending the whole budget.
pub const ROUNDS: u32 = 4;

/// When a sampled run may end before its budget; both off by default.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stopping {
    /// Stop once no player's standard error exceeds this.
    pub target_se: Option<f64>,
    /// Stop once the top `settle_top` players by |value| keep their order between two rounds
    /// (0: off).
    pub settle_top: usize,
}

/// Why a run stopped before spending its budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum StopReason {
    /// The largest standard error was at most the target.
    TargetSe { max_se: f64, target: f64 },
    /// The top `top` players kept their order since the previous round.
    Settled { top: usize },
}

/// How a run with a stopping rule went.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stopped {
    /// The budget of the round the run ended with.
    pub budget: usize,
    /// Rounds run, out of `of_rounds`.
    pub rounds: usize,
    pub of_rounds: usize,
    /// `None` when the whole budget was spent without a rule holding.
    pub reason: Option<StopReason>,
}

impl Stopping {
    pub fn is_on(&self) -> bool {
        self.target_se.is_some() || self.settle_top > 0
    }

    /// Refuses rules that cannot work with `kind` or `players`, naming what can.
    pub fn check_settings(&self, kind: EstimatorKind) -> Result<(), String> {
        if let Some(se) = self.target_se {
            if !(se.is_finite() && se > 0.0) {
                return Err(format!(
                    "[explanation] `target_se` must be a positive number. Given: {se}"
                ));
            }
        }
        if !self.is_on() {
            return Ok(());
        }
        match kind {
            EstimatorKind::Exact | EstimatorKind::Loo => Err(format!(
                "[explanation] `target_se` and `settle_top` end a sampled run early; `{kind}` \
                 evaluates a fixed set of coalitions. Use them with `antithetic`, \
                 `permutation`, `kernel`, `msr` or (`settle_top` only) `lasso`"
            )),
            EstimatorKind::Lasso if self.target_se.is_some() => Err(
                "[explanation] `target_se` needs standard errors, which `lasso` does not give; \
                 use `settle_top` with it, or `estimator = \"kernel\"` or `\"antithetic\"`"
                    .into(),
            ),
            _ => Ok(()),
        }
    }

    /// The budgets of the rounds, growing to `budget`; without a rule, `budget` alone.
    pub fn rounds(&self, budget: usize) -> Vec<usize> {
        if !self.is_on() {
            return vec![budget];
        }
        let mut budgets: Vec<usize> = (0..ROUNDS)
            .rev()
            .map(|halvings| budget >> halvings)
            .filter(|&b| b >= 4)
            .collect();
        budgets.dedup();
        budgets
    }

    /// The rule that holds for `now`, given the previous round's explanation, if any.
    pub fn reason(&self, previous: Option<&Explanation>, now: &Explanation) -> Option<StopReason> {
        if let Some(target) = self.target_se {
            let max_se = now
                .attributions
                .iter()
                .map(|a| a.std_error.unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max);
            if max_se <= target {
                return Some(StopReason::TargetSe { max_se, target });
            }
        }
        let top = self.settle_top.min(now.attributions.len());
        if top > 0 && previous.is_some_and(|p| top_players(p, top) == top_players(now, top)) {
            return Some(StopReason::Settled { top });
        }
        None
    }
}

/// The players of ranks 1..=k, in rank order.
fn top_players(e: &Explanation, k: usize) -> Vec<usize> {
    let mut by_rank: Vec<(usize, usize)> = e
        .attributions
        .iter()
        .enumerate()
        .map(|(i, a)| (a.rank, i))
        .collect();
    by_rank.sort_unstable();
    by_rank.into_iter().take(k).map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::players::Player;
    use crate::Attribution;
    use lmhost_plugin_api::Role;

    fn explanation(values: &[f64], se: f64) -> Explanation {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[b].abs().total_cmp(&values[a].abs()));
        let attributions = values
            .iter()
            .enumerate()
            .map(|(i, &value)| Attribution {
                player: Player {
                    id: format!("p{i}"),
                    text: String::new(),
                    role: Role::User,
                    turn: 0,
                    message: 0,
                    span: 0..0,
                    piece: None,
                    call: None,
                },
                value,
                std_error: Some(se),
                rank: order.iter().position(|&j| j == i).unwrap() + 1,
            })
            .collect();
        Explanation {
            attributions,
            v_all: 0.0,
            v_none: 0.0,
            efficiency: None,
            trust: None,
            coalitions: 0,
            unique_prompts: 0,
            per_token: None,
            interactions: None,
        }
    }

    #[test]
    fn rounds_double_up_to_the_budget() {
        let rule = Stopping {
            settle_top: 1,
            ..Stopping::default()
        };
        assert_eq!(rule.rounds(1000), [125, 250, 500, 1000]);
        assert_eq!(rule.rounds(20), [5, 10, 20]);
        assert_eq!(rule.rounds(4), [4]);
        assert_eq!(Stopping::default().rounds(1000), [1000]);
    }

    #[test]
    fn top_k_settles_when_its_order_holds_between_rounds() {
        let rule = Stopping {
            settle_top: 2,
            ..Stopping::default()
        };
        let first = explanation(&[3.0, -5.0, 1.0, 0.5], 1.0);
        // Never on the first round: there is nothing to compare with.
        assert_eq!(rule.reason(None, &first), None);
        // Same top two (1 then 0), the tail reordered: settled.
        let same = explanation(&[2.9, -5.1, 0.4, 1.0], 1.0);
        assert_eq!(
            rule.reason(Some(&first), &same),
            Some(StopReason::Settled { top: 2 })
        );
        // The top two swap places: not settled.
        let swapped = explanation(&[5.2, -3.0, 1.0, 0.5], 1.0);
        assert_eq!(rule.reason(Some(&first), &swapped), None);
        // A k beyond the players compares them all.
        let all = Stopping {
            settle_top: 9,
            ..rule
        };
        assert_eq!(
            all.reason(Some(&first), &first),
            Some(StopReason::Settled { top: 4 })
        );
    }

    #[test]
    fn target_se_holds_once_every_error_is_small_enough() {
        let rule = Stopping {
            target_se: Some(0.1),
            ..Stopping::default()
        };
        assert_eq!(rule.reason(None, &explanation(&[1.0, 2.0], 0.2)), None);
        assert_eq!(
            rule.reason(None, &explanation(&[1.0, 2.0], 0.05)),
            Some(StopReason::TargetSe {
                max_se: 0.05,
                target: 0.1
            })
        );
        let mut none = explanation(&[1.0], 0.0);
        none.attributions[0].std_error = None;
        assert_eq!(rule.reason(None, &none), None);
    }

    #[test]
    fn rules_that_cannot_work_are_refused_by_name() {
        let se = Stopping {
            target_se: Some(0.1),
            ..Stopping::default()
        };
        assert!(se.check_settings(EstimatorKind::Kernel).is_ok());
        let err = se.check_settings(EstimatorKind::Exact).unwrap_err();
        assert!(err.contains("`exact` evaluates a fixed set"), "{err}");
        let err = se.check_settings(EstimatorKind::Lasso).unwrap_err();
        assert!(err.contains("`lasso` does not give"), "{err}");
        let settle = Stopping {
            settle_top: 3,
            ..Stopping::default()
        };
        assert!(settle.check_settings(EstimatorKind::Lasso).is_ok());
        let bad = Stopping {
            target_se: Some(-1.0),
            ..Stopping::default()
        };
        assert!(bad
            .check_settings(EstimatorKind::Kernel)
            .unwrap_err()
            .contains("positive"));
        assert!(Stopping::default()
            .check_settings(EstimatorKind::Exact)
            .is_ok());
    }
}
