//! The AVX2 dot products (llama.cpp's `ggml_vec_dot_q4_0_q8_0` and kin): 32 weights against
//! 32 activations per `_mm256_maddubs_epi16`, unsigned nibbles times signed bytes, summed in
//! eight i32 lanes and scaled into an f32 accumulator.
//!
//! Tiles of several activation rows (packed decode passes) take two weight rows per register,
//! one per 128-bit lane, as the AVX-512 kernels take four: each weight block is loaded and
//! unpacked once for all the activation rows, and each activation half-block broadcast once
//! for both weight rows.

use std::arch::x86_64::*;

use lmhost_plugin_kit::simd::Simd;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0, NibbleKind, Nibbles, BLOCK};
use super::{Tile, ROWS};

/// Proof that this CPU has AVX2, FMA and F16C (and `LMHOST_SIMD` allows them): only
/// [`Avx2::detect`] makes one.
#[derive(Clone, Copy)]
pub(super) struct Avx2(());

impl Avx2 {
    pub(super) fn detect() -> Option<Avx2> {
        let ok = Simd::Avx2.allowed()
            && is_x86_feature_detected!("avx2")
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
        // Summed as `store_pair` sums a tile's lanes.
        self.q8_0_lanes(w, x).iter().sum()
    }

    /// One Q8_0 row's four f32 lane sums on whole blocks, for a caller to add as its own
    /// tiles add theirs.
    pub(super) fn q8_0_lanes(self, w: &[BlockQ8_0], x: &[BlockQ8]) -> [f32; 4] {
        // SAFETY: as above.
        unsafe { q8_0_lanes(w, x) }
    }

    /// A lone activation row against up to four Q8_0 weight rows of `wb` blocks, into
    /// `out[j][0]`, each row's lanes added by `add` as the caller's tiles add theirs: one call
    /// a tile instead of one a row (Gemma 3's output layer has 262144 rows, 640 values each).
    pub(super) fn q8_0_lone(
        self,
        w: &[BlockQ8_0],
        wb: usize,
        x: &[BlockQ8],
        out: &mut Tile,
        add: impl Fn([f32; 4]) -> f32,
    ) {
        // SAFETY: as above.
        unsafe { q8_0_lone(w, wb, x, out, add) }
    }

    /// `lhs` (whole blocks) as [`BlockQ8`]s, each the same as [`super::Activations::blocks`]
    /// makes it (the same divisions, rounding half away from zero): a block in a few dozen
    /// instructions where the scalar loop rounds value by value, a visible share of a packed
    /// decode pass.
    pub(super) fn quantize_q8(self, lhs: &[f32], out: &mut [BlockQ8]) {
        // SAFETY: as above.
        unsafe { quantize_q8(lhs, out) }
    }

    /// Q4_0, Q4_1 and Q5_0: up to four weight rows of `wb` blocks (consecutive in `w`) against
    /// each of `xs`, into `out[j][r]`.
    pub(super) fn tile_nibbles<W: Nibbles>(
        self,
        w: &[W],
        wb: usize,
        xs: &[&[BlockQ8]],
        out: &mut Tile,
    ) {
        // SAFETY: as above.
        by_pairs(w, wb, xs.len(), out, |pair| unsafe {
            tile_nibbles(pair, wb, xs)
        })
    }

