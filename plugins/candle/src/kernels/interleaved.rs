//! The interleaved layout of the nibble types (Q4_0, Q4_1, Q5_0) for the AVX-512 kernels:
//! block `i` of [`GROUP`] consecutive rows side by side, so that one `vpdpbusd` multiplies 16
//! rows' values by the same four activations and each 32-bit lane ends a block holding its
//! row's whole integer sum, scaled once. In the stored layout four rows share a register, one
//! per 128-bit lane, and each lane's four partial sums are scaled apart: four times the float
//! work per block, which is what bounded a packed pass of eight rows (SmolLM2's Q4_1
//! 1536 × 576 matrix, 2 threads, the two layouts alternating: 85 against 51 µs for 8 rows,
//! 30 against 30 for one).
//!
//! A group's block `i`: the 16 rows' f16 scales (32 bytes); Q4_1's 16 f16 minimums (32 bytes)
//! or Q5_0's 16 `qh` words (64 bytes); then four 64-byte pieces, piece `c` holding bytes
//! `4c..4c+4` of each row's 16 bytes of nibbles in turn (their low nibbles are values
//! `4c..4c+4`, the high ones `16+4c..16+4c+4`). As many bytes as the stored blocks: the copy
//! is made once at load, in place of them. A matrix's last group repeats its last row to fill
//! 16 rows; those sums are never read.

use super::avx2::{Kind, Nibbles};
use super::avx512::Avx512;
use super::{BlockQ8, GROUP, ROWS};

/// `w`'s `(n, kb)` blocks (rows of `kb` blocks) in the interleaved layout.
pub(super) fn interleave<W: Nibbles>(w: &[W], (n, kb): (usize, usize)) -> Vec<u8> {
    let groups = n.div_ceil(GROUP);
    let mut out = Vec::with_capacity(groups * GROUP * kb * size_of::<W>());
    for first in (0..n).step_by(GROUP) {
        let rows: [&[W]; GROUP] = std::array::from_fn(|l| {
            let r = (first + l).min(n - 1);
            &w[r * kb..(r + 1) * kb]
        });
        for i in 0..kb {
            let parts = rows.map(|row| row[i].parts());
            parts.iter().for_each(|p| out.extend_from_slice(&p.1[..2]));
            match W::KIND {
                Kind::Q4_1 => parts.iter().for_each(|p| out.extend_from_slice(&p.1[2..])),
                Kind::Q5_0 => parts
                    .iter()
                    .for_each(|p| out.extend_from_slice(&p.2.to_le_bytes())),
                Kind::Q4_0 => {}
            }
            for c in 0..4 {
                parts
                    .iter()
                    .for_each(|p| out.extend_from_slice(&p.0[4 * c..4 * c + 4]));
            }
        }
    }
    out
}

/// The interleaved rows in `data` (whole groups of `k`-value rows) against the activation
/// rows `x` into `out`, `(rows, m)` as [`super::tile`] writes it (or the `rows` values of one
/// activation row): as many rows as `out` holds, so the padding of a last group is dropped.
pub(super) fn chunk<W: Nibbles>(
    cpu: Avx512,
    data: &[u8],
    x: &[BlockQ8],
    k: usize,
    out: &mut [f32],
) {
    let kb = k / super::BLOCK;
    let m = x.len() / kb;
    let group = GROUP * kb * size_of::<W>();
    for (g, out) in data.chunks_exact(group).zip(out.chunks_mut(GROUP * m)) {
        let rows = out.len() / m;
        for (first, block) in x.chunks(ROWS * kb).enumerate() {
            let mut xs: [&[BlockQ8]; ROWS] = [&[]; ROWS];
            for (slot, row) in xs.iter_mut().zip(block.chunks_exact(kb)) {
                *slot = row;
            }
            let count = block.len() / kb;
            let sums = cpu.interleaved::<W>(g, kb, &xs[..count]);
            for (j, out) in out.chunks_exact_mut(m).take(rows).enumerate() {
                for (r, sums) in sums.iter().enumerate().take(count) {
                    out[first * ROWS + r] = sums[j];
                }
            }
        }
    }
}
