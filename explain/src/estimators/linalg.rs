//! The small dense linear algebra the regression estimators (`kernel`, `lasso`) share.

/// The Cholesky factor L of a symmetric positive definite A = LLᵀ (lower triangular, by rows);
/// `None` when a pivot falls below 1e-10 of the largest diagonal entry (singular to working
/// precision).
pub(super) fn cholesky(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let tol = 1e-10 * (0..n).map(|i| a[i][i]).fold(0.0, f64::max);
    let mut l = vec![vec![0.0; n]; n];
    for j in 0..n {
        let d = a[j][j] - (0..j).map(|k| l[j][k] * l[j][k]).sum::<f64>();
        if d.is_nan() || d <= tol {
            return None;
        }
        l[j][j] = d.sqrt();
        for i in j + 1..n {
            let s = a[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>();
            l[i][j] = s / l[j][j];
        }
    }
    Some(l)
}