    /// Q8_0, as [`Avx2::tile_nibbles`]. One activation row (a lone decode step) goes row by
    /// row through [`dot_q8_0`], with the same result: its whole-block loads stream a large
    /// output layer about twice as fast as the lane pairs, which pay off only when several rows
    /// share each pair.
    pub(super) fn tile_q8_0(self, w: &[BlockQ8_0], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        if let [x] = xs {
            // As `dot_q8_0` adds them.
            return self.q8_0_lone(w, wb, x, out, |l| l.iter().sum());
        }
        // SAFETY: as above.
        by_pairs(w, wb, xs.len(), out, |pair| unsafe {
            tile_q8_0(pair, wb, xs)
        })
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8(lhs: &[f32], blocks: &mut [BlockQ8]) {
    let sign = _mm256_set1_ps(-0.0);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    for (x, block) in lhs.chunks_exact(BLOCK).zip(blocks) {
        let (x, _) = x.as_chunks::<8>();
        // SAFETY: each chunk is 8 readable f32; the loads are unaligned.
        let v: [__m256; 4] = std::array::from_fn(|c| unsafe { _mm256_loadu_ps(x[c].as_ptr()) });
        let abs = v.map(|v| _mm256_andnot_ps(sign, v));
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        // Half away from zero, as `f32::round`: truncate, then step away from zero where
        // the (exact) fraction left is at least a half.
        let q = v.map(|v| {
            let y = _mm256_mul_ps(v, id);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
            let away = _mm256_or_ps(_mm256_and_ps(y, sign), one);
            let step = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), away);
            _mm256_cvttps_epi32(_mm256_add_ps(t, step))
        });
        // At most 32 · 127 in magnitude: exact in f32, as every partial sum is.
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let sum = hsum(_mm256_cvtepi32_ps(sum)) as i32;
        // i32 → i8 (saturating, as `as i8` does), the packs' lane interleave undone.
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut qs = [0i8; BLOCK];
        // SAFETY: `qs` is 32 writable bytes; the store is unaligned.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), bytes) };
        *block = BlockQ8::new(d, sum, qs);
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

/// Q5_0's fifth bits: 0x10 in byte j where bit j of `qh` is set, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fifth_bits(qh: [u8; 4]) -> __m256i {
    // Byte j gets byte j / 8 of `qh`, then keeps bit j % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(i32::from_le_bytes(qh)),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
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

/// [`Avx2::q8_0_lone`]: [`q8_0_lanes`] of each row, added by `add`, in one call.
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_lone(
    w: &[BlockQ8_0],
    wb: usize,
    x: &[BlockQ8],
    out: &mut Tile,
    add: impl Fn([f32; 4]) -> f32,
) {
    for (w, out) in w.chunks_exact(wb).zip(out.iter_mut()) {
        out[0] = add(q8_0_lanes(w, x));
    }
}

/// Whole 32-byte blocks, with [`tile_q8_0`]'s arithmetic: each block's two halves' integer
/// sums added before conversion, into four f32 lanes, which the caller sums as its tiles do
/// (`store_pair` here, `store` in `avx512.rs`). So a row alone gets bit for bit what it gets
/// in a tile, and batching never changes a greedy reply.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_lanes(w: &[BlockQ8_0], x: &[BlockQ8]) -> [f32; 4] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm_setzero_ps();
    for (w, x) in w.iter().zip(x) {
        prefetch(w);
        let (dw, _) = f16_pair([w.d[0], w.d[1], 0, 0]);
        // SAFETY: `qs` is 32 readable bytes; the load is unaligned.
        let q = unsafe { _mm256_loadu_si256(w.qs.as_ptr().cast()) };
        // Signed × signed through maddubs: |q| times x with q's sign moved onto x.
        let pairs =
            _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(activations(x), q));
        let sums = _mm256_madd_epi16(pairs, ones);
        let sums = _mm_add_epi32(
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        );
        acc = _mm_fmadd_ps(_mm_set1_ps(dw * x.d), _mm_cvtepi32_ps(sums), acc);
    }
    let mut lanes = [0f32; 4];
    // SAFETY: `lanes` is 4 writable f32; the store is unaligned.
    unsafe { _mm_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes
}

/// How far ahead of the block being read the weight kernels ask for the next ones. A decode
/// step streams every weight from memory once, and the hardware prefetcher alone leaves a
/// large output layer waiting on memory; shorter distances gained less, longer ones no more.
const PREFETCH: usize = 2048;

/// Hints the cache to load the bytes [`PREFETCH`] past `block`: a hint, never a read, so an
/// address past the end of the weights is harmless.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch<T>(block: &T) {
    _mm_prefetch::<_MM_HINT_T0>((block as *const T).cast::<i8>().wrapping_add(PREFETCH));
}

/// Two rows' 16-byte pieces as the two 128-bit lanes, `a` low.
///
/// # Safety
/// Each pointer must have 16 readable bytes behind it (the loads are unaligned).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes(a: *const u8, b: *const u8) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe { _mm256_loadu2_m128i(b.cast(), a.cast()) }
}

/// 16 bytes of an activation block from `at`, in both lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn broadcast(x: &BlockQ8, at: usize) -> __m256i {
    let half = &x.qs[at..at + 16];
    // SAFETY: `half` is 16 readable bytes; the load is unaligned.
    _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(half.as_ptr().cast()) })
}

/// Two rows' f16 `(d, m)` as `(d, m)` vectors, each spread over its row's lane.
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_scales(a: [u8; 4], b: [u8; 4]) -> (__m256, __m256) {
    let both = _mm_cvtph_ps(_mm_set_epi32(
        0,
        0,
        i32::from_le_bytes(b),
        i32::from_le_bytes(a),
    ));
    let both = _mm256_castps128_ps256(both);
    (
        _mm256_permutevar8x32_ps(both, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)),
        _mm256_permutevar8x32_ps(both, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3)),
    )
}

/// Each weight-row pair of `w` (a lone last row alone) through `pair`, into `out`.
fn by_pairs<W>(
    w: &[W],
    wb: usize,
    rows: usize,
    out: &mut Tile,
    pair: impl Fn(&[W]) -> [[f32; 8]; ROWS],
) {
    for (j, w) in w.chunks(2 * wb).enumerate() {
        store_pair(&pair(w), rows, j, out);
    }
}

