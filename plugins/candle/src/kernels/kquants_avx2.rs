//! The AVX2 dot products of [`super::kquants`]' types (after llama.cpp's `ggml_vec_dot_q5_0_q8_0`,
//! `_q4_K_q8_K` and `_q6_K_q8_K`): unsigned weight bytes times signed activations per
//! `_mm256_maddubs_epi16`, as in `avx2.rs`. The K-quants' sums stay i32 over a super-block,
//! weight scales applied by `_mm256_madd_epi16`, and are converted and scaled once.

use std::arch::x86_64::*;

use super::avx2::{activations, dot_u8_i8, f16_pair, fifth_bits, hsum, nibbles, prefetch, Avx2};
use super::blocks::{scales_mins, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8, BlockQ8K};

impl Avx2 {
    pub(super) fn dot_q5_0(self, w: &[BlockQ5_0], x: &[BlockQ8]) -> f32 {
        // SAFETY: `self` exists only where the features were detected.
        unsafe { dot_q5_0(w, x) }
    }

    pub(super) fn dot_q4k(self, w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_q4k(w, x) }
    }

    pub(super) fn dot_q6k(self, w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_q6k(w, x) }
    }
}

/// The first 32 bytes of `v` (integers: weight bytes, activations, their sums), unaligned;
/// panics on fewer.
#[target_feature(enable = "avx2,fma,f16c")]
fn load<T: Copy>(v: &[T]) -> __m256i {
    assert!(
        std::mem::size_of_val(v) >= 32,
        "a 32-byte load from fewer bytes"
    );
    // SAFETY: `v` has 32 readable bytes (checked); the load is unaligned.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// As Q4_0 with an offset of 16 and a fifth bit; two blocks per step, each with its own
/// accumulator, so that their multiply-add latencies overlap.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_0(w: &[BlockQ5_0], x: &[BlockQ8]) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 2];
    // Σ d · sum over the blocks, for the offset of 16.
    let mut offset = 0f32;
    let step = |acc: &mut __m256, w: &BlockQ5_0, x: &BlockQ8| {
        prefetch(w);
        let d = f16_pair([w.d[0], w.d[1], 0, 0]).0 * x.d;
        let q = _mm256_or_si256(nibbles(&w.qs), fifth_bits(w.qh));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), dot_u8_i8(q, activations(x)), *acc);
        d * x.sum
    };
    let ((w2, w1), (x2, x1)) = (w.as_chunks::<2>(), x.as_chunks::<2>());
    for ([wa, wb], [xa, xb]) in w2.iter().zip(x2) {
        let [a, b] = &mut acc;
        offset += step(a, wa, xa) + step(b, wb, xb);
    }
    for (w, x) in w1.iter().zip(x1) {
        offset += step(&mut acc[0], w, x);
    }
    hsum(_mm256_add_ps(acc[0], acc[1])) - 16.0 * offset
}

/// 8 bytes in the low half of a vector.
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes8(b: [u8; 8]) -> __m128i {
    _mm_cvtsi64_si128(i64::from_le_bytes(b))
}

/// i16 lane `i` of each 128-bit half of `v`, in every lane of that half.
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_i16(v: __m256i, i: usize) -> __m256i {
    let i = 2 * i as u8;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(i16::from_le_bytes([i, i + 1])))
}

