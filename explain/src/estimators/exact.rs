//! Exact Shapley and Banzhaf values from all 2^n coalition values.

use super::{Coalition, Estimates, ExplainError};
use crate::settings::Estimand;

/// Exact enumeration stops here whatever the configured limit: 2^30 values do not fit.
const HARD_LIMIT: usize = 30;

pub(super) fn plan(n: usize, max_players: usize) -> Result<Vec<Coalition>, ExplainError> {
    if n > max_players.min(HARD_LIMIT) {
        return Err(ExplainError::Estimator(format!(
            "`exact` over {n} players needs 2^{n} coalitions, more than max_exact_players = \
             {max_players} allows{}; use a sampling estimator: `estimator = \"antithetic\"` \
             (or \"permutation\"; \"msr\" for banzhaf) with a `budget` of evaluations \
             (--estimator antithetic --budget 2000), or fewer players",
            if max_players > HARD_LIMIT {
                format!(" (exact is capped at {HARD_LIMIT})")
            } else {
                String::new()
            }
        )));
    }
    Ok((0..1u64 << n)
        .map(|mask| Coalition::from_mask(n, mask))
        .collect())
}

/// `values[mask]` is v of the coalition whose members are the set bits of `mask`.
pub(super) fn estimate(n: usize, estimand: Estimand, values: &[f64]) -> Estimates {
    // Shapley weight of a coalition of size s not containing i: s!(n-s-1)!/n! = 1/(n C(n-1,s)).
    let weights: Vec<f64> = (0..n)
        .map(|s| match estimand {
            Estimand::Shapley => 1.0 / (n as f64 * binomial(n - 1, s)),
            Estimand::Banzhaf => 1.0 / 2f64.powi(n as i32 - 1),
        })
        .collect();
    let mut phi = vec![0.0; n];
    for (i, slot) in phi.iter_mut().enumerate() {
        let bit = 1usize << i;
        let mut sum = 0.0;
        for mask in (0..values.len()).filter(|m| m & bit == 0) {
            let size = mask.count_ones() as usize;
            sum += weights[size] * (values[mask | bit] - values[mask]);
        }
        *slot = sum;
    }
    Estimates {
        interactions: None,
        values: phi,
        std_errors: None,
    }
}

fn binomial(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |acc, j| acc * (n - j) as f64 / (j + 1) as f64)
}
