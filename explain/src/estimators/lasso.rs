//! A sparse linear surrogate fitted by the LASSO, after ContextCite (Cohen-Wang, Shah, Georgiev
//! & Madry 2024, "ContextCite: Attributing Model Generation to Context"; reference code:
//! github.com/MadryLab/context-cite, `context_cite/solver.py`).
//!
//! Plan: the empty and the full coalition, then `budget - 2` random ablations, each player kept
//! independently with probability 1/2. Every one of the `budget` samples (the empty and full
//! ones included, repeats counted) is a row of the regression v(S) ≈ β₀ + Σ_{i∈S} βᵢ; the βᵢ
//! are the attributions.
//!
//! Features are the plain 0/1 masks, as in ContextCite (with p = 1/2 every column has the same
//! variance in expectation, so standardising would change little and would put the penalty in
//! other units than the values). The intercept is not penalised (the features and v are
//! centred), and the objective is scikit-learn's: (1/2m) Σ (v - β₀ - zᵀβ)² + α Σ |βᵢ|, solved
//! by cyclic coordinate descent with warm starts along the path.
//!
//! Regularisation: ContextCite fixes α = 0.01 for logit-scale values; our values come in
//! several units (summed logprobs, cosines), so α is chosen by 5-fold cross-validation instead
//! (fold = row index mod 5; the rows are i.i.d. draws, so this is deterministic given the
//! seed). The path is 20 values from α_max (the smallest α that zeroes every weight) down to
//! α_max / 1000, geometrically. Each α offers two candidates, the LASSO weights and the relaxed
//! LASSO (Meinshausen 2007): ordinary least squares refitted on the LASSO's support, which
//! undoes the shrinkage. The candidate with the least held-out squared error wins, ties going to
//! the larger α (the sparser fit), and it is refitted on all rows. An additive game is thus
//! recovered exactly once the budget separates its players; a dense one usually keeps the
//! shrunken weights.
//!
//! With `interactions = "pairs"` the surrogate is second order, after ProxySPEX and SPEX (Kang,
//! Butler, Agarwal et al. 2025: an LLM's answer is a sparse, low-order function of its inputs):
//! v(S) ≈ β₀ + Σ_{i∈S} βᵢ + Σ_{i<j, both in S} βᵢⱼ, fitted the same way on the same uniform
//! ablations, with one more feature per pair. A quadratic game's Möbius transform is its
//! coefficients, so the βᵢⱼ are the pairs' Möbius, SII and k-SII values alike, and the
//! attributions are the surrogate's exact Shapley values, βᵢ + ½ Σⱼ βᵢⱼ. The LASSO finds the
//! few pairs that matter among n(n-1)/2 with far fewer evaluations than a dense regression
//! (FSII) would need (more unknowns than rows).
//!
//! No standard errors: bootstrapping the cross-validated fit would cost 5 × 20 fits per
//! replicate, and the bootstrap of the LASSO is inconsistent for the zero weights (Chatterjee &
//! Lahiri 2010), which are the point of a sparse surrogate.
//!
//! What it estimates: for an additive game, the weights, which are the Shapley and the Banzhaf
//! values alike. Otherwise the best sparse linear fit under uniform ablations; its unpenalised
//! limit is the Banzhaf value (Hammer & Holzman 1992), not the Shapley value. It is offered under
//! the Shapley estimand as a surrogate, like `loo` a baseline.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Coalition, Estimates, ExplainError, Interner};
use crate::interactions::{Interaction, InteractionValues};
use crate::settings::InteractionIndex;

/// Rows below which `lasso` refuses to plan: 5 folds need 3 held-out rows each.
pub(super) const MIN_BUDGET: usize = 16;
/// Folds of the cross-validation.
const FOLDS: usize = 5;
/// Values of α on the path, from α_max down to α_max × `PATH_SPAN`.
const PATH_LEN: usize = 20;
const PATH_SPAN: f64 = 1e-3;
/// Coordinate descent stops when no weight moves more than this (in units of the spread of v),
/// or after `MAX_SWEEPS` sweeps.
const TOLERANCE: f64 = 1e-10;
const MAX_SWEEPS: usize = 2000;

