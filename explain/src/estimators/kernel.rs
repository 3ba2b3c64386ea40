//! Shapley values by KernelSHAP (Lundberg & Lee 2017, "A Unified Approach to Interpreting Model
//! Predictions"), with the paired sampling and the variance estimate of Covert & Lee 2021
//! ("Improving KernelSHAP: Practical Shapley Value Estimation via Linear Regression"; reference
//! code: github.com/iancovert/shapley-regression).
//!
//! The Shapley values solve a weighted least squares over coalitions z ∈ {0,1}^n: minimise
//! E[(v(z) - v(∅) - zᵀφ)²] under the Shapley kernel, subject to 1ᵀφ = v(N) - v(∅). With
//! A = E[zzᵀ] and b = E[z (v(z) - v(∅))] the solution is
//! φ = A⁻¹(b - 1 (1ᵀA⁻¹b - v(N) + v(∅)) / 1ᵀA⁻¹1). We draw sizes s with p(s) ∝ 1/(s(n - s)),
//! then a uniform coalition of that size, each with its complement, and estimate A and b over
//! the pairs. A depends only on the coalitions, so the plan solves it once and refuses a
//! singular one before anything is evaluated; the estimate is then linear in b:
//! φ = M b + u (v(N) - v(∅)), with efficiency exact by construction.
//!
//! Standard errors: each pair k is one i.i.d. draw of (A_k, b_k). Linearising the solution in
//! (Â, b̂) (the delta method) gives φ̂ - φ ≈ M (ḡ - E g) with g_k = b_k - A_k φ, so
//! Cov(φ̂) ≈ M Cov(g) Mᵀ / m over m pairs, with φ̂ and the sample covariance plugged in. An
//! additive game has g constant: its error and its standard error are both zero.

use rand::seq::index;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{Coalition, Estimates, ExplainError, Interner};

/// A planned KernelSHAP: the sampled pairs and the linear map from b̂ to φ.
#[derive(Debug, Clone)]
pub(super) struct Kernel {
    /// Per pair: the index of the sampled coalition and of its complement.
    pairs: Vec<(usize, usize)>,
    /// M = A⁻¹ - A⁻¹11ᵀA⁻¹ / 1ᵀA⁻¹1 (n × n, rows).
    map: Vec<Vec<f64>>,
    /// u = A⁻¹1 / 1ᵀA⁻¹1.
    offset: Vec<f64>,
}

/// Pairs a budget of evaluations buys: the empty and full coalitions, then two per pair. At
/// least 2, so a standard error exists; none for one player, whose value needs no sampling.
pub(super) fn pairs_for(n: usize, budget: usize) -> usize {
    if n < 2 {
        0
    } else {
        (budget.saturating_sub(2) / 2).max(2)
    }
}

pub(super) fn plan(
    n: usize,
    budget: usize,
    rng: &mut ChaCha8Rng,
) -> Result<(Vec<Coalition>, Kernel), ExplainError> {
    let mut interner = Interner::default();
    interner.add(Coalition::empty(n));
    interner.add(Coalition::full(n));
    let m = pairs_for(n, budget);
    // Shapley kernel over sizes 1..n-1; the (n - 1) factor cancels in the normalisation.
    let size_weights: Vec<f64> = (1..n).map(|s| 1.0 / (s * (n - s)) as f64).collect();
    let total: f64 = size_weights.iter().sum();
    let mut a = vec![vec![0.0; n]; n];
    let mut pairs = Vec::with_capacity(m);
    for _ in 0..m {
        let mut u = rng.random::<f64>() * total;
        let s = 1 + size_weights
            .iter()
            .position(|w| {
                u -= w;
                u < 0.0
            })
            .unwrap_or(n - 2);
        let chosen = index::sample(rng, n, s).into_vec();
        let coalition = Coalition::from_members(n, chosen);
        let complement = Coalition::from_members(n, (0..n).filter(|&i| !coalition.contains(i)));
        for c in [&coalition, &complement] {
            for i in c.members() {
                for j in c.members() {
                    a[i][j] += 1.0;
                }
            }
        }
        pairs.push((interner.add(coalition), interner.add(complement)));
    }
    for row in &mut a {
        for x in row.iter_mut() {
            *x /= 2.0 * m.max(1) as f64;
        }
    }
    if n == 1 {
        a[0][0] = 1.0;
    }
    let inverse = spd_inverse(&a).ok_or_else(|| {
        let more = (2 * budget).max(10 * n + 2);
        ExplainError::Estimator(format!(
            "`kernel` drew {m} coalition pairs for {n} players (budget = {budget}), too few to \
             tell every player apart (the least squares is singular); raise `budget`, e.g. \
             `budget = {more}` (--budget {more})"
        ))
    })?;
    let ones: Vec<f64> = inverse.iter().map(|row| row.iter().sum()).collect();
    let total: f64 = ones.iter().sum();
    let map = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| inverse[i][j] - ones[i] * ones[j] / total)
                .collect()
        })
        .collect();
    let offset = ones.iter().map(|x| x / total).collect();
    Ok((interner.coalitions, Kernel { pairs, map, offset }))
}

