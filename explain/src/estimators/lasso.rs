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

/// A planned LASSO surrogate: the rows of the regression, as coalition indices with repeats.
#[derive(Debug, Clone)]
pub(super) struct Lasso {
    samples: Vec<usize>,
}

pub(super) fn plan(
    n: usize,
    budget: usize,
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
    Ok((interner.coalitions, Lasso { samples }))
}

impl Lasso {
    /// `values` per coalition of the plan.
    pub(super) fn estimate(&self, coalitions: &[Coalition], values: &[f64]) -> Estimates {
        let rows: Vec<Vec<usize>> = self
            .samples
            .iter()
            .map(|&s| coalitions[s].members().collect())
            .collect();
        let y: Vec<f64> = self.samples.iter().map(|&s| values[s]).collect();
        Estimates {
            values: cross_validated_fit(coalitions[0].n(), &rows, &y),
            std_errors: None,
        }
    }
}

/// The LASSO weights or their refit on the support.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Lasso,
    Refit,
}

/// Chooses α and the variant by `FOLDS`-fold cross-validation, then fits them on all rows.
/// `rows[r]` holds the players present in row r.
fn cross_validated_fit(n: usize, rows: &[Vec<usize>], y: &[f64]) -> Vec<f64> {
    let all: Vec<usize> = (0..y.len()).collect();
    let full = Centred::new(n, rows, y, &all);
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
    // Held-out squared error per α and variant, summed over the folds.
    let mut errors = vec![[0.0; 2]; PATH_LEN];
    for fold in 0..FOLDS {
        let (test, train): (Vec<usize>, Vec<usize>) = all.iter().partition(|&&r| r % FOLDS == fold);
        let data = Centred::new(n, rows, y, &train);
        let mut beta = vec![0.0; n];
        let mut refit = Refit::default();
        for (k, &alpha) in path.iter().enumerate() {
            data.descend(alpha, &mut beta);
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

/// The sufficient statistics of a set of training rows, centred (which leaves the intercept
/// unpenalised): the Gram matrix XᵀX and Xᵀy of the centred features and values.
struct Centred {
    rows: f64,
    gram: Vec<Vec<f64>>,
    xty: Vec<f64>,
    total_square: f64,
    feature_means: Vec<f64>,
    y_mean: f64,
}

impl Centred {
    fn new(n: usize, rows: &[Vec<usize>], y: &[f64], chosen: &[usize]) -> Centred {
        let m = chosen.len() as f64;
        let y_mean = chosen.iter().map(|&r| y[r]).sum::<f64>() / m;
        // Co-occurrence counts and Σ z (y - ȳ), then centred: Σ (z_i - μ_i)(z_j - μ_j) =
        // C_ij - m μ_i μ_j; the counts are exact integers.
        let mut gram = vec![vec![0.0; n]; n];
        let mut xty = vec![0.0; n];
        for &r in chosen {
            for &i in &rows[r] {
                xty[i] += y[r] - y_mean;
                for &j in &rows[r] {
                    gram[i][j] += 1.0;
                }
            }
        }
        let feature_means: Vec<f64> = (0..n).map(|i| gram[i][i] / m).collect();
        for (i, row) in gram.iter_mut().enumerate() {
            for (j, g) in row.iter_mut().enumerate() {
                *g -= m * feature_means[i] * feature_means[j];
            }
        }
        Centred {
            rows: m,
            gram,
            xty,
            total_square: chosen.iter().map(|&r| (y[r] - y_mean).powi(2)).sum(),
            feature_means,
            y_mean,
        }
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
                axpy(-b, &self.gram[j], &mut correlation);
            }
        }
        let scale = (self.total_square / m).sqrt().max(f64::MIN_POSITIVE);
        for _ in 0..MAX_SWEEPS {
            let mut moved: f64 = 0.0;
            for j in 0..beta.len() {
                let norm = self.gram[j][j] / m;
                if norm <= 0.0 {
                    beta[j] = 0.0;
                    continue;
                }
                let rho = correlation[j] / m + norm * beta[j];
                let delta = soft_threshold(rho, alpha) / norm - beta[j];
                if delta != 0.0 {
                    axpy(-delta, &self.gram[j], &mut correlation);
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
                .map(|&i| support.iter().map(|&j| data.gram[i][j]).collect())
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
