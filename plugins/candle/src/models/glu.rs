//! The MLPs' gated activations, `act(gate) · up`: SiLU (the Llama-shaped families) and GELU's
//! tanh approximation (Gemma 3).
//!
//! While generating ([`crate::weights::is_generating`]) they run in one pass over the inputs
//! with an exponential in AVX2 (about 2 ulp), where candle's ops call `expf` (or `tanhf`) per
//! value and allocate twice, a visible share of a packed decode pass. So does scoring where
//! the down projection rounds its input to bf16 (`weights = "bf16"`), which loses those ulps.
//! Exact scoring keeps candle's ops, so its scores and explain's values do not move; a
//! generation's activations are 8-bit anyway.

use candle_core::{Result, Tensor};

/// Which activation gates.
#[derive(Debug, Clone, Copy)]
pub enum Act {
    Silu,
    /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`, Transformers' `gelu_pytorch_tanh`.
    GeluTanh,
}

/// `act(gate) · up` of two tensors of one shape; `coarse` where the result is rounded to bf16
/// next ([`crate::weights::Linear::rounds_input_to_bf16`]), so the fused pass may run while
/// scoring too.
pub fn gated(act: Act, gate: &Tensor, up: &Tensor, coarse: bool) -> Result<Tensor> {
    #[cfg(target_arch = "x86_64")]
    if coarse || crate::weights::is_generating() {
        if let Some(y) = avx2::fused(act, gate, up)? {
            return Ok(y);
        }
    }
    let gate = match act {
        Act::Silu => candle_nn::ops::silu(gate)?,
        Act::GeluTanh => gate.gelu()?,
    };
    gate * up
}

/// `out = act(gate) · up` over slices, as [`gated`] computes it while generating (in AVX2
/// where the CPU has it): a decode pass's step over its own buffers.
pub fn gated_into(act: Act, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return avx2::gated_slices(act, gate, up, out);
    }
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = scalar(act, *g) * u;
    }
}

/// `act(x)` of one value, as candle's CPU ops compute it (its constant for √(2/π) too), so
/// that a pass without AVX2 gives what candle's ops give, bit for bit.
fn scalar(act: Act, x: f32) -> f32 {
    const SQRT_TWO_OVER_PI: f32 = 0.797_884_6;
    match act {
        Act::Silu => x / (1.0 + (-x).exp()),
        Act::GeluTanh => {
            0.5 * x * (1.0 + f32::tanh(SQRT_TWO_OVER_PI * x * (1.0 + 0.044715 * x * x)))
        }
    }
}

/// `e^x` for 8 lanes, within 2 ulp of libm's `expf` (the attention of a decode pass takes its
/// softmax's exponentials from here too).
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::exp as exp8;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor};
    use rayon::prelude::*;

    use super::{scalar, Act};
    use crate::kernels::Path;

    /// Values per parallel task: below this a pass's activations are a few microseconds of work,
    /// less than waking the pool.
    const TASK: usize = 1 << 16;

    /// Whether the CPU has AVX2 and FMA.
    pub(super) fn available() -> bool {
        matches!(Path::best(), Path::Avx2 | Path::Avx512)
    }

    /// [`gated`] over slices, in parallel where they are long; the CPU must be [`available`].
    pub(super) fn gated_slices(act: Act, gate: &[f32], up: &[f32], out: &mut [f32]) {
        out.par_chunks_mut(TASK)
            .zip(gate.par_chunks(TASK).zip(up.par_chunks(TASK)))
            .for_each(|(out, (g, u))| {
                // SAFETY: the CPU has AVX2 and FMA (checked by `Path::best`).
                unsafe { gated(act, g, u, out) }
            });
    }

    /// The fused pass, where both inputs are contiguous f32 on CPU and the CPU has AVX2.
    pub(super) fn fused(act: Act, gate: &Tensor, up: &Tensor) -> Result<Option<Tensor>> {
        if !available()
            || gate.dtype() != DType::F32
            || !gate.device().is_cpu()
            || gate.dims() != up.dims()
        {
            return Ok(None);
        }
        let (g, gl) = gate.storage_and_layout();
        let (u, ul) = up.storage_and_layout();
        let (Some(g), Some(u)) = (values(&g, gl), values(&u, ul)) else {
            return Ok(None);
        };
        let mut out = vec![0f32; g.len()];
        gated_slices(act, g, u, &mut out);
        Tensor::from_vec(out, gate.dims(), gate.device()).map(Some)
    }

    /// A contiguous f32 CPU tensor's values.
    fn values<'a>(storage: &'a Storage, layout: &Layout) -> Option<&'a [f32]> {
        let Storage::Cpu(CpuStorage::F32(data)) = storage else {
            return None;
        };
        let (start, end) = layout.contiguous_offsets()?;
        data.get(start..end)
    }

    /// `out = act(gate) · up`, eight values at a time (the tail as [`scalar`] does).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gated(act: Act, gate: &[f32], up: &[f32], out: &mut [f32]) {
        let (g8, g_tail) = gate.as_chunks::<8>();
        let (u8, u_tail) = up.as_chunks::<8>();
        let (o8, o_tail) = out.as_chunks_mut::<8>();
        let one = _mm256_set1_ps(1.0);
        for ((g, u), o) in g8.iter().zip(u8).zip(o8) {
            // SAFETY: each chunk is 8 f32; the loads and store are unaligned.
            unsafe {
                let x = _mm256_loadu_ps(g.as_ptr());
                let a = match act {
                    Act::Silu => _mm256_div_ps(
                        x,
                        _mm256_add_ps(one, exp(_mm256_sub_ps(_mm256_setzero_ps(), x))),
                    ),
                    Act::GeluTanh => gelu_tanh(x),
                };
                _mm256_storeu_ps(
                    o.as_mut_ptr(),
                    _mm256_mul_ps(a, _mm256_loadu_ps(u.as_ptr())),
                );
            }
        }
        for ((g, u), o) in g_tail.iter().zip(u_tail).zip(o_tail) {
            *o = scalar(act, *g) * u;
        }
    }

    /// `0.5 x (1 + tanh(u))` with `tanh(u) = 1 - 2 / (exp(2u) + 1)`.
    #[target_feature(enable = "avx2,fma")]
    fn gelu_tanh(x: __m256) -> __m256 {
        let c = _mm256_set1_ps((2.0f32 / std::f32::consts::PI).sqrt());
        let one = _mm256_set1_ps(1.0);
        let x2 = _mm256_mul_ps(x, x);
        let inner = _mm256_mul_ps(
            _mm256_mul_ps(c, x),
            _mm256_fmadd_ps(_mm256_set1_ps(0.044715), x2, one),
        );
        let e = exp(_mm256_add_ps(inner, inner));
        let tanh = _mm256_sub_ps(
            one,
            _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)),
        );
        _mm256_mul_ps(
            _mm256_mul_ps(_mm256_set1_ps(0.5), x),
            _mm256_add_ps(one, tanh),
        )
    }

    /// `e^x` (Cephes' `expf`: `x = n ln 2 + r`, a degree-5 polynomial in `r`, then `2^n` into
    /// the exponent bits), inputs clamped to where `2^n` is a normal float.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
            _mm256_set1_ps(88.3),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
    }

    #[cfg(test)]
    pub(super) fn exp_of(x: &[f32; 8]) -> [f32; 8] {
        let mut out = [0f32; 8];
        // SAFETY: tests run where the caller checked AVX2 and FMA; 8 f32 each way.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp(_mm256_loadu_ps(x.as_ptr()))) };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Path;
    use candle_core::Device;

    /// The fused pass against candle's ops over activations from -30 to 30 (both tails of
    /// each activation and the steep middle): within 1e-6 of each value (relative above 1).
    #[test]
    fn fused_activations_match_candles_ops() {
        let n = 3 * 8 * 1000 + 5;
        let gate: Vec<f32> = (0..n).map(|i| -30.0 + 60.0 * i as f32 / n as f32).collect();
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let gate = Tensor::from_vec(gate, (1, 5, n / 5), &Device::Cpu).unwrap();
        let up = Tensor::from_vec(up, (1, 5, n / 5), &Device::Cpu).unwrap();
        for act in [Act::Silu, Act::GeluTanh] {
            let values = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let want = values(gated(act, &gate, &up, false).unwrap());
            let got = values(crate::weights::generating(|| gated(act, &gate, &up, false)).unwrap());
            let coarse = values(gated(act, &gate, &up, true).unwrap());
            assert_eq!(
                coarse, got,
                "{act:?}: scoring before a bf16 product runs the fused pass"
            );
            if Path::best() == Path::Scalar {
                assert_eq!(got, want, "{act:?}: candle's ops where there is no AVX2");
                continue;
            }
            assert_ne!(got, want, "{act:?}: the fused pass did not run");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{act:?} at {i}: {g} vs {w}"
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        if crate::kernels::Path::available().len() == 1 {
            return; // no AVX2 here: the fused pass never runs
        }
        for start in (-870..880).step_by(8) {
            let x: [f32; 8] = std::array::from_fn(|i| (start + i as i32) as f32 * 0.1 + 0.03);
            for (got, x) in avx2::exp_of(&x).iter().zip(x) {
                let want = x.exp();
                assert!(
                    (got - want).abs() <= 2.0 * f32::EPSILON * want,
                    "exp({x}): {got} vs {want}"
                );
            }
        }
    }
}