/// The most players a surrogate with pairs takes (64 sentences and a question fit): 80 players
/// have 3,160 pairs, and a fit holds three matrices of (80 + 3,160)² numbers, 84 MB each.
pub(super) const MAX_PAIR_PLAYERS: usize = 80;

/// A planned LASSO surrogate: the rows of the regression, as coalition indices with repeats,
/// and with pairs, the index their interactions are reported as.
#[derive(Debug, Clone)]
pub(super) struct Lasso {
    samples: Vec<usize>,
    pairs: Option<InteractionIndex>,
}

/// Refuses a surrogate with pairs over more than [`MAX_PAIR_PLAYERS`].
pub(super) fn check_pairs(n: usize) -> Result<(), ExplainError> {
    if n <= MAX_PAIR_PLAYERS {
        return Ok(());
    }
    Err(ExplainError::Estimator(format!(
        "`interactions = \"pairs\"` with `lasso` fits a weight per pair: {} pairs of {n} \
         players, more than the {MAX_PAIR_PLAYERS} players it takes; use `players = \"auto\"` \
         (refine the strongest parts first) or fewer players",
        n * (n - 1) / 2
    )))
}

/// The coalitions are the same with or without pairs, so a run of either reanalyzes as the other.
pub(super) fn plan(
    n: usize,
    budget: usize,
    pairs: Option<InteractionIndex>,
    rng: &mut ChaCha8Rng,
) -> Result<(Vec<Coalition>, Lasso), ExplainError> {
    if budget < MIN_BUDGET {
        let more = MIN_BUDGET.max(64);
        return Err(ExplainError::Estimator(format!(
            "`lasso` needs at least {MIN_BUDGET} coalition evaluations to fit and \
             cross-validate its surrogate (budget = {budget}); raise `budget`, e.g. \
             `budget = {more}` (--budget {more})"
        )));
    }
    let mut interner = Interner::default();
    let mut samples = vec![
        interner.add(Coalition::empty(n)),
        interner.add(Coalition::full(n)),
    ];
    for _ in 2..budget {
        let members: Vec<usize> = (0..n).filter(|_| rng.random_bool(0.5)).collect();
        samples.push(interner.add(Coalition::from_members(n, members)));
    }
    Ok((interner.coalitions, Lasso { samples, pairs }))
}

impl Lasso {
    /// `values` per coalition of the plan.
    pub(super) fn estimate(&self, coalitions: &[Coalition], values: &[f64]) -> Estimates {
        let n = coalitions[0].n();
        let rows = self.samples.iter().map(|&s| coalitions[s].members());
        let y: Vec<f64> = self.samples.iter().map(|&s| values[s]).collect();
        let Some(index) = self.pairs else {
            let rows: Vec<Vec<usize>> = rows.map(Iterator::collect).collect();
            return Estimates {
                interactions: None,
                values: cross_validated_fit(n, &rows, &y, Path::Whole),
                std_errors: None,
            };
        };
        let rows: Vec<Vec<usize>> = rows.map(|members| with_pairs(n, members)).collect();
        let beta = cross_validated_fit(n + n * (n - 1) / 2, &rows, &y, Path::HalfTheRows);
        let (singles, pairs) = beta.split_at(n);
        let mut shapley = singles.to_vec();
        let mut listed: Vec<Interaction> = Vec::with_capacity(beta.len());
        for ((i, j), &weight) in pair_list(n).zip(pairs) {
            shapley[i] += weight / 2.0;
            shapley[j] += weight / 2.0;
            listed.push(Interaction::new(vec![i, j], weight));
        }
        // A player's own value: its SII is its Shapley value; its k-SII and Möbius, βᵢ.
        let own = if index == InteractionIndex::Sii {
            &shapley
        } else {
            singles
        };
        let players = own
            .iter()
            .enumerate()
            .map(|(i, &v)| Interaction::new(vec![i], v));
        listed.splice(0..0, players);
        Estimates {
            interactions: Some(InteractionValues {
                index,
                order: 2,
                values: listed,
            }),
            values: shapley,
            std_errors: None,
        }
    }
}

