//! `x Wᵀ` in bfloat16 dot products with f32 sums (`weights = "bf16"`): W rounded to bf16 once
//! at load, each activation row rounded as it comes, every pair of products added into an f32
//! accumulator by AVX-512 BF16's `vdpbf16ps`, which does twice the multiply-adds of an f32
//! FMA per instruction. Everything between the matrix products (norms, attention, residuals,
//! softmax) stays f32, so the values move far less than with bf16 compute throughout or
//! 8-bit activations (docs/candle.md has the figures); only attention's own products over a
//! shared cached prefix run through these panels too (`sdpa_bf16`, [`Packed::tile`]).
//!
//! W is laid out in panels of [`LANES`] output columns, each holding, for each pair of input
//! positions, the two weights of every column side by side (one 512-bit load); a tile of up
//! to [`TILE`] rows meets [`WIDE`] panels in registers. Every output is one chain of `vdpbf16ps`
//! over the input pairs in order, so a row's result does not depend on how many rows share
//! its call or where it falls in a tile.

use std::ops::Range;

use rayon::prelude::*;

/// Output columns per panel: the f32 lanes of a 512-bit register.
pub const LANES: usize = 16;

/// Panels a register tile spans.
pub const WIDE: usize = 4;

/// Rows per register tile: 24 accumulators (`WIDE` panels each), `WIDE` panel loads and a
/// broadcast of AVX-512's 32 registers; each step loads 10 registers for 24 instructions.
pub const TILE: usize = 6;

/// Rows per task block: a block's rounded inputs stay in the L2 cache while panels pass by.
const BLOCK: usize = 96;

/// A `(n, k)` matrix in bf16 pairs, laid out for [`Packed::matmul`].
#[derive(Debug, Clone)]
pub struct Packed {
    n: usize,
    k: usize,
    /// Panel `p` holds, for each pair `t` of input positions, `LANES` words: column `c`'s
    /// weights `2t` (low half) and `2t + 1` (high half). The last panel and an odd `k` are
    /// padded with zeros.
    panels: Vec<u32>,
}

impl Packed {
    /// Rounds the row-major `(n, k)` matrix `w` to bf16 and packs it, where this CPU has the
    /// instructions (AVX-512 F and BF16); `None` elsewhere.
    pub fn new(w: &[f32], (n, k): (usize, usize)) -> Option<Packed> {
        if w.len() != n * k {
            return None;
        }
        Packed::from_rows((n, k), |j, row| {
            row.copy_from_slice(&w[j * k..][..k]);
            true
        })
    }

    /// [`Packed::new`] of the `(n, k)` matrix whose row `j` `fill(j, row)` writes (`false` if
    /// it cannot): a quantized matrix is rounded from its blocks a row at a time, with no f32
    /// copy of it whole. Panels are filled in parallel on the current rayon pool.
    pub fn from_rows(
        (n, k): (usize, usize),
        fill: impl Fn(usize, &mut [f32]) -> bool + Sync,
    ) -> Option<Packed> {
        if !available() || n == 0 || k == 0 {
            return None;
        }
        let pairs = k.div_ceil(2);
        let mut panels = vec![0u32; n.div_ceil(LANES) * LANES * pairs];
        let filled = panels
            .par_chunks_mut(LANES * pairs)
            // A task's panels are a few microseconds each: enough of them to outweigh its cost.
            .with_min_len(8)
            .enumerate()
            .map_init(
                || (vec![0f32; k], vec![0u32; pairs]),
                |(row, words), (p, panel)| {
                    for j in p * LANES..n.min((p + 1) * LANES) {
                        if !fill(j, row) {
                            return false;
                        }
                        // SAFETY: `available()` was checked above.
                        unsafe { avx512::round(row, words) };
                        for (t, &word) in words.iter().enumerate() {
                            panel[t * LANES + j % LANES] = word;
                        }
                    }
                    true
                },
            )
            .all(|ok| ok);
        filled.then_some(Packed { n, k, panels })
    }

