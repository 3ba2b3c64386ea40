//! The AVX-512 VNNI dot products. On stored blocks four weight rows are computed together, one
//! per 128-bit lane: the lanes take block `i` of each row, the activation block is broadcast
//! to all four, and `vpdpbusd` sums four u8 × i8 products straight into each i32 lane (AVX2
//! needs two instructions and a detour through i16). The four rows' f16 scales convert in one
//! instruction, and each loaded weight block serves up to [`ROWS`] activation rows. On
//! [`super::interleaved`] groups each 32-bit lane is one of 16 rows.

use std::arch::x86_64::*;

use lmhost_plugin_kit::simd::Simd;

use super::avx2::{prefetch, Avx2};
use super::blocks::{BlockQ8, BlockQ8_0, NibbleKind, Nibbles};
use super::{Tile, GROUP, ROWS, WROWS};

/// Proof that this CPU has AVX-512 F, BW and VNNI, and AVX2, FMA and F16C (and `LMHOST_SIMD`
/// allows them): only [`Avx512::detect`] makes one.
#[derive(Clone, Copy)]
pub(super) struct Avx512(Avx2);

impl Avx512 {
    pub(super) fn detect() -> Option<Avx512> {
        let avx2 = Avx2::detect()?;
        let ok = Simd::Avx512.allowed()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni");
        ok.then_some(Avx512(avx2))
    }

    /// The AVX2 kernels, which this CPU runs too.
    pub(super) fn avx2(self) -> Avx2 {
        self.0
    }

    /// Q4_0, Q4_1 and Q5_0.
    pub(super) fn dot_nibbles<W: Nibbles>(
        self,
        w: &[W],
        wb: usize,
        xs: &[&[BlockQ8]],
        out: &mut Tile,
    ) {
        // SAFETY: `self` exists only where the features were detected.
        unsafe { dot_nibbles(w, wb, xs, out) }
    }

    /// One group of [`super::interleaved`] rows of `kb` blocks against each of `xs` (at most
    /// [`ROWS`]): `[r][l]` is row `l` · `xs[r]`.
    pub(super) fn interleaved<W: Nibbles>(
        self,
        group: &[u8],
        kb: usize,
        xs: &[&[BlockQ8]],
    ) -> [[f32; GROUP]; ROWS] {
        assert_eq!(group.len(), GROUP * kb * size_of::<W>(), "a whole group");
        // SAFETY: `self` exists only where the features were detected; the group's length was
        // checked. One copy per row count keeps the accumulators in registers.
        unsafe {
            match xs.len() {
                1 => interleaved::<W, 1>(group, kb, xs),
                2 => interleaved::<W, 2>(group, kb, xs),
                3 => interleaved::<W, 3>(group, kb, xs),
                4 => interleaved::<W, 4>(group, kb, xs),
                5 => interleaved::<W, 5>(group, kb, xs),
                6 => interleaved::<W, 6>(group, kb, xs),
                7 => interleaved::<W, 7>(group, kb, xs),
                _ => interleaved::<W, ROWS>(group, kb, xs),
            }
        }
    }

    /// One group of [`super::interleaved`] Q8_0 rows of `kb` blocks against each of `xs` (at
    /// most [`ROWS`]): `[r][l]` is row `l` · `xs[r]`.
    pub(super) fn interleaved_q8_0(
        self,
        group: &[u8],
        kb: usize,
        xs: &[&[BlockQ8]],
    ) -> [[f32; GROUP]; ROWS] {
        assert_eq!(
            group.len(),
            GROUP * kb * size_of::<BlockQ8_0>(),
            "a whole group"
        );
        // SAFETY: as `interleaved`.
        unsafe {
            match xs.len() {
                1 => interleaved_q8_0::<1>(group, kb, xs),
                2 => interleaved_q8_0::<2>(group, kb, xs),
                3 => interleaved_q8_0::<3>(group, kb, xs),
                4 => interleaved_q8_0::<4>(group, kb, xs),
                5 => interleaved_q8_0::<5>(group, kb, xs),
                6 => interleaved_q8_0::<6>(group, kb, xs),
                7 => interleaved_q8_0::<7>(group, kb, xs),
                _ => interleaved_q8_0::<ROWS>(group, kb, xs),
            }
        }
    }