/// The pairs (i < j) in lexicographic order: feature n + k is the k-th.
fn pair_list(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n).flat_map(move |i| (i + 1..n).map(move |j| (i, j)))
}

/// A row's features with pairs: its players, then each pair of them as feature n + k.
fn with_pairs(n: usize, members: impl Iterator<Item = usize>) -> Vec<usize> {
    let members: Vec<usize> = members.collect();
    let mut features = members.clone();
    for (a, &i) in members.iter().enumerate() {
        // Pairs (i, j) come after every pair of a smaller first player: i(2n - i - 1)/2 of them.
        let before = i * (2 * n - i - 1) / 2;
        features.extend(members[a + 1..].iter().map(|&j| n + before + (j - i - 1)));
    }
    features
}

/// The LASSO weights or their refit on the support.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Lasso,
    Refit,
}

/// How far along the path a fit goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    /// To α_max × `PATH_SPAN`.
    Whole,
    /// Until the support holds more than half the training rows. With more features than
    /// rows (pairs), the fit past that point interpolates its training folds, so it cannot win
    /// the cross-validation, and coordinate descent slows to its sweep limit there.
    HalfTheRows,
}

/// Chooses α and the variant by `FOLDS`-fold cross-validation, then fits them on all rows.
/// `rows[r]` holds the features (players) present in row r.
fn cross_validated_fit(n: usize, rows: &[Vec<usize>], y: &[f64], extent: Path) -> Vec<f64> {
    let all: Vec<usize> = (0..y.len()).collect();
    let counts = Counts::of(n, rows, &all);
    let full = Centred::new(rows, y, &all, counts.clone());
    let alpha_max = full.alpha_max();
    if !alpha_max.is_finite() {
        return vec![f64::NAN; n];
    }
    if alpha_max <= 0.0 {
        // v is constant on the rows: no player moves it.
        return vec![0.0; n];
    }
    let path: Vec<f64> = (0..PATH_LEN)
        .map(|k| alpha_max * PATH_SPAN.powf(k as f64 / (PATH_LEN - 1) as f64))
        .collect();
    // Held-out squared error per α and variant, summed over the folds; infinite past the
    // path's end in any fold.
    let mut errors = vec![[0.0; 2]; PATH_LEN];
    for fold in 0..FOLDS {
        let (test, train): (Vec<usize>, Vec<usize>) = all.iter().partition(|&&r| r % FOLDS == fold);
        let data = Centred::new(rows, y, &train, counts.without(rows, &test));
        let mut beta = vec![0.0; n];
        let mut refit = Refit::default();
        for (k, &alpha) in path.iter().enumerate() {
            data.descend(alpha, &mut beta);
            let support = beta.iter().filter(|&&b| b != 0.0).count();
            if extent == Path::HalfTheRows && support as f64 > data.rows / 2.0 {
                for error in &mut errors[k..] {
                    *error = [f64::INFINITY; 2];
                }
                break;
            }
            let refitted = refit.of(&data, &beta);
            for (variant, weights) in [(Variant::Lasso, &beta), (Variant::Refit, refitted)] {
                errors[k][variant as usize] += test
                    .iter()
                    .map(|&r| (y[r] - data.predict(&rows[r], weights)).powi(2))
                    .sum::<f64>();
            }
        }
    }
    let best = errors
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let slack = 1e-12 * full.total_square + f64::MIN_POSITIVE;
    let (k, variant) = (0..PATH_LEN)
        .flat_map(|k| [(k, Variant::Lasso), (k, Variant::Refit)])
        .find(|&(k, v)| errors[k][v as usize] <= best + slack)
        .unwrap_or((PATH_LEN - 1, Variant::Lasso));
    let mut beta = vec![0.0; n];
    for &alpha in &path[..=k] {
        full.descend(alpha, &mut beta);
    }
    match variant {
        Variant::Lasso => beta,
        Variant::Refit => Refit::default().of(&full, &beta).clone(),
    }
}

/// How many of a set of rows hold each pair of features, an exact integer:
/// `counts[i * p + j]` for i ≤ j (the upper triangle). The folds' counts are the whole's less
/// their held-out rows', which costs a fifth of counting their training rows.
#[derive(Clone)]
struct Counts {
    p: usize,
    counts: Vec<f64>,
}