impl Kernel {
    /// `values` per coalition of the plan, whose empty one is at 0 and full one at 1.
    pub(super) fn estimate(&self, coalitions: &[Coalition], values: &[f64]) -> Estimates {
        let n = self.offset.len();
        let (v0, gain) = (values[0], values[1] - values[0]);
        let m = self.pairs.len();
        // Per pair, (z f(z) + z̄ f(z̄)) / 2: b_k for f = v - v(∅), g_k for f = the residual.
        let per_pair = |f: &dyn Fn(usize) -> f64| -> Vec<Vec<f64>> {
            self.pairs
                .iter()
                .map(|&(c, d)| {
                    let mut g = vec![0.0; n];
                    for k in [c, d] {
                        let r = f(k);
                        for i in coalitions[k].members() {
                            g[i] += r / 2.0;
                        }
                    }
                    g
                })
                .collect()
        };
        let b = mean(&per_pair(&|k| values[k] - v0), n);
        let mut phi = self.apply(&b);
        for (p, u) in phi.iter_mut().zip(&self.offset) {
            *p += u * gain;
        }
        if m < 2 {
            return Estimates {
                interactions: None,
                values: phi,
                std_errors: None,
            };
        }
        // g_k = b_k - A_k φ: the pair's residuals, v(z) - v(∅) - zᵀφ, on its members.
        let g =
            per_pair(&|k| values[k] - v0 - coalitions[k].members().map(|i| phi[i]).sum::<f64>());
        let g_mean = mean(&g, n);
        let mut var = vec![0.0; n];
        for gk in &g {
            let centred: Vec<f64> = gk.iter().zip(&g_mean).map(|(x, y)| x - y).collect();
            for (v, h) in var.iter_mut().zip(self.apply(&centred)) {
                *v += h * h;
            }
        }
        let scale = (m * (m - 1)) as f64;
        Estimates {
            interactions: None,
            values: phi,
            std_errors: Some(var.iter().map(|v| (v / scale).sqrt()).collect()),
        }
    }

    fn apply(&self, x: &[f64]) -> Vec<f64> {
        self.map
            .iter()
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }
}

fn mean(rows: &[Vec<f64>], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; n];
    for row in rows {
        for (o, x) in out.iter_mut().zip(row) {
            *o += x / rows.len() as f64;
        }
    }
    out
}

/// The inverse of a symmetric positive definite matrix, A⁻¹ = L⁻ᵀ L⁻¹ from its Cholesky factor;
/// `None` when A is singular to working precision.
fn spd_inverse(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let l = super::linalg::cholesky(a)?;
    // L⁻¹ row by row (forward substitution).
    let mut inv_l: Vec<Vec<f64>> = Vec::with_capacity(n);
    for (i, row) in l.iter().enumerate() {
        let inv_row = (0..n)
            .map(|c| {
                let s: f64 = (c..i).map(|k| row[k] * inv_l[k][c]).sum();
                if c > i {
                    0.0
                } else {
                    (f64::from(i == c) - s) / row[i]
                }
            })
            .collect();
        inv_l.push(inv_row);
    }
    let inverse = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| (i.max(j)..n).map(|k| inv_l[k][i] * inv_l[k][j]).sum())
                .collect()
        })
        .collect();
    Some(inverse)
}
