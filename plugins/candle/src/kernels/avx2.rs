//! The AVX2 dot products (llama.cpp's `ggml_vec_dot_q4_0_q8_0` and kin): 32 weights against
//! 32 activations per `_mm256_maddubs_epi16`, unsigned nibbles times signed bytes, summed in
//! eight i32 lanes and scaled into an f32 accumulator.

use std::arch::x86_64::*;

use super::{BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0};

/// Proof that this CPU has AVX2, FMA and F16C: only [`Avx2::detect`] makes one.
#[derive(Clone, Copy)]
pub(super) struct Avx2(());

impl Avx2 {
    pub(super) fn detect() -> Option<Avx2> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx2(()))
    }

    pub(super) fn dot_q4_0(self, w: &[BlockQ4_0], x: &[BlockQ8]) -> f32 {
        // SAFETY: `self` exists only where the features were detected.
        unsafe { dot_q4_0(w, x) }
    }

    pub(super) fn dot_q4_1(self, w: &[BlockQ4_1], x: &[BlockQ8]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_q4_1(w, x) }
    }

    pub(super) fn dot_q8_0(self, w: &[BlockQ8_0], x: &[BlockQ8]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_q8_0(w, x) }
    }
}

/// A block's 32 nibbles as bytes 0..15, in value order (low nibbles first).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; the load is unaligned.
    let packed = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

/// A block's 32 activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn activations(x: &BlockQ8) -> __m256i {
    // SAFETY: `qs` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(x.qs.as_ptr().cast()) }
}

/// Σ u·s as eight f32 lanes, `u` unsigned bytes, `s` signed. `maddubs` saturates its i16 pair
/// sums, which never happens here: u ≤ 128 (nibbles, or |q| of Q8_0) and |s| ≤ 127.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256 {
    let pairs = _mm256_maddubs_epi16(u, s);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Two adjacent f16 values (`d` and `m` of a block, or `d` and whatever follows) as f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_pair(bytes: [u8; 4]) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(bytes)));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_0(w: &[BlockQ4_0], x: &[BlockQ8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0f32;
    for (w, x) in w.iter().zip(x) {
        let (dw, _) = f16_pair([w.d[0], w.d[1], 0, 0]);
        let d = dw * x.d;
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(d),
            dot_u8_i8(nibbles(&w.qs), activations(x)),
            acc,
        );
        offset -= 8.0 * d * x.sum;
    }
    hsum(acc) + offset
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_1(w: &[BlockQ4_1], x: &[BlockQ8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0f32;
    for (w, x) in w.iter().zip(x) {
        let (dw, mw) = f16_pair([w.d[0], w.d[1], w.m[0], w.m[1]]);
        acc = _mm256_fmadd_ps(
            _mm256_set1_ps(dw * x.d),
            dot_u8_i8(nibbles(&w.qs), activations(x)),
            acc,
        );
        offset += mw * x.s;
    }
    hsum(acc) + offset
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q8_0(w: &[BlockQ8_0], x: &[BlockQ8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        let (dw, _) = f16_pair([w.d[0], w.d[1], 0, 0]);
        // SAFETY: `qs` is 32 readable bytes; the load is unaligned.
        let q = unsafe { _mm256_loadu_si256(w.qs.as_ptr().cast()) };
        // Signed × signed through maddubs: |q| times x with q's sign moved onto x.
        let p = dot_u8_i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(activations(x), q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * x.d), p, acc);
    }
    hsum(acc)
}
