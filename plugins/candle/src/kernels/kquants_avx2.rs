//! The AVX2 dot products of [`super::kquants`]' types (after llama.cpp's `ggml_vec_dot_q5_0_q8_0`,
//! `_q4_K_q8_K` and `_q6_K_q8_K`): unsigned weight bytes times signed activations per
//! `_mm256_maddubs_epi16`, as in `avx2.rs`. With one activation scale per 32 values, each
//! sub-block's integer sum is scaled into the f32 accumulators on its own.

use std::arch::x86_64::*;

use super::avx2::{activations, dot_u8_i8, f16_pair, fifth_bits, hsum, nibbles, prefetch, Avx2};
use super::kquants::{scales_mins, BlockQ4K, BlockQ5_0, BlockQ6K, SUBS};
use super::BlockQ8;

impl Avx2 {
    pub(super) fn dot_q5_0(self, w: &[BlockQ5_0], x: &[BlockQ8]) -> f32 {
        // SAFETY: `self` exists only where the features were detected.
        unsafe { dot_q5_0(w, x) }
    }

    pub(super) fn dot_q4k(self, w: &[BlockQ4K], x: &[BlockQ8]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_q4k(w, x) }
    }

    pub(super) fn dot_q6k(self, w: &[BlockQ6K], x: &[BlockQ8]) -> f32 {
        // SAFETY: as above.
        unsafe { dot_q6k(w, x) }
    }
}

/// 32 unaligned bytes from the start of `bytes`; panics on fewer.
#[target_feature(enable = "avx2,fma,f16c")]
fn load(bytes: &[u8]) -> __m256i {
    let bytes = &bytes[..32];
    // SAFETY: `bytes` is 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
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

/// The `d` and `sum` of a super-block's 8 activation blocks, a block per lane.
#[target_feature(enable = "avx2,fma,f16c")]
fn block_scales(x: &[BlockQ8; SUBS]) -> (__m256, __m256) {
    let d = _mm256_setr_ps(
        x[0].d, x[1].d, x[2].d, x[3].d, x[4].d, x[5].d, x[6].d, x[7].d,
    );
    let sum = _mm256_setr_ps(
        x[0].sum, x[1].sum, x[2].sum, x[3].sum, x[4].sum, x[5].sum, x[6].sum, x[7].sum,
    );
    (d, sum)
}

/// 8 bytes as f32 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes_f32(b: [u8; SUBS]) -> __m256 {
    let b = _mm_cvtsi64_si128(i64::from_le_bytes(b));
    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b))
}

/// `[a.low | b.high]` and `[a.high | b.low]` (128-bit halves): their sum holds `a`'s two
/// halves added in its low half and `b`'s in its high one, so that one conversion and one
/// multiply-add serve two sub-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
fn halves(a: __m256i, b: __m256i) -> (__m256i, __m256i) {
    (
        _mm256_blend_epi32::<0xF0>(a, b),
        _mm256_permute2x128_si256::<0x21>(a, b),
    )
}

/// Lane `j` of `v` in the low half, lane `j + 1` in the high half.
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_lanes(v: __m256, j: usize) -> __m256 {
    let (a, b) = (j as i32, j as i32 + 1);
    _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(a, a, a, a, b, b, b, b))
}

/// `acc + x.d · Σ q·x·scale` in f32 lanes, from i16 pair sums `q·x` (as `maddubs` makes them)
/// and i16 weight scales. The activation scale is broadcast from memory, a load rather than a
/// shuffle.
#[target_feature(enable = "avx2,fma,f16c")]
fn scaled(acc: __m256, pairs: __m256i, scale: __m256i, x: &BlockQ8) -> __m256 {
    let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, scale));
    _mm256_fmadd_ps(_mm256_broadcast_ss(&x.d), sums, acc)
}

/// Each 32 bytes of `qs` are two sub-blocks (low and high nibbles), folded into one vector of
/// i16 sums ([`halves`]; at most 4 · 15 · 127, no overflow). Their f32 scales `d · sc · x.d`
/// and the minimums are computed in lanes, once per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4k(w: &[BlockQ4K], x: &[BlockQ8]) -> f32 {
    let low = _mm256_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut mins = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x.as_chunks::<SUBS>().0) {
        prefetch(w);
        let (d, dmin) = f16_pair([w.d[0], w.d[1], w.dmin[0], w.dmin[1]]);
        let (sc, m) = scales_mins(&w.scales);
        let (xd, xsum) = block_scales(x);
        let m = _mm256_mul_ps(bytes_f32(m), _mm256_set1_ps(dmin));
        mins = _mm256_fmadd_ps(m, _mm256_mul_ps(xd, xsum), mins);
        let scales = _mm256_mul_ps(_mm256_mul_ps(bytes_f32(sc), _mm256_set1_ps(d)), xd);
        let (qs, x) = (w.qs.as_chunks::<32>().0, x.as_chunks::<2>().0);
        for (c, (bits, [xa, xb])) in qs.iter().zip(x).enumerate() {
            let bits = load(bits);
            let lo = _mm256_and_si256(bits, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), low);
            let (t, u) = halves(
                _mm256_maddubs_epi16(lo, activations(xa)),
                _mm256_maddubs_epi16(hi, activations(xb)),
            );
            let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_add_epi16(t, u), ones));
            let acc = &mut acc[c % 2];
            *acc = _mm256_fmadd_ps(pair_lanes(scales, 2 * c), sums, *acc);
        }
    }
    hsum(_mm256_sub_ps(_mm256_add_ps(acc[0], acc[1]), mins))
}

/// Each half super-block's 3×32 bytes of `ql` and `qh` are four sub-blocks. q - 32 comes from
/// `maddubs(q, x) - maddubs(32, x)`, then `madd` applies the two i8 scales per sub-block
/// ([`scaled`]) and `d` is applied once per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q6k(w: &[BlockQ6K], x: &[BlockQ8]) -> f32 {
    let low = _mm256_set1_epi8(0xF);
    let m32 = _mm256_set1_epi8(32);
    let mut acc = _mm256_setzero_ps();
    for (w, x) in w.iter().zip(x.as_chunks::<SUBS>().0) {
        prefetch(w);
        let (d, _) = f16_pair([w.d[0], w.d[1], 0, 0]);
        // SAFETY: `scales` is 16 readable bytes; the load is unaligned.
        let sc = unsafe { _mm_loadu_si128(w.scales.as_ptr().cast()) };
        let mut sums = [_mm256_setzero_ps(); 2];
        for (h, x) in x.as_chunks::<4>().0.iter().enumerate() {
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
            for (t, (q, x)) in q.into_iter().zip(x).enumerate() {
                let a = activations(x);
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, a), _mm256_maddubs_epi16(m32, a));
                let sums = &mut sums[t % 2];
                *sums = scaled(*sums, p, sub_block_scales(scales, t), x);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_add_ps(sums[0], sums[1]), acc);
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