impl Counts {
    /// `rows[r]` lists row r's features in ascending order.
    fn of(p: usize, rows: &[Vec<usize>], chosen: &[usize]) -> Counts {
        let mut counts = Counts {
            p,
            counts: vec![0.0; p * p],
        };
        counts.add(rows, chosen, 1.0);
        counts
    }

    /// These counts without `chosen`'s rows, which they include.
    fn without(&self, rows: &[Vec<usize>], chosen: &[usize]) -> Counts {
        let mut counts = self.clone();
        counts.add(rows, chosen, -1.0);
        counts
    }

    fn add(&mut self, rows: &[Vec<usize>], chosen: &[usize], sign: f64) {
        for &r in chosen {
            let features = &rows[r];
            debug_assert!(features.windows(2).all(|w| w[0] < w[1]));
            for (a, &i) in features.iter().enumerate() {
                let row = &mut self.counts[i * self.p..(i + 1) * self.p];
                for &j in &features[a..] {
                    row[j] += sign;
                }
            }
        }
    }

    fn get(&self, i: usize, j: usize) -> f64 {
        self.counts[i.min(j) * self.p + i.max(j)]
    }
}

/// The sufficient statistics of a set of training rows, centred (which leaves the intercept
/// unpenalised): the Gram matrix XᵀX (`gram[i * p + j]`) and Xᵀy of the centred features and
/// values.
struct Centred {
    rows: f64,
    p: usize,
    gram: Vec<f64>,
    xty: Vec<f64>,
    total_square: f64,
    feature_means: Vec<f64>,
    y_mean: f64,
}

impl Centred {
    /// `counts` are those of the `chosen` rows.
    fn new(rows: &[Vec<usize>], y: &[f64], chosen: &[usize], counts: Counts) -> Centred {
        let p = counts.p;
        let m = chosen.len() as f64;
        let y_mean = chosen.iter().map(|&r| y[r]).sum::<f64>() / m;
        // Σ z (y - ȳ), and the counts centred: Σ (z_i - μ_i)(z_j - μ_j) = C_ij - m μ_i μ_j.
        let mut xty = vec![0.0; p];
        for &r in chosen {
            for &i in &rows[r] {
                xty[i] += y[r] - y_mean;
            }
        }
        let feature_means: Vec<f64> = (0..p).map(|i| counts.get(i, i) / m).collect();
        let mut gram = counts.counts;
        for i in 0..p {
            for j in 0..p {
                gram[i * p + j] = gram[i.min(j) * p + i.max(j)];
            }
        }
        for (i, row) in gram.chunks_exact_mut(p.max(1)).enumerate() {
            for (j, g) in row.iter_mut().enumerate() {
                *g -= m * feature_means[i] * feature_means[j];
            }
        }
        Centred {
            rows: m,
            p,
            gram,
            xty,
            total_square: chosen.iter().map(|&r| (y[r] - y_mean).powi(2)).sum(),
            feature_means,
            y_mean,
        }
    }

    /// Row j of the Gram matrix.
    fn gram_row(&self, j: usize) -> &[f64] {
        &self.gram[j * self.p..(j + 1) * self.p]
    }

    /// The smallest α at which every weight is zero: max_j |⟨x_j, y⟩| / m.
    fn alpha_max(&self) -> f64 {
        self.xty
            .iter()
            .map(|c| c.abs() / self.rows)
            .fold(0.0, f64::max)
    }