    /// [`Packed::new`] of `wᵀ`, for `w` row-major `(k, n)`: attention's values, whose rows are
    /// keys, as the matrix that weights over the keys multiply.
    pub fn transposed(w: &[f32], (k, n): (usize, usize)) -> Option<Packed> {
        if !available() || w.len() != n * k || n == 0 || k == 0 {
            return None;
        }
        let pairs = k.div_ceil(2);
        let mut panels = vec![0u32; n.div_ceil(LANES) * LANES * pairs];
        let (mut low, mut high) = (vec![0u16; n], vec![0u16; n]);
        for (t, two) in w.chunks(2 * n).enumerate() {
            let (first, second) = two.split_at(n);
            // SAFETY: `available()` was checked above.
            unsafe { avx512::round_halves(first, &mut low) };
            match second.is_empty() {
                // SAFETY: as above.
                false => unsafe { avx512::round_halves(second, &mut high) },
                true => high.fill(0),
            }
            for (c, (&lo, &hi)) in low.iter().zip(&high).enumerate() {
                panels[c / LANES * LANES * pairs + t * LANES + c % LANES] =
                    u32::from(lo) | u32::from(hi) << 16;
            }
        }
        Some(Packed { n, k, panels })
    }

    /// `row` rounded to bf16 as this matrix was, one value to each of `to`'s halfwords (each
    /// two of them one word of the inputs [`Packed::tile`] takes).
    pub fn round(&self, row: &[f32], to: &mut [u16]) {
        assert_eq!(row.len(), to.len(), "one halfword per value");
        // SAFETY: a `Packed` is made only where `available()`.
        unsafe { avx512::round_halves(row, to) }
    }

    /// `row` rounded to bf16 pairs as this matrix was, the inputs [`Packed::tile`] takes (an
    /// odd last value paired with zero).
    pub fn round_pairs(&self, row: &[f32], to: &mut [u32]) {
        assert_eq!(row.len().div_ceil(2), to.len(), "one word per pair");
        // SAFETY: a `Packed` is made only where `available()`.
        unsafe { avx512::round(row, to) }
    }

    /// `acc[r][c] = Σₜ x[r][t - pairs.start] · W[16·first + c][t]` over pairs `t` in `pairs`:
    /// up to [`TILE`] rows of `x` (bf16 pairs, `stride` words apart) against the [`WIDE`]
    /// panels from `first` (past the last panel, it again; columns past `n` are zero), each
    /// output one chain of products in order.
    pub fn tile(
        &self,
        x: &[u32],
        stride: usize,
        pairs: Range<usize>,
        first: usize,
        acc: &mut [[f32; WIDE * LANES]],
    ) {
        let all = self.k.div_ceil(2);
        assert!(
            pairs.end <= all && pairs.len() <= stride,
            "pairs {pairs:?} of {all}"
        );
        assert!(!acc.is_empty() && acc.len() <= TILE, "{} rows", acc.len());
        assert!(
            x.len() >= (acc.len() - 1) * stride + pairs.len(),
            "{} words",
            x.len()
        );
        let last = self.n.div_ceil(LANES) - 1;
        let wide: [&[u32]; WIDE] = std::array::from_fn(|i| {
            &self.panels[(first + i).min(last) * LANES * all + pairs.start * LANES..]
        });
        // SAFETY: a `Packed` is made only where `available()`; `x` holds the rows (asserted
        // above) and each panel holds pairs `pairs` past its start.
        unsafe { avx512::tile(x, stride, pairs.len(), wide, acc) };
    }

    /// `(n, k)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// Row `j` of the matrix as stored (bf16 values, widened) into `out`; `false` if there is
    /// no row `j` or `out` is not `k` long.
    pub fn row_into(&self, j: usize, out: &mut [f32]) -> bool {
        if j >= self.n || out.len() != self.k {
            return false;
        }
        let pairs = self.k.div_ceil(2);
        let panel = &self.panels[j / LANES * LANES * pairs..][..LANES * pairs];
        for (i, o) in out.iter_mut().enumerate() {
            let word = panel[i / 2 * LANES + j % LANES];
            *o = f32::from_bits(if i % 2 == 0 {
                word << 16
            } else {
                word & 0xFFFF_0000
            });
        }
        true
    }

