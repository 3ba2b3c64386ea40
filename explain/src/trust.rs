//! How far to trust a sampled explanation: a few random coalitions the estimator did not ask
//! for are evaluated with the rest, and the attribution predicts each through the additive
//! surrogate v̂(S) = v(∅) + Σ_{i∈S} φᵢ. The Spearman rank correlation of v̂ against v is the
//! linear datamodeling score (Ilyas et al. 2022, "Datamodels"; Park et al. 2023, "TRAK"),
//! reported with R² = 1 − SS_res / SS_tot. With pairs (`lasso` with `interactions = "pairs"`)
//! the prediction adds each present pair's value: the second-order surrogate's own fit.
//!
//! An additive game is predicted exactly (both figures 1); a game with strong interactions
//! (such as v(S) = 1 when |S| is even) is not, whatever the estimator.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::coalition::Coalition;
use super::estimators::Estimates;

/// The ChaCha stream held-out coalitions are drawn from: the estimators draw from stream 0 of
/// the same seed, so the two never share random numbers.
const HOLDOUT_STREAM: u64 = 1;

/// Fewer held-out values than this give no figures.
pub const MIN_HOLDOUT: usize = 3;

/// `count` random coalitions of `n` players, each player present with probability 1/2, drawn
/// from `seed` on a stream of its own. Repeats are kept: they are draws from the uniform
/// distribution over coalitions, and the schedule evaluates a repeated prompt once.
pub fn draw(n: usize, count: usize, seed: u64) -> Vec<Coalition> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(HOLDOUT_STREAM);
    (0..count)
        .map(|_| {
            let members: Vec<usize> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
            Coalition::from_members(n, members)
        })
        .collect()
}

/// How well an attribution predicts held-out coalition values.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trust {
    /// Held-out coalitions drawn (repeats included).
    pub holdout: usize,
    /// Spearman rank correlation of predicted vs actual values (the linear datamodeling
    /// score); `None` when undefined, with `note` saying why.
    pub spearman: Option<f64>,
    /// 1 − SS_res / SS_tot of predicted vs actual values; `None` when undefined.
    pub r_squared: Option<f64>,
    /// Why a figure is missing; `None` when both are present.
    pub note: Option<&'static str>,
}

impl Trust {
    /// Scores `estimates` on `coalitions` (whose values are `values`), given v(∅) = `v_none`:
    /// each predicted by the additive surrogate, or with pairs by the second-order one (see
    /// [`crate::interactions::InteractionValues::gain`]).
    pub fn assess(
        estimates: &Estimates,
        v_none: f64,
        coalitions: &[Coalition],
        values: &[f64],
    ) -> Trust {
        assert_eq!(coalitions.len(), values.len(), "one value per coalition");
        let additive = |c: &Coalition| c.members().map(|i| estimates.values[i]).sum::<f64>();
        let gain = |c: &Coalition| {
            let pairs = estimates.interactions.as_ref();
            pairs.and_then(|i| i.gain(c)).unwrap_or_else(|| additive(c))
        };
        let predicted: Vec<f64> = coalitions.iter().map(|c| v_none + gain(c)).collect();
        Trust::of(&predicted, values)
    }

    /// Compares `predicted` with `actual`, pairwise.
    pub fn of(predicted: &[f64], actual: &[f64]) -> Trust {
        let holdout = actual.len();
        let none = |note| Trust {
            holdout,
            spearman: None,
            r_squared: None,
            note: Some(note),
        };
        if holdout < MIN_HOLDOUT {
            return none("fewer than 3 held-out coalitions");
        }
        // "Equal" as ranks see it: within rounding of each other.
        let actual_ranks = average_ranks(actual);
        if variance(&actual_ranks) == 0.0 {
            return none("the held-out values are all equal");
        }
        let r_squared = Some(r_squared(predicted, actual));
        let predicted_ranks = average_ranks(predicted);
        if variance(&predicted_ranks) == 0.0 {
            return Trust {
                holdout,
                spearman: None,
                r_squared,
                note: Some("the predictions are all equal"),
            };
        }
        Trust {
            holdout,
            spearman: Some(pearson(&predicted_ranks, &actual_ranks)),
            r_squared,
            note: None,
        }
    }
}

/// Sum of squared deviations from the mean.
fn variance(xs: &[f64]) -> f64 {
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    xs.iter().map(|x| (x - mean).powi(2)).sum()
}