    /// Cyclic coordinate descent on (1/2m)‖y - Xβ‖² + α‖β‖₁ from the warm start `beta`, in
    /// covariance form: it keeps Xᵀr, so a weight that stays zero costs nothing.
    fn descend(&self, alpha: f64, beta: &mut [f64]) {
        let m = self.rows;
        let mut correlation = self.xty.clone();
        for (j, &b) in beta.iter().enumerate() {
            if b != 0.0 {
                axpy(-b, self.gram_row(j), &mut correlation);
            }
        }
        let scale = (self.total_square / m).sqrt().max(f64::MIN_POSITIVE);
        for _ in 0..MAX_SWEEPS {
            let mut moved: f64 = 0.0;
            for j in 0..beta.len() {
                let norm = self.gram[j * self.p + j] / m;
                if norm <= 0.0 {
                    beta[j] = 0.0;
                    continue;
                }
                let rho = correlation[j] / m + norm * beta[j];
                let delta = soft_threshold(rho, alpha) / norm - beta[j];
                if delta != 0.0 {
                    axpy(-delta, self.gram_row(j), &mut correlation);
                    beta[j] += delta;
                    moved = moved.max(delta.abs() * norm.sqrt());
                }
            }
            if moved <= TOLERANCE * scale {
                break;
            }
        }
    }

    /// β₀ + zᵀβ for the row with `members` present, with β₀ = ȳ - μᵀβ.
    fn predict(&self, members: &[usize], beta: &[f64]) -> f64 {
        let offset: f64 = self
            .feature_means
            .iter()
            .zip(beta)
            .map(|(u, b)| u * b)
            .sum();
        self.y_mean - offset + members.iter().map(|&i| beta[i]).sum::<f64>()
    }
}

/// Ordinary least squares on the support of the LASSO weights, remembered for the last support
/// (consecutive α often share one; solving is O(|support|³)).
#[derive(Default)]
struct Refit {
    support: Option<Vec<usize>>,
    weights: Vec<f64>,
}

impl Refit {
    /// The refit on the support of `beta`; `beta` itself where that least squares is singular
    /// (a support of m - 1 or more rows' worth of players always is).
    fn of(&mut self, data: &Centred, beta: &[f64]) -> &Vec<f64> {
        let support: Vec<usize> = (0..beta.len()).filter(|&j| beta[j] != 0.0).collect();
        if self.support.as_ref() != Some(&support) {
            let gram: Vec<Vec<f64>> = support
                .iter()
                .map(|&i| support.iter().map(|&j| data.gram[i * data.p + j]).collect())
                .collect();
            let rhs: Vec<f64> = support.iter().map(|&j| data.xty[j]).collect();
            let solution = if (support.len() as f64) < data.rows - 1.0 {
                cholesky_solve(&gram, &rhs)
            } else {
                None
            };
            match solution {
                Some(solution) => {
                    self.weights = vec![0.0; beta.len()];
                    for (&j, s) in support.iter().zip(solution) {
                        self.weights[j] = s;
                    }
                    self.support = Some(support);
                }
                None => {
                    // Not remembered: the LASSO weights change along the path.
                    self.weights = beta.to_vec();
                    self.support = None;
                }
            }
        }
        &self.weights
    }
}

fn soft_threshold(x: f64, alpha: f64) -> f64 {
    x.signum() * (x.abs() - alpha).max(0.0)
}

/// y += a x.
fn axpy(a: f64, x: &[f64], y: &mut [f64]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// Solves A x = b for symmetric positive definite A by its Cholesky factor; `None` when A is
/// singular to working precision.
fn cholesky_solve(a: &[Vec<f64>], b: &[f64]) -> Option<Vec<f64>> {
    let n = a.len();
    let l = super::linalg::cholesky(a)?;
    // L w = b, then Lᵀ x = w.
    let mut w = vec![0.0; n];
    for i in 0..n {
        w[i] = (b[i] - (0..i).map(|k| l[i][k] * w[k]).sum::<f64>()) / l[i][i];
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        x[i] = (w[i] - (i + 1..n).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_pair_features_follow_the_pair_list() {
        let n = 6;
        let pairs: Vec<(usize, usize)> = pair_list(n).collect();
        assert_eq!(pairs.len(), 15);
        let features = with_pairs(n, [0, 2, 3, 5].into_iter());
        let (players, pair_features) = features.split_at(4);
        assert_eq!(players, [0, 2, 3, 5]);
        let named: Vec<(usize, usize)> = pair_features.iter().map(|&f| pairs[f - n]).collect();
        assert_eq!(named, [(0, 2), (0, 3), (0, 5), (2, 3), (2, 5), (3, 5)]);
    }
}
