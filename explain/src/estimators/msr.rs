//! Banzhaf values by maximum sample reuse (Wang & Jia 2023, "Data Banzhaf"): sample coalitions
//! uniformly (each player present with probability 1/2); a player's value is the mean value of
//! the samples holding it minus the mean of those without it. Every sample informs every
//! player, so n players cost no more than one.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{mean_and_se, Coalition, Estimates, Interner};

pub(super) fn plan(n: usize, budget: usize, rng: &mut ChaCha8Rng) -> (Vec<Coalition>, Vec<usize>) {
    let mut interner = Interner::default();
    interner.add(Coalition::empty(n));
    interner.add(Coalition::full(n));
    let samples = (0..budget.saturating_sub(2).max(4))
        .map(|_| {
            let members: Vec<usize> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
            interner.add(Coalition::from_members(n, members))
        })
        .collect();
    (interner.coalitions, samples)
}

pub(super) fn estimate(coalitions: &[Coalition], samples: &[usize], values: &[f64]) -> Estimates {
    let n = coalitions[0].n();
    let (values, std_errors) = (0..n)
        .map(|i| {
            let (inside, outside): (Vec<usize>, Vec<usize>) =
                samples.iter().partition(|&&s| coalitions[s].contains(i));
            let (m_in, se_in) = mean_and_se(&inside.iter().map(|&s| values[s]).collect::<Vec<_>>());
            let (m_out, se_out) =
                mean_and_se(&outside.iter().map(|&s| values[s]).collect::<Vec<_>>());
            (m_in - m_out, (se_in.powi(2) + se_out.powi(2)).sqrt())
        })
        .unzip();
    Estimates {
        interactions: None,
        values,
        std_errors: Some(std_errors),
    }
}