/// 1 − SS_res / SS_tot; `actual` must not be constant.
pub fn r_squared(predicted: &[f64], actual: &[f64]) -> f64 {
    let ss_res: f64 = predicted
        .iter()
        .zip(actual)
        .map(|(p, a)| (a - p).powi(2))
        .sum();
    1.0 - ss_res / variance(actual)
}

/// Spearman's rank correlation: Pearson's over ranks, ties taking their average rank.
/// Neither side may be constant.
pub fn spearman(xs: &[f64], ys: &[f64]) -> f64 {
    pearson(&average_ranks(xs), &average_ranks(ys))
}

fn pearson(xs: &[f64], ys: &[f64]) -> f64 {
    let m = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / m, ys.iter().sum::<f64>() / m);
    let cov: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    (cov / (variance(xs) * variance(ys)).sqrt()).clamp(-1.0, 1.0)
}

/// Values closer than this, relative to the largest |value|, tie: a sum of estimated
/// attributions misses an exact tie (a player that changes nothing) by rounding alone.
const TIE_TOLERANCE: f64 = 1e-9;

/// Ranks from 1; equal values (within `TIE_TOLERANCE` of the first of their run) share the
/// mean of the ranks they span.
pub fn average_ranks(xs: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..xs.len()).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let tolerance = TIE_TOLERANCE * xs.iter().fold(1.0, |m: f64, x| m.max(x.abs()));
    let mut ranks = vec![0.0; xs.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && xs[order[end]] - xs[order[start]] <= tolerance {
            end += 1;
        }
        // Positions start..end hold ranks start+1..=end; their mean is (start + 1 + end) / 2.
        let rank = (start + 1 + end) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EstimatorKind, EstimatorSettings, Plan};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn ties_take_their_average_rank() {
        assert_eq!(
            average_ranks(&[10.0, 20.0, 10.0, 5.0]),
            [2.5, 4.0, 2.5, 1.0]
        );
        assert_eq!(average_ranks(&[1.0, 1.0, 1.0]), [2.0, 2.0, 2.0]);
        // A miss by rounding is a tie.
        assert_eq!(average_ranks(&[0.3, 0.1 + 0.2, 0.0]), [2.5, 2.5, 1.0]);
    }

    #[test]
    fn spearman_and_r_squared_match_hand_computed_values() {
        // Ranks 1,2,3,4,5 against 2,1,4,3,5: Σd² = 4, ρ = 1 − 6·4 / (5·24) = 0.8.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        let y = [20.0, 10.0, 40.0, 30.0, 50.0];
        assert!(close(spearman(&x, &y), 0.8));
        // With a tie: x ranks 1.5, 1.5, 3, 4 and y ranks 1, 2, 3, 4, both with mean 2.5.
        // Deviations -1, -1, 0.5, 1.5 and -1.5, -0.5, 0.5, 1.5: cov = 1.5 + 0.5 + 0.25 + 2.25
        // = 4.5, Sxx = 4.5, Syy = 5, ρ = 4.5 / √22.5.
        let x = [1.0, 1.0, 2.0, 3.0];
        let y = [1.0, 2.0, 3.0, 4.0];
        assert!(close(spearman(&x, &y), 4.5 / (4.5f64 * 5.0).sqrt()));
        // R²: actual 1,2,3,4 (SS_tot = 5), predicted 1,2,3,5 (SS_res = 1): 0.8.
        assert!(close(r_squared(&[1.0, 2.0, 3.0, 5.0], &y), 0.8));
        // Predicting the mean everywhere gives 0; anti-correlated predictions go negative.
        assert!(close(r_squared(&[2.5; 4], &y), 0.0));
        assert!(r_squared(&[4.0, 3.0, 2.0, 1.0], &y) < 0.0);
        assert!(close(spearman(&[4.0, 3.0, 2.0, 1.0], &y), -1.0));
    }

    #[test]
    fn undefined_figures_are_none_with_a_reason() {
        let t = Trust::of(&[1.0, 2.0], &[1.0, 2.0]);
        assert_eq!((t.holdout, t.spearman, t.r_squared), (2, None, None));
        assert!(t.note.unwrap().contains("fewer than 3"));
        let t = Trust::of(&[1.0, 2.0, 3.0], &[5.0; 3]);
        assert_eq!((t.spearman, t.r_squared), (None, None));
        assert!(t.note.unwrap().contains("values are all equal"));
        let t = Trust::of(&[0.0; 3], &[1.0, 2.0, 3.0]);
        // SS_tot = 2, SS_res = 1 + 4 + 9 = 14: R² = 1 − 7.
        assert_eq!((t.spearman, t.r_squared), (None, Some(-6.0)));
        assert!(t.note.unwrap().contains("predictions are all equal"));
        let t = Trust::of(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0]);
        assert_eq!((t.spearman, t.note), (Some(1.0), None));
    }

    #[test]
    fn draws_are_seeded_and_hold_each_player_half_the_time() {
        let a = draw(10, 400, 7);
        assert_eq!(a, draw(10, 400, 7));
        assert_ne!(a, draw(10, 400, 8));
        let mean = a.iter().map(Coalition::len).sum::<usize>() as f64 / a.len() as f64;
        assert!((mean - 5.0).abs() < 0.3, "{mean}");
    }

    /// Plans `kind` over `n` players, evaluates `game` on its coalitions and on 64 held-out
    /// ones, and assesses the estimate.
    fn trust_of(kind: EstimatorKind, n: usize, game: impl Fn(&Coalition) -> f64) -> Trust {
        let settings = EstimatorSettings {
            kind,
            budget: 400,
            seed: 5,
            ..EstimatorSettings::default()
        };
        trust_with(&settings, n, game)
    }

    fn trust_with(
        settings: &EstimatorSettings,
        n: usize,
        game: impl Fn(&Coalition) -> f64,
    ) -> Trust {
        let plan = Plan::new(n, settings).unwrap();
        let values: Vec<f64> = plan.coalitions().iter().map(&game).collect();
        let estimates = plan.estimate(&values);
        let holdout = draw(n, 64, settings.seed);
        let held: Vec<f64> = holdout.iter().map(&game).collect();
        Trust::assess(&estimates, values[plan.empty_index()], &holdout, &held)
    }

    #[test]
    fn a_pair_is_predicted_by_the_surrogate_with_pairs_and_missed_without() {
        // 12 players: additive weights, and one pair worth 4 only together.
        let game = |c: &Coalition| {
            let own: f64 = c.members().map(|i| (i % 3) as f64 - 1.0).sum();
            own + if c.contains(2) && c.contains(9) {
                4.0
            } else {
                0.0
            }
        };
        let lasso = EstimatorSettings {
            kind: EstimatorKind::Lasso,
            budget: 400,
            seed: 5,
            ..EstimatorSettings::default()
        };
        let additive = trust_with(&lasso, 12, game);
        let pairs = EstimatorSettings {
            interactions: crate::settings::Interactions::Pairs,
            ..lasso
        };
        let second_order = trust_with(&pairs, 12, game);
        assert!(second_order.r_squared.unwrap() > 0.999, "{second_order:?}");
        assert!(additive.r_squared.unwrap() < 0.9, "{additive:?}");
    }

    #[test]
    fn an_additive_game_is_predicted_exactly() {
        let weights = [3.0, -1.0, 0.5, 2.0, 0.0, -2.5, 1.25, 4.0];
        let game = |c: &Coalition| 0.7 + c.members().map(|i| weights[i]).sum::<f64>();
        for kind in [
            EstimatorKind::Exact,
            EstimatorKind::Permutation,
            EstimatorKind::Antithetic,
            EstimatorKind::Kernel,
            EstimatorKind::Loo,
        ] {
            let t = trust_of(kind, weights.len(), game);
            assert!(close(t.spearman.unwrap(), 1.0), "{kind}: {t:?}");
            assert!(close(t.r_squared.unwrap(), 1.0), "{kind}: {t:?}");
        }
    }

    #[test]
    fn a_parity_game_defeats_the_additive_surrogate() {
        let parity = |c: &Coalition| if c.len().is_multiple_of(2) { 1.0 } else { 0.0 };
        for kind in [EstimatorKind::Antithetic, EstimatorKind::Kernel] {
            let t = trust_of(kind, 8, parity);
            assert!(t.r_squared.unwrap() < 0.2, "{kind}: {t:?}");
            assert!(t.spearman.is_none_or(|s| s.abs() < 0.4), "{kind}: {t:?}");
        }
    }
}