    /// A lone activation row runs row by row on whole blocks through AVX2's arithmetic, which
    /// streams a large matrix from memory at about twice the speed of four rows' 16-byte lanes
    /// (`bench_kernels`); its lanes are
    /// summed as [`store`] sums a tile's, so the row alone equals the row in a tile.
    pub(super) fn dot_q8_0(self, w: &[BlockQ8_0], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        if let [x] = xs {
            let add = |l: [f32; 4]| (l[0] + l[2]) + (l[1] + l[3]);
            return self.avx2().q8_0_lone(w, wb, x, out, add);
        }
        // SAFETY: as above.
        unsafe { dot_q8_0(w, wb, xs, out) }
    }
}

/// The first block of each of the (up to four) rows in `w`, `wb` blocks apart; missing rows
/// repeat the last one (their sums are never read).
fn row_starts<W>(w: &[W], wb: usize) -> [&[W]; WROWS] {
    let rows = w.len() / wb;
    std::array::from_fn(|j| &w[j.min(rows - 1) * wb..])
}

/// 16 bytes from each of four places, as the four 128-bit lanes.
///
/// # Safety
/// Each pointer must have 16 readable bytes behind it (the loads are unaligned).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn lanes(p: [*const u8; 4]) -> __m512i {
    // SAFETY: the caller's promise.
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(p[0].cast()));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[1].cast()));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[2].cast()));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[3].cast()))
    }
}

/// Four blocks' f16 scale and minimum as `(d, m)`, each spread over its row's lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn scales(heads: [[u8; 4]; 4]) -> (__m512, __m512) {
    let h = heads.map(i32::from_le_bytes);
    let both = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_set_epi32(h[3], h[2], h[1], h[0])));
    let d = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
    let m = _mm512_set_epi32(7, 7, 7, 7, 5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1);
    (
        _mm512_permutexvar_ps(d, both),
        _mm512_permutexvar_ps(m, both),
    )
}

/// An activation block's values 0..16 and 16..32, each broadcast to the four lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn broadcast(x: &BlockQ8) -> (__m512i, __m512i) {
    // SAFETY: `qs` is 32 readable bytes; the loads are unaligned.
    unsafe {
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(x.qs.as_ptr().cast())),
            _mm512_broadcast_i32x4(_mm_loadu_si128(x.qs.as_ptr().add(16).cast())),
        )
    }
}

/// Each lane's four f32 summed: `out[j][r]` = the sum of lane `j` of `acc[r]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn store(acc: &[__m512; ROWS], rows: usize, out: &mut Tile) {
    for (r, acc) in acc.iter().enumerate().take(rows) {
        let lanes = [
            _mm512_extractf32x4_ps::<0>(*acc),
            _mm512_extractf32x4_ps::<1>(*acc),
            _mm512_extractf32x4_ps::<2>(*acc),
            _mm512_extractf32x4_ps::<3>(*acc),
        ];
        for (out, lane) in out.iter_mut().zip(lanes) {
            let s = _mm_add_ps(lane, _mm_movehl_ps(lane, lane));
            out[r] = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn dot_nibbles<W: Nibbles>(w: &[W], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
    let rows = row_starts(w, wb);
    let mask = _mm512_set1_epi8(0xF);
    let fifth = _mm512_set1_epi8(0x10);
    let offset = W::KIND.quarter_offset();
    let mut acc = [_mm512_setzero_ps(); ROWS];
    for i in 0..wb {
        rows.iter().for_each(|row| prefetch(&row[i]));
        let blocks = rows.map(|row| row[i].parts());
        // SAFETY: each block's nibbles are 16 bytes.
        let q = unsafe { lanes(blocks.map(|b| b.0.as_ptr())) };
        let (mut lo, mut hi) = (
            _mm512_and_si512(q, mask),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q), mask),
        );
        if W::KIND == NibbleKind::Q5_0 {
            // Bits 0..16 of each row's `qh` go with its low nibbles, 16..32 with the high.
            let [a, b, c, d] = blocks.map(|b| u64::from(b.2));
            let low = |h: u64| h & 0xFFFF;
            let bits_lo = low(a) | low(b) << 16 | low(c) << 32 | low(d) << 48;
            let bits_hi = a >> 16 | (b >> 16) << 16 | (c >> 16) << 32 | (d >> 16) << 48;
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_movm_epi8(bits_lo), fifth));
            hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_movm_epi8(bits_hi), fifth));
        }
        let (d, m) = scales(blocks.map(|b| b.1));
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[i];
            let (xlo, xhi) = broadcast(x);
            let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo);
            let sums = _mm512_dpbusd_epi32(sums, hi, xhi);
            let dx = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
            *acc = _mm512_fmadd_ps(dx, _mm512_cvtepi32_ps(sums), *acc);
            *acc = match W::KIND {
                NibbleKind::Q4_1 => _mm512_fmadd_ps(m, _mm512_set1_ps(0.25 * x.s), *acc),
                _ => _mm512_fmadd_ps(dx, _mm512_set1_ps(offset * x.sum), *acc),
            };
        }
    }
    store(&acc, xs.len(), out);
}

