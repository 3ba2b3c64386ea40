//! What `lasso` with `interactions = "pairs"` costs and recovers on a planted game: players
//! with additive weights and one pair worth 3 only together, with or without uniform noise of
//! ±0.25 on every value (the figures in docs/explain.md, "Many players: lasso with pairs").
//! Per row: the fit's wall time (one fit, as `Plan::estimate` runs it: five folds along the
//! path, then the whole), the strongest pair found and its value.
//!
//! Prints figures; asserts nothing. `cargo run --release --example bench_pairs -p
//! lmhost-explain`.

use std::time::Instant;

use lmhost_explain::{Coalition, Estimand, EstimatorKind, EstimatorSettings, Interactions, Plan};

/// The planted pair and its worth.
const PAIR: (usize, usize) = (5, 20);
const WORTH: f64 = 3.0;

/// v(S): each present player's weight, the pair's worth when both are present, and with
/// `noise`, a deterministic pseudo-random term in [-0.25, 0.25] per coalition.
fn game(c: &Coalition, noise: bool) -> f64 {
    let members: Vec<usize> = c.members().collect();
    let own: f64 = members
        .iter()
        .map(|&i| ((i * 7) % 5) as f64 * 0.2 - 0.3)
        .sum();
    let pair = if c.contains(PAIR.0) && c.contains(PAIR.1) {
        WORTH
    } else {
        0.0
    };
    let hash = members.iter().fold(0u64, |h, &i| {
        h ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    let jitter = ((hash >> 40) as f64 / (1u64 << 24) as f64 - 0.5) * 0.5;
    own + pair + if noise { jitter } else { 0.0 }
}

fn main() {
    println!("players budget noise   fit s  strongest pair  value (planted {WORTH})");
    for (n, budget) in [(32, 256), (32, 512), (64, 512), (64, 1024)] {
        for noise in [false, true] {
            let settings = EstimatorSettings {
                kind: EstimatorKind::Lasso,
                estimand: Estimand::Shapley,
                budget,
                seed: 3,
                interactions: Interactions::Pairs,
                ..EstimatorSettings::default()
            };
            let plan = match Plan::new(n, &settings) {
                Ok(plan) => plan,
                Err(e) => {
                    println!("{n:>7} {budget:>6}: {e}");
                    continue;
                }
            };
            let values: Vec<f64> = plan.coalitions().iter().map(|c| game(c, noise)).collect();
            let started = Instant::now();
            let estimates = plan.estimate(&values);
            let seconds = started.elapsed().as_secs_f64();
            let strongest = estimates.interactions.as_ref().and_then(|i| {
                i.strongest()
                    .first()
                    .map(|top| (top.players.clone(), top.value))
            });
            let (players, value) = strongest.unwrap_or_default();
            println!(
                "{n:>7} {budget:>6} {:<5} {seconds:>7.3}  {:<14}  {value:.3}",
                if noise { "±0.25" } else { "none" },
                format!("{players:?}"),
            );
        }
    }
}
