//! RMSNorm: the layer, and the row arithmetic its in-place decode steps run (as candle's CPU
//! `rms_norm` computes it, so both give the same values).

use candle_core::{Result, Tensor};

use crate::weights;

/// `x / sqrt(mean(x²) + eps) · weight` over the last axis.
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        RmsNorm {
            weight,
            eps: eps as f32,
        }
    }

    /// Normalizes over the last axis of a contiguous tensor.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }

    /// [`RmsNorm::forward`] of rows of f32 values into `out` (an in-place decode step).
    pub fn forward_into(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.values(|w| rms_norm(x, w, self.eps, out))
    }

    /// [`RmsNorm::forward`] of rows of f32 values into themselves.
    pub fn forward_in_place(&self, x: &mut [f32]) -> Result<()> {
        self.values(|w| rms_norm_in_place(x, w, self.eps))
    }

    fn values(&self, f: impl FnOnce(&[f32])) -> Result<()> {
        weights::f32_values(&self.weight, f)
            .ok_or_else(|| candle_core::Error::Msg("a norm's weights are not f32 on CPU".into()))
    }
}

/// `out = x / sqrt(mean(x²) + eps) · w` over each row of `w.len()` values, as candle's CPU
/// `rms_norm` computes it (in f32, the same steps).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (x, out) in x.chunks(SIDE * n).zip(out.chunks_mut(SIDE * n)) {
        let rms = rms_rows(x, n, eps);
        for ((x, out), m) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)).zip(rms) {
            for ((o, x), w) in out.iter_mut().zip(x).zip(w) {
                *o = x / m * w;
            }
        }
    }
}

/// [`rms_norm`] of each row of `x` into itself (q and k per head).
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for x in x.chunks_mut(SIDE * n) {
        let rms = rms_rows(x, n, eps);
        for (x, m) in x.chunks_exact_mut(n).zip(rms) {
            for (x, w) in x.iter_mut().zip(w) {
                *x = *x / m * w;
            }
        }
    }
}

/// Rows whose sums of squares [`rms_rows`] adds side by side.
const SIDE: usize = 8;

/// `sqrt(mean(x²) + eps)` of each of the (up to [`SIDE`]) rows of `n` values in `x`. Each
/// sum adds its row's squares in order, as candle does: a chain of dependent adds, which
/// one row at a time waits on for the adder's latency at every value; several rows' chains
/// interleave (the missing ones repeat the last row, and are not read).
fn rms_rows(x: &[f32], n: usize, eps: f32) -> [f32; SIDE] {
    let rows = x.len() / n.max(1);
    let row: [&[f32]; SIDE] = std::array::from_fn(|r| &x[r.min(rows.saturating_sub(1)) * n..][..n]);
    let mut sums = [0f32; SIDE];
    if rows == 1 {
        sums[0] = row[0].iter().map(|v| v * v).sum();
    } else {
        for j in 0..n {
            for (sum, row) in sums.iter_mut().zip(row) {
                *sum += row[j] * row[j];
            }
        }
    }
    sums.map(|sum| (sum / n as f32 + eps).sqrt())
}