/// Each 32-bit lane takes one row: its block's 32 products, four at a time against the same
/// four activations broadcast to every lane, an exact integer sum (offset by `-8` or `-16`
/// times the activations' sum for Q4_0 and Q5_0), then scaled once.
///
/// # Safety
/// `group` must be `GROUP · kb` blocks of `W` in the interleaved layout.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn interleaved<W: Nibbles, const N: usize>(
    group: &[u8],
    kb: usize,
    xs: &[&[BlockQ8]],
) -> [[f32; GROUP]; ROWS] {
    let xs = &xs[..N];
    let bytes = GROUP * size_of::<W>();
    let pieces = bytes - 4 * 64;
    let mask = _mm512_set1_epi8(0xF);
    let fifth = _mm512_set1_epi8(0x10);
    // Q5_0: byte `t` of lane `l`'s piece `c` takes bit `4c + t` of the row's `qh` (low
    // nibbles) or bit `16 + 4c + t` (high): the byte of `qh >> 4c` that holds it, copied to
    // the lane's four bytes, tested against bit `t`.
    let spread = _mm512_set_epi32(
        0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C,
        0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0,
    );
    let spread_hi = _mm512_add_epi8(spread, _mm512_set1_epi8(2));
    let bit = _mm512_set1_epi32(0x0804_0201);
    let offset = match W::KIND {
        NibbleKind::Q4_0 => -8,
        NibbleKind::Q4_1 => 0,
        NibbleKind::Q5_0 => -16,
    };
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..kb {
        // SAFETY: block `i` of the group is `bytes` long (the caller's promise); the loads are
        // unaligned, and a prefetch past the end reads nothing.
        let (d, extra, q) = unsafe {
            let p = group.as_ptr().add(i * bytes);
            ahead(p, bytes);
            let q: [__m512i; 4] =
                std::array::from_fn(|c| _mm512_loadu_si512(p.add(pieces + 64 * c).cast()));
            (_mm512_cvtph_ps(_mm256_loadu_si256(p.cast())), p.add(32), q)
        };
        let mut lo = q.map(|q| _mm512_and_si512(q, mask));
        let mut hi = q.map(|q| _mm512_and_si512(_mm512_srli_epi16::<4>(q), mask));
        let min = match W::KIND {
            // SAFETY: Q4_1's 32 bytes of minimums follow the scales.
            NibbleKind::Q4_1 => Some(_mm512_cvtph_ps(unsafe { _mm256_loadu_si256(extra.cast()) })),
            _ => None,
        };
        if W::KIND == NibbleKind::Q5_0 {
            // SAFETY: Q5_0's 64 bytes of `qh` follow the scales.
            let qh = unsafe { _mm512_loadu_si512(extra.cast()) };
            for c in 0..4 {
                let h = _mm512_srl_epi32(qh, _mm_cvtsi32_si128(4 * c as i32));
                let (l, u) = (
                    _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, spread), bit),
                    _mm512_test_epi8_mask(_mm512_shuffle_epi8(h, spread_hi), bit),
                );
                lo[c] = _mm512_mask_add_epi8(lo[c], l, lo[c], fifth);
                hi[c] = _mm512_mask_add_epi8(hi[c], u, hi[c], fifth);
            }
        }
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[i];
            let start = _mm512_set1_epi32(offset * x.sum as i32);
            let (mut s0, mut s1) = (
                _mm512_dpbusd_epi32(start, lo[0], quad(x, 0)),
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], quad(x, 4)),
            );
            for c in 1..4 {
                s0 = _mm512_dpbusd_epi32(s0, lo[c], quad(x, c));
                s1 = _mm512_dpbusd_epi32(s1, hi[c], quad(x, 4 + c));
            }
            let sums = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x.d)), sums, *acc);
            if let Some(min) = min {
                *acc = _mm512_fmadd_ps(min, _mm512_set1_ps(x.s), *acc);
            }
        }
    }
    lane_sums(&acc)
}

/// Values `4c..4c+4` of an activation block, the same four bytes in every 32-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn quad(x: &BlockQ8, c: usize) -> __m512i {
    let q = &x.qs[4 * c..4 * c + 4];
    _mm512_set1_epi32(i32::from_le_bytes(
        [q[0], q[1], q[2], q[3]].map(|v| v as u8),
    ))
}

