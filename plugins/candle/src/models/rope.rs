//! Rotary position embeddings: the cos/sin table, gathered per pass, and the per-dimension
//! frequency factors of Llama 3.x's long-context scaling.
//!
//! Paper: <https://arxiv.org/abs/2104.09864>. Llama 3.1's scaling follows Transformers'
//! `_compute_llama3_parameters`; llama.cpp's converter stores the same numbers as the tensor
//! `rope_freqs.weight`, one divisor per rotated pair, which `ggml_rope_ext` applies as
//! `theta / factor` (`ggml-cpu/ops.cpp`, `ggml_rope_cache_init`).

use candle_core::{DType, Device, Result, Tensor};
use serde::Deserialize;

/// `rope_scaling` in config.json (Transformers 5 writes it as `rope_parameters`, with the base).
#[derive(Debug, Clone, Deserialize)]
pub struct RopeScaling {
    #[serde(alias = "type")]
    pub rope_type: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<f64>,
    /// Only in `rope_parameters`: the base, which replaces the top-level `rope_theta`.
    pub rope_theta: Option<f64>,
}

/// The `rope_type`s [`RopeScaling::factors`] implements.
const SUPPORTED: &str = "default, llama3";

impl RopeScaling {
    /// The divisor of each pair's frequency (`head_dim / 2` of them), or `None` for plain RoPE.
    /// A type not implemented (linear, dynamic, yarn, Phi-3's su/longrope) is an error naming it.
    pub fn factors(
        &self,
        head_dim: usize,
        base: f64,
    ) -> std::result::Result<Option<Vec<f32>>, String> {
        let kind = self.rope_type.as_deref().unwrap_or("default");
        if kind == "default" {
            return Ok(None);
        }
        if kind != "llama3" {
            return Err(format!(
                "rope_scaling type {kind:?} is not implemented (supported: {SUPPORTED})"
            ));
        }
        let need = |v: Option<f64>, key: &str| {
            v.ok_or_else(|| format!("rope_scaling.{key} is missing (rope_type \"llama3\")"))
        };
        let factor = need(self.factor, "factor")?;
        let low = need(self.low_freq_factor, "low_freq_factor")?;
        let high = need(self.high_freq_factor, "high_freq_factor")?;
        let old_context = need(
            self.original_max_position_embeddings,
            "original_max_position_embeddings",
        )?;
        if factor <= 0.0 || high <= low {
            return Err(format!(
                "rope_scaling: factor {factor} must be positive and high_freq_factor {high} above \
                 low_freq_factor {low}"
            ));
        }
        let (low_wavelen, high_wavelen) = (old_context / low, old_context / high);
        let factors = inverse_frequencies(head_dim, base)
            .into_iter()
            .map(|freq| {
                let wavelen = 2.0 * std::f64::consts::PI / f64::from(freq);
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor as f32
                } else {
                    let smooth = (old_context / wavelen - low) / (high - low);
                    (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
                }
            })
            .collect();
        Ok(Some(factors))
    }
}

/// `base^(-2i/d)` for each rotated pair, in f32 as candle-transformers and llama.cpp compute it.
fn inverse_frequencies(head_dim: usize, base: f64) -> Vec<f32> {
    let base = base as f32;
    (0..head_dim)
        .step_by(2)
        .map(|i| 1f32 / base.powf(i as f32 / head_dim as f32))
        .collect()
}