    /// `out = x Wᵀ`: `x` is `(m, k)` row-major f32, `out` `(m, n)`. On the current rayon pool,
    /// split over blocks of rows and runs of panels.
    pub fn matmul(&self, x: &[f32], out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        let m = x.len() / k;
        assert_eq!(x.len(), m * k, "input rows of {k}");
        assert_eq!(out.len(), m * n, "output rows of {n}");
        if m == 0 {
            return;
        }
        let pairs = k.div_ceil(2);
        let mut rounded = vec![0u32; m * pairs];
        rounded
            .par_chunks_mut(pairs)
            .zip(x.par_chunks(k))
            // SAFETY: `available()` was checked when this matrix was packed.
            .for_each(|(to, row)| unsafe { avx512::round(row, to) });
        // Work in `WIDE` panels at a time (the tile's width); a last short step repeats its
        // last panel, whose copies are not written.
        let panels = n.div_ceil(LANES);
        let steps = panels.div_ceil(WIDE);
        // Blocks of about equal rows (whole tiles), and enough tasks that the pool's threads
        // end together.
        let blocks = m.div_ceil(BLOCK);
        let block = m.div_ceil(blocks).div_ceil(TILE) * TILE;
        let runs = (8 * rayon::current_num_threads())
            .div_ceil(blocks)
            .clamp(1, steps);
        let per_run = steps.div_ceil(runs);
        let out = SendPtr(out.as_mut_ptr());
        (0..blocks * runs).into_par_iter().for_each(|task| {
            let (b, run) = (task / runs, task % runs);
            let rows = (b * block).min(m)..m.min((b + 1) * block);
            // Each tile's sums overwrite its rows of `acc` whole.
            let mut acc = [[0f32; WIDE * LANES]; TILE];
            for step in run * per_run..steps.min((run + 1) * per_run) {
                let first = WIDE * step;
                let width = (WIDE * LANES).min(n - first * LANES);
                let wide: [&[u32]; WIDE] = std::array::from_fn(|i| {
                    let p = (first + i).min(panels - 1);
                    &self.panels[p * LANES * pairs..][..LANES * pairs]
                });
                for tile in rows.clone().step_by(TILE) {
                    let r = TILE.min(rows.end - tile);
                    let x = &rounded[tile * pairs..(tile + r) * pairs];
                    // SAFETY: `available()` was checked when this matrix was packed; `x` holds
                    // `r` rows of `pairs` words, each panel `LANES · pairs`.
                    unsafe { avx512::tile(x, pairs, pairs, wide, &mut acc[..r]) };
                    for (i, acc) in acc[..r].iter().enumerate() {
                        // SAFETY: each task writes only its rows' columns of its own panels,
                        // within `out` (checked above); no two tasks share a (row, panel).
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut(
                                out.at((tile + i) * n + first * LANES),
                                width,
                            )
                        };
                        dst.copy_from_slice(&acc[..width]);
                    }
                }
            }
        });
    }
}

/// Two values rounded to bf16 as `vcvtneps2bf16` rounds them (to nearest, ties to even;
/// subnormals to zero; NaNs quiet), the first in the low half; a missing second is zero.
fn pair_of(pair: &[f32]) -> u32 {
    let bf = |v: f32| {
        let bits = v.to_bits();
        if v.is_nan() {
            return (bits >> 16) | 0x40;
        }
        if v.is_subnormal() {
            return (bits >> 16) & 0x8000;
        }
        (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    };
    bf(pair[0]) | pair.get(1).map_or(0, |&v| bf(v) << 16)
}

/// The output's pointer, shared by tasks that write disjoint parts of it.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

// SAFETY: tasks write disjoint elements (see `Packed::matmul`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn at(self, i: usize) -> *mut f32 {
        // SAFETY: the caller keeps `i` within the buffer.
        unsafe { self.0.add(i) }
    }
}