/// The interleaved kernels' result: `[r][l]`, lane `l` of activation row `r`'s accumulator.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn lane_sums<const N: usize>(acc: &[__m512; N]) -> [[f32; GROUP]; ROWS] {
    let mut out = [[0f32; GROUP]; ROWS];
    for (out, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `out` is 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *acc) };
    }
    out
}

/// How far ahead of the group block being read the interleaved kernels ask for each of a
/// block's cache lines, as the stored kernels do ([`super::avx2`]'s `PREFETCH`). Q4_1's had
/// asked for one line of each block's five, four blocks ahead; asking for every line is
/// faster (`bench_batch`, runs in turns).
const AHEAD: usize = 2048;

/// Asks the cache for the `bytes` of a group block [`AHEAD`] past `p`: a hint, never a read,
/// so an address past the end of the weights is harmless.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn ahead(p: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD + line).cast());
    }
}

/// [`interleaved`] for Q8_0, whose interleaved values are stored offset by 128 (unsigned, as
/// `vpdpbusd` wants one operand): each activation row's sum starts at `-128 · Σ x`.
///
/// # Safety
/// `group` must be `GROUP · kb` Q8_0 blocks in the interleaved layout.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn interleaved_q8_0<const N: usize>(
    group: &[u8],
    kb: usize,
    xs: &[&[BlockQ8]],
) -> [[f32; GROUP]; ROWS] {
    let xs = &xs[..N];
    let bytes = GROUP * size_of::<BlockQ8_0>();
    let mut acc = [_mm512_setzero_ps(); N];
    for i in 0..kb {
        // SAFETY: block `i` of the group is `bytes` long: 32 bytes of scales, then eight
        // 64-byte pieces (the caller's promise); the loads are unaligned, and a prefetch past
        // the end reads nothing.
        let (d, q) = unsafe {
            let p = group.as_ptr().add(i * bytes);
            ahead(p, bytes);
            let q: [__m512i; 8] =
                std::array::from_fn(|c| _mm512_loadu_si512(p.add(32 + 64 * c).cast()));
            (_mm512_cvtph_ps(_mm256_loadu_si256(p.cast())), q)
        };
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[i];
            let start = _mm512_set1_epi32(-128 * x.sum as i32);
            // Four independent sums: a lone row's blocks are a chain of `vpdpbusd`s otherwise.
            let zero = _mm512_setzero_si512();
            let mut s = [start, zero, zero, zero];
            for c in 0..8 {
                s[c % 4] = _mm512_dpbusd_epi32(s[c % 4], q[c], quad(x, c));
            }
            let (s0, s1) = (_mm512_add_epi32(s[0], s[2]), _mm512_add_epi32(s[1], s[3]));
            let sums = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            *acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x.d)), sums, *acc);
        }
    }
    lane_sums(&acc)
}

/// Signed weights: `vpdpbusd` wants one unsigned operand, so the activations are offset by
/// 128 (a sign-bit flip, once per block for all four rows) and each row's `128 · Σ q` starts
/// its sum negative.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn dot_q8_0(w: &[BlockQ8_0], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
    let rows = row_starts(w, wb);
    let flip = _mm512_set1_epi8(i8::MIN);
    let ones = _mm512_set1_epi8(1);
    let mut acc = [_mm512_setzero_ps(); ROWS];
    for i in 0..wb {
        rows.iter().for_each(|row| prefetch(&row[i]));
        let blocks = rows.map(|row| &row[i]);
        // SAFETY: each block's values are 32 bytes, read as two halves of 16.
        let (lo, hi) = unsafe {
            (
                lanes(blocks.map(|b| b.qs.as_ptr().cast())),
                lanes(blocks.map(|b| b.qs.as_ptr().add(16).cast())),
            )
        };
        let q_sum = _mm512_dpbusd_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, lo),
            ones,
            hi,
        );
        let start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(q_sum));
        let heads = blocks.map(|b| [b.d[0], b.d[1], 0, 0]);
        let (d, _) = scales(heads);
        for (acc, x) in acc.iter_mut().zip(xs) {
            let x = &x[i];
            let (xlo, xhi) = broadcast(x);
            let sums = _mm512_dpbusd_epi32(start, _mm512_xor_si512(xlo, flip), lo);
            let sums = _mm512_dpbusd_epi32(sums, _mm512_xor_si512(xhi, flip), hi);
            let dx = _mm512_mul_ps(d, _mm512_set1_ps(x.d));
            *acc = _mm512_fmadd_ps(dx, _mm512_cvtepi32_ps(sums), *acc);
        }
    }
    store(&acc, xs.len(), out);
}