/// The cos/sin table of positions `0..max_len`.
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl Rope {
    /// `factors` divide the pairs' frequencies (Llama 3.x); `interleaved` rotates adjacent pairs
    /// (GGUF Llama files, whose q/k rows the converter permuted) instead of halves.
    pub fn new(
        head_dim: usize,
        base: f64,
        factors: Option<&[f32]>,
        interleaved: bool,
        max_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut theta = inverse_frequencies(head_dim, base);
        if let Some(factors) = factors {
            if factors.len() != theta.len() {
                candle_core::bail!(
                    "{} RoPE frequency factors for head_dim {head_dim}, expected {}",
                    factors.len(),
                    theta.len()
                );
            }
            for (t, f) in theta.iter_mut().zip(factors) {
                *t /= f;
            }
        }
        let n = theta.len();
        let theta = Tensor::new(theta.as_slice(), device)?;
        let angles = Tensor::arange(0, max_len as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_len, 1))?
            .matmul(&theta.reshape((1, n))?)?;
        Ok(Rope {
            cos: angles.cos()?.to_dtype(dtype)?,
            sin: angles.sin()?.to_dtype(dtype)?,
            interleaved,
        })
    }

    /// The table rows of `positions` (one per row of a packed pass).
    /// Rotates `x`, heads of `d` values (the table's width) at `position`, in place, as
    /// [`RopeRows::apply`] does; `None` where the tables are not f32 on CPU or `position` is
    /// past them.
    pub fn rotate(&self, x: &mut [f32], position: usize) -> Option<()> {
        crate::weights::f32_values(&self.cos, |cos| {
            crate::weights::f32_values(&self.sin, |sin| {
                let n = self.cos.dims().get(1).copied()?;
                let cos = cos.get(position * n..(position + 1) * n)?;
                let sin = sin.get(position * n..(position + 1) * n)?;
                for head in x.chunks_exact_mut(2 * n) {
                    rotate_head(head, cos, sin, self.interleaved);
                }
                Some(())
            })
        })
        .flatten()
        .flatten()
    }

    pub fn at(&self, positions: &[u32]) -> Result<RopeRows> {
        let index = Tensor::new(positions, self.cos.device())?;
        Ok(RopeRows {
            cos: self.cos.index_select(&index, 0)?,
            sin: self.sin.index_select(&index, 0)?,
            interleaved: self.interleaved,
        })
    }
}

/// Rotations for the rows of one pass, gathered once and applied in every layer.
/// One head rotated: pairs `(2i, 2i + 1)` (`interleaved`, candle's `rope_i`) or `(i, i + n)`
/// (`rope`) by the angles `cos`, `sin`.
fn rotate_head(head: &mut [f32], cos: &[f32], sin: &[f32], interleaved: bool) {
    let n = cos.len();
    for (i, (c, s)) in cos.iter().zip(sin).enumerate() {
        let (a, b) = if interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + n)
        };
        let (x, y) = (head[a], head[b]);
        head[a] = x * c - y * s;
        head[b] = x * s + y * c;
    }
}

pub struct RopeRows {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl RopeRows {
    /// Rotates `x`, shaped `(1, heads, rows, head_dim)`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        if self.interleaved {
            candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)
        } else {
            candle_nn::rotary_emb::rope(&x, &self.cos, &self.sin)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RopeScaling;

    fn llama3(factor: f64) -> RopeScaling {
        RopeScaling {
            rope_type: Some("llama3".into()),
            factor: Some(factor),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
            original_max_position_embeddings: Some(128.0),
            rope_theta: None,
        }
    }

    /// Wavelengths 6.3, 63, 628 and 6283 against the band 32..128: kept, smoothed, scaled.
    #[test]
    fn llama3_factors_keep_high_scale_low_and_smooth_between() {
        let f = llama3(8.0).factors(8, 10_000.0).unwrap().unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!((f[0], f[2], f[3]), (1.0, 8.0, 8.0));
        let smooth = (128.0 / (2.0 * std::f64::consts::PI / 0.1) - 1.0) / 3.0;
        let expected = 1.0 / ((1.0 - smooth) / 8.0 + smooth);
        assert!((f64::from(f[1]) - expected).abs() < 1e-5, "{f:?}");
    }

    #[test]
    fn unknown_types_and_missing_keys_are_named() {
        let mut s = llama3(8.0);
        s.rope_type = Some("longrope".into());
        let err = s.factors(8, 10_000.0).unwrap_err();
        assert!(
            err.contains("\"longrope\"") && err.contains("llama3"),
            "{err}"
        );
        let mut s = llama3(8.0);
        s.low_freq_factor = None;
        let err = s.factors(8, 10_000.0).unwrap_err();
        assert!(err.contains("low_freq_factor"), "{err}");
        s.rope_type = None;
        assert_eq!(s.factors(8, 10_000.0).unwrap(), None);
    }
}