/// Whether this CPU has the instructions (AVX-512 F and BF16) and `LMHOST_SIMD` allows them.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        lmhost_plugin_kit::simd::Simd::Avx512.allowed()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;
    use std::mem::transmute;

    use super::{pair_of, LANES, TILE, WIDE};

    /// `acc[r][c] = Σₜ x[r][t] · panels[c / LANES][t][c % LANES]` over `pairs` bf16 pairs,
    /// for the `acc.len()` rows of `x` (`stride` words apart).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BF16; `x` holds `acc.len() ≤ TILE` rows of `pairs`
    /// words, `stride` apart, each panel `LANES · pairs`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile(
        x: &[u32],
        stride: usize,
        pairs: usize,
        panels: [&[u32]; WIDE],
        acc: &mut [[f32; WIDE * LANES]],
    ) {
        // SAFETY: the caller's promises, passed on; one copy per shape keeps the accumulators
        // in registers.
        unsafe {
            match acc.len() {
                1 => rows::<1>(x, stride, pairs, panels, acc),
                2 => rows::<2>(x, stride, pairs, panels, acc),
                3 => rows::<3>(x, stride, pairs, panels, acc),
                4 => rows::<4>(x, stride, pairs, panels, acc),
                5 => rows::<5>(x, stride, pairs, panels, acc),
                _ => rows::<TILE>(x, stride, pairs, panels, acc),
            }
        }
    }

    /// `row` rounded to bf16 into `to` (one value a halfword, as long as `row`), 16 values an
    /// instruction and the rest as [`pair_of`] rounds them, which is the same rounding.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_halves(row: &[f32], to: &mut [u16]) {
        let (body, tail) = row.as_chunks::<LANES>();
        let (to_body, to_tail) = to.as_chunks_mut::<LANES>();
        for (values, to) in body.iter().zip(to_body) {
            // SAFETY: 16 readable f32s and 16 writable words; the accesses are unaligned.
            unsafe {
                let half = _mm512_cvtneps_pbh(_mm512_loadu_ps(values.as_ptr()));
                _mm256_storeu_si256(to.as_mut_ptr().cast(), transmute::<__m256bh, __m256i>(half));
            }
        }
        for (&value, to) in tail.iter().zip(to_tail) {
            *to = pair_of(&[value]) as u16;
        }
    }

    /// `row` rounded to bf16 pairs into `to` (`row.len().div_ceil(2)` words), 16 values an
    /// instruction and the rest as [`pair_of`] rounds them, which is the same rounding.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F and BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round(row: &[f32], to: &mut [u32]) {
        let (body, tail) = row.as_chunks::<LANES>();
        for (values, to) in body.iter().zip(to.chunks_exact_mut(LANES / 2)) {
            // SAFETY: 16 readable f32s and 8 writable words; the accesses are unaligned.
            unsafe {
                let half = _mm512_cvtneps_pbh(_mm512_loadu_ps(values.as_ptr()));
                _mm256_storeu_si256(to.as_mut_ptr().cast(), transmute::<__m256bh, __m256i>(half));
            }
        }
        for (pair, to) in tail.chunks(2).zip(&mut to[body.len() * LANES / 2..]) {
            *to = pair_of(pair);
        }
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn rows<const R: usize>(
        x: &[u32],
        stride: usize,
        pairs: usize,
        panels: [&[u32]; WIDE],
        acc: &mut [[f32; WIDE * LANES]],
    ) {
        assert!(x.len() >= (R - 1) * stride + pairs && acc.len() >= R);
        assert!(panels.iter().all(|p| p.len() >= pairs * LANES));
        let mut sums = [[_mm512_setzero_ps(); WIDE]; R];
        let x = x.as_ptr();
        let w = panels.map(|p| p.as_ptr());
        for t in 0..pairs {
            // SAFETY: `t < pairs`: word `t` of each of the `R` rows and pair `t` of each panel
            // are in bounds (asserted above); the loads are unaligned.
            unsafe {
                let w = w.map(|w| {
                    transmute::<__m512i, __m512bh>(_mm512_loadu_si512(w.add(t * LANES).cast()))
                });
                for (r, sums) in sums.iter_mut().enumerate() {
                    let v = transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        *x.add(r * stride + t) as i32,
                    ));
                    for (sum, w) in sums.iter_mut().zip(w) {
                        *sum = _mm512_dpbf16_ps(*sum, v, w);
                    }
                }
            }
        }
        for (acc, sums) in acc.iter_mut().zip(sums) {
            for (acc, sum) in acc.chunks_exact_mut(LANES).zip(sums) {
                // SAFETY: each chunk is 16 writable f32s.
                unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), sum) };
            }
        }
    }
}