/// The accumulators' lanes as f32. A loop: a `map` closure would compile without the target
/// features and call each store.
#[target_feature(enable = "avx2,fma,f16c")]
fn spill(acc: [__m256; ROWS]) -> [[f32; 8]; ROWS] {
    let mut out = [[0f32; 8]; ROWS];
    for (lanes, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `lanes` is 8 writable f32; the store is unaligned.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    }
    out
}

/// Each accumulator's two lanes summed: `out[2j][r]` from the low lane of `acc[r]`,
/// `out[2j + 1][r]` from the high one (when the tile has that row).
fn store_pair(acc: &[[f32; 8]; ROWS], rows: usize, j: usize, out: &mut Tile) {
    for (r, acc) in acc.iter().enumerate().take(rows) {
        let (lo, hi) = acc.split_at(4);
        out[2 * j][r] = lo.iter().sum();
        if let Some(out) = out.get_mut(2 * j + 1) {
            out[r] = hi.iter().sum();
        }
    }
}

/// One or two weight rows of `wb` blocks against each of `xs`: lane sums per activation row,
/// the first weight row's in f32 lanes 0..4, the second's in 4..8. A lone row fills both.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_nibbles<W: Nibbles>(w: &[W], wb: usize, xs: &[&[BlockQ8]]) -> [[f32; 8]; ROWS] {
    let (a, b) = (&w[..wb], &w[w.len() - wb..]);
    let mask = _mm256_set1_epi8(0xF);
    let ones = _mm256_set1_epi16(1);
    let offset = W::KIND.quarter_offset();
    let mut acc = [_mm256_setzero_ps(); ROWS];
    for (i, (a, b)) in a.iter().zip(b).enumerate() {
        prefetch(a);
        prefetch(b);
        let (a, b) = (a.parts(), b.parts());
        // SAFETY: each block's nibbles are 16 bytes.
        let q = unsafe { lanes(a.0.as_ptr(), b.0.as_ptr()) };
        let (mut lo, mut hi) = (
            _mm256_and_si256(q, mask),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask),
        );
        if W::KIND == NibbleKind::Q5_0 {
            // Bits 0..16 of each row's `qh` go with its low nibbles, 16..32 with the high.
            let bits_lo = (a.2 & 0xFFFF) | b.2 << 16;
            let bits_hi = a.2 >> 16 | (b.2 & 0xFFFF_0000);
            lo = _mm256_or_si256(lo, fifth_bits(bits_lo.to_le_bytes()));
            hi = _mm256_or_si256(hi, fifth_bits(bits_hi.to_le_bytes()));
        }
        let (d, m) = pair_scales(a.1, b.1);
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[i];
            // Pair sums at most 2 · 31 · 127 each, two of them fit an i16.
            let pairs = _mm256_add_epi16(
                _mm256_maddubs_epi16(lo, broadcast(x, 0)),
                _mm256_maddubs_epi16(hi, broadcast(x, 16)),
            );
            let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            let dx = _mm256_mul_ps(d, _mm256_broadcast_ss(&x.d));
            *acc = _mm256_fmadd_ps(dx, sums, *acc);
            *acc = match W::KIND {
                NibbleKind::Q4_1 => _mm256_fmadd_ps(m, _mm256_set1_ps(0.25 * x.s), *acc),
                _ => _mm256_fmadd_ps(dx, _mm256_set1_ps(offset * x.sum), *acc),
            };
        }
    }
    spill(acc)
}

/// As [`tile_nibbles`] for Q8_0: signed × signed through `maddubs` as in [`dot_q8_0`], the
/// weights' absolute values taken once per block for every activation row.
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q8_0(w: &[BlockQ8_0], wb: usize, xs: &[&[BlockQ8]]) -> [[f32; 8]; ROWS] {
    let (a, b) = (&w[..wb], &w[w.len() - wb..]);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); ROWS];
    for (i, (a, b)) in a.iter().zip(b).enumerate() {
        prefetch(a);
        prefetch(b);
        // SAFETY: each block's values are 32 bytes, read as two halves of 16.
        let (lo, hi) = unsafe {
            let (pa, pb) = (a.qs.as_ptr().cast::<u8>(), b.qs.as_ptr().cast::<u8>());
            (lanes(pa, pb), lanes(pa.add(16), pb.add(16)))
        };
        let (alo, ahi) = (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi));
        let (d, _) = pair_scales([a.d[0], a.d[1], 0, 0], [b.d[0], b.d[1], 0, 0]);
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[i];
            // Pair sums up to 2 · 128 · 127 each: widened to i32 before they are added.
            let plo = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(broadcast(x, 0), lo));
            let phi = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(broadcast(x, 16), hi));
            let sums = _mm256_add_epi32(_mm256_madd_epi16(plo, ones), _mm256_madd_epi16(phi, ones));
            let dx = _mm256_mul_ps(d, _mm256_broadcast_ss(&x.d));
            *acc = _mm256_fmadd_ps(dx, _mm256_cvtepi32_ps(sums), *acc);
        }
    }
    spill(acc)
}