/// Each 32 bytes of `qs` are two sub-blocks (low and high nibbles), each `maddubs`ed with its
/// 32 activations and `madd`ed with its 6-bit scale into i32 lanes. The minimums' term comes
/// from the activations' 16-value sums, eight pair sums against the eight minimums.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let low = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_mins = _mm_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        prefetch(w);
        let (d, dmin) = f16_pair([w.d[0], w.d[1], w.dmin[0], w.dmin[1]]);
        let (sc, m) = scales_mins(&w.scales);
        let bsums = load(&x.bsums);
        let sub_sums = _mm_hadd_epi16(
            _mm256_castsi256_si128(bsums),
            _mm256_extracti128_si256::<1>(bsums),
        );
        let mins = _mm_madd_epi16(_mm_cvtepu8_epi16(bytes8(m)), sub_sums);
        acc_mins = _mm_fmadd_ps(_mm_set1_ps(x.d * dmin), _mm_cvtepi32_ps(mins), acc_mins);
        let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes8(sc)));
        let mut sumi = _mm256_setzero_si256();
        let (qs, xs) = (w.qs.as_chunks::<32>().0, x.qs.as_chunks::<64>().0);
        for (c, (bits, a)) in qs.iter().zip(xs).enumerate() {
            let bits = load(bits);
            let lo = _mm256_maddubs_epi16(_mm256_and_si256(bits, low), load(&a[..32]));
            let hi = _mm256_maddubs_epi16(
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), low),
                load(&a[32..]),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(lane_i16(scales, 2 * c), lo));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(lane_i16(scales, 2 * c + 1), hi));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x.d * d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) - hsum(_mm256_set_m128(_mm_setzero_ps(), acc_mins))
}

/// Each half super-block's 3×32 bytes of `ql` and `qh` are four sub-blocks. q - 32 comes from
/// `maddubs(q, x) - maddubs(32, x)`, then `madd` applies the two i8 scales per sub-block into
/// i32 lanes, and `d · x.d` is applied once per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let low = _mm256_set1_epi8(0xF);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        prefetch(w);
        let (d, _) = f16_pair([w.d[0], w.d[1], 0, 0]);
        // SAFETY: `scales` is 16 readable bytes; the load is unaligned.
        let sc = unsafe { _mm_loadu_si128(w.scales.as_ptr().cast()) };
        let mut sumi = [_mm256_setzero_si256(); 2];
        for (h, x) in x.qs.as_chunks::<128>().0.iter().enumerate() {
            let scales = half_scales(sc, h);
            let ql0 = load(&w.ql[64 * h..]);
            let ql1 = load(&w.ql[64 * h + 32..]);
            let qh = load(&w.qh[32 * h..]);
            let high = |mask: i8| _mm256_and_si256(qh, _mm256_set1_epi8(mask));
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, low),
                    _mm256_slli_epi16::<4>(high(0x03)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low),
                    _mm256_slli_epi16::<2>(high(0x0C)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                    high(0x30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                    _mm256_srli_epi16::<2>(high(0xC0u8 as i8)),
                ),
            ];
            for (t, (q, x)) in q.into_iter().zip(x.as_chunks::<32>().0).enumerate() {
                let a = load(x);
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(m32, a));
                let sumi = &mut sumi[t % 2];
                *sumi = _mm256_add_epi32(*sumi, _mm256_madd_epi16(p, sub_block_scales(scales, t)));
            }
        }
        let sumi = _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[0], sumi[1]));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * x.d), sumi, acc);
    }
    hsum(acc)
}

/// Q6_K half `h`'s 8 scales (of the 16 in `sc`) as i16, each doubled into an i32 lane:
/// sub-block t's first scale in lane t of the low 128 bits, its second in lane t of the high
/// ones, for [`sub_block_scales`].
#[target_feature(enable = "avx2,fma,f16c")]
fn half_scales(sc: __m128i, h: usize) -> __m256i {
    let order = _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 1, 1, 3, 3, 5, 5, 7, 7);
    let pick = _mm_add_epi8(_mm_set1_epi8(8 * h as i8), order);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pick))
}

/// Sub-block `t`'s two scales from [`half_scales`], as `madd` needs them: the first over the
/// low 128 bits (its first 16 values' pair sums), the second over the high ones. One shuffle.
#[target_feature(enable = "avx2,fma,f16c")]
fn sub_block_scales(half: __m256i, t: usize) -> __m256i {
    match t {
        0 => _mm256_shuffle_epi32::<0x00>(half),
        1 => _mm256_shuffle_epi32::<0x55>(half),
        2 => _mm256_shuffle_epi32::<0xAA>(half),
        _ => _mm256_shuffle_epi32::<0xFF>(half),
    }
}