/// Elsewhere no [`Packed`] is ever made ([`available`] is false), so nothing here runs.
#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    use super::{LANES, WIDE};

    pub(super) unsafe fn tile(
        _: &[u32],
        _: usize,
        _: usize,
        _: [&[u32]; WIDE],
        _: &mut [[f32; WIDE * LANES]],
    ) {
        unreachable!("bf16 matrices are packed only on x86-64 with AVX-512 BF16")
    }

    pub(super) unsafe fn round(_: &[f32], _: &mut [u32]) {
        unreachable!("bf16 matrices are packed only on x86-64 with AVX-512 BF16")
    }

    pub(super) unsafe fn round_halves(_: &[f32], _: &mut [u16]) {
        unreachable!("bf16 matrices are packed only on x86-64 with AVX-512 BF16")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(i: usize) -> f32 {
        ((i * 7919 % 1000) as f32 - 500.0) / 97.0
    }

    /// Each output is the bf16-rounded row times the bf16-rounded weights, summed in f32 (each
    /// product of two bf16 values is exact in f32, so only the sums' rounding may differ from
    /// the plain loop below); and a row gets the same bits whatever rows share its call (odd
    /// shapes cover the padded panel, the short last step, an odd `k` and short tiles; no rows
    /// at all are no output).
    #[test]
    fn outputs_are_bf16_products_summed_in_f32_whatever_the_rows_around_them() {
        let (n, k) = (53, 29);
        let w: Vec<f32> = (0..n * k).map(value).collect();
        let Some(packed) = Packed::new(&w, (n, k)) else {
            // Without the instructions (or under `LMHOST_SIMD=avx2`) the format is refused
            // where the model is built; the test there covers that.
            assert!(!available(), "packing refused on a CPU with AVX-512 BF16");
            return;
        };
        let round = |v: f32| f32::from_bits(pair_of(&[v]) << 16);
        let mut row = vec![0f32; k];
        for j in 0..n {
            assert!(packed.row_into(j, &mut row));
            let want: Vec<f32> = w[j * k..(j + 1) * k].iter().map(|&v| round(v)).collect();
            assert_eq!(row, want, "row {j} as stored");
        }
        packed.matmul(&[], &mut []);
        let x: Vec<f32> = (0..200 * k).map(|i| value(i + 31)).collect();
        let mut all = vec![0f32; 200 * n];
        packed.matmul(&x, &mut all);
        for m in [1, 7, 8, 9, 13] {
            let mut out = vec![0f32; m * n];
            packed.matmul(&x[..m * k], &mut out);
            assert_eq!(
                out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                all[..m * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{m} rows"
            );
        }
        for r in 0..200 {
            for j in 0..n {
                let terms = (0..k).map(|i| round(x[r * k + i]) * round(w[j * k + i]));
                let (sum, size) = terms.fold((0f32, 0f32), |(s, a), t| (s + t, a + t.abs()));
                let got = all[r * n + j];
                assert!(
                    (got - sum).abs() <= 1e-6 * size,
                    "row {r} col {j}: {got} vs {sum}"
                );
            }
        }
    }

    /// A transposed packing holds the transpose's bf16 values; a tile over a run of pairs, its
    /// rows any stride apart, sums exactly that run's products (the chain [`Packed::matmul`]
    /// computes for the whole row when the run is all of it), and `round` rounds as packing
    /// did.
    #[test]
    fn tiles_sum_runs_of_pairs_of_a_transposed_matrix() {
        let (k, n) = (45, 21);
        let w: Vec<f32> = (0..k * n).map(value).collect();
        let Some(packed) = Packed::transposed(&w, (k, n)) else {
            assert!(!available(), "packing refused on a CPU with AVX-512 BF16");
            return;
        };
        let wt: Vec<f32> = (0..n * k).map(|i| w[i % k * n + i / k]).collect();
        let plain = Packed::new(&wt, (n, k)).expect("available");
        let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
        for j in 0..n {
            assert!(packed.row_into(j, &mut a) && plain.row_into(j, &mut b));
            assert_eq!(a, b, "column {j}");
        }
        let stride = 30;
        let x: Vec<f32> = (0..4 * 2 * stride).map(|i| value(i + 5)).collect();
        let mut halves = vec![0u16; x.len()];
        packed.round(&x, &mut halves);
        let round = |v: f32| f32::from_bits(pair_of(&[v]) << 16);
        assert!(halves
            .iter()
            .zip(&x)
            .all(|(&h, &v)| f32::from_bits(u32::from(h) << 16) == round(v)));
        let words: Vec<u32> = halves
            .chunks(2)
            .map(|p| u32::from(p[0]) | u32::from(p[1]) << 16)
            .collect();
        let mut whole = vec![0f32; 4 * n];
        let rows: Vec<f32> = x.chunks(2 * stride).flat_map(|r| r[..k].to_vec()).collect();
        plain.matmul(&rows, &mut whole);
        for pairs in [0..23, 3..11, 22..23] {
            for first in [0, 1] {
                let mut acc = [[0f32; WIDE * LANES]; 4];
                packed.tile(
                    &words[pairs.start..],
                    stride,
                    pairs.clone(),
                    first,
                    &mut acc,
                );
                for (r, acc) in acc.iter().enumerate() {
                    let row = &x[r * 2 * stride..];
                    for (c, &got) in acc.iter().enumerate() {
                        // Panels past the last repeat it; columns past `n` hold zeros.
                        let col = (first + c / LANES).min(1) * LANES + c % LANES;
                        let terms: Vec<f32> = (2 * pairs.start..(2 * pairs.end).min(k))
                            .map(|i| match col < n {
                                true => round(row[i]) * round(w[i * n + col]),
                                false => 0.0,
                            })
                            .collect();
                        let want: f32 = terms.iter().sum();
                        let size: f32 = terms.iter().map(|t| t.abs()).sum();
                        // Each of two sums of at most 46 exact products is within 46 units
                        // of f32 rounding of their sizes' sum.
                        assert!(
                            (got - want).abs() <= 6e-6 * size,
                            "{pairs:?} row {r} col {col}"
                        );
                        if pairs.len() == 23 && first == 0 && col < n {
                            assert_eq!(
                                got.to_bits(),
                                whole[r * n + col].to_bits(),
                                "row {r} col {col}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Ties round to even, as `vcvtneps2bf16` does; subnormals flush to zero; a NaN stays a
    /// NaN.
    #[test]
    fn rounding_is_to_nearest_even() {
        let bf = |v: f32| pair_of(&[v]);
        assert_eq!(bf(1.0), 0x3F80);
        // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: to the even one, 1.
        assert_eq!(bf(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3·2⁻⁸ lies halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: to the even one, up.
        assert_eq!(bf(1.0 + 3.0 / 256.0), 0x3F82);
        assert!(f32::from_bits(bf(f32::NAN) << 16).is_nan());
        assert_eq!(bf(-1e-40), 0x8000);
        assert_eq!(pair_of(&[1.0, -2.0]), 0xC000_3F80);
    }

    /// The instruction rounds a row as [`pair_of`] does, ties, subnormals and NaNs included.
    #[test]
    fn rows_round_as_the_scalar_rounding_does() {
        if !available() {
            return;
        }
        let mut row: Vec<f32> = (0..37).map(|i| value(i) * 1.000_001).collect();
        row[3] = 1.0 + 1.0 / 256.0;
        row[4] = 1.0 + 3.0 / 256.0;
        row[5] = -1e-40;
        row[6] = f32::NAN;
        let mut simd = vec![0u32; 19];
        // SAFETY: `available()` was checked.
        unsafe { avx512::round(&row, &mut simd) };
        let scalar: Vec<u32> = row.chunks(2).map(pair_of).collect();
        assert_eq!(simd, scalar);
    }
}
