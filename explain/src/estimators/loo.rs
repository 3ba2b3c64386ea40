//! Leave-one-out: a player's value is what the full coalition loses without it,
//! v(N) - v(N \ {i}). n + 1 evaluations and no sampling, so no standard errors. A baseline, not
//! a Shapley value: it sees a player only at the top of the lattice, so two players that can
//! stand in for each other both get zero (Ghorbani & Zou 2019, "Data Shapley", compare the two).
//! Exact for additive games, where every estimator agrees.

use super::{Coalition, Estimates, Interner};

/// The coalitions (empty, full, then full without each player) and, per player, the index of
/// the coalition without it.
pub(super) fn plan(n: usize) -> (Vec<Coalition>, Vec<usize>) {
    let mut interner = Interner::default();
    interner.add(Coalition::empty(n));
    interner.add(Coalition::full(n));
    let without = (0..n)
        .map(|i| interner.add(Coalition::from_members(n, (0..n).filter(|&j| j != i))))
        .collect();
    (interner.coalitions, without)
}

/// `full` indexes v(N) in `values`; `without[i]` indexes v(N \ {i}).
pub(super) fn estimate(full: usize, without: &[usize], values: &[f64]) -> Estimates {
    Estimates {
        interactions: None,
        values: without.iter().map(|&w| values[full] - values[w]).collect(),
        std_errors: None,
    }
}
