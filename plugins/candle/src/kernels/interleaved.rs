//! The interleaved layout of Q4_0, Q4_1, Q5_0 and Q8_0 for the AVX-512 kernels: block `i` of
//! [`GROUP`] consecutive rows side by side, so that one `vpdpbusd` multiplies 16 rows' values
//! by the same four activations and each 32-bit lane ends a block holding its row's whole
//! integer sum, scaled once. In the stored layout four rows share a register, one per 128-bit
//! lane, and each lane's four partial sums are scaled apart: four times the float work per
//! block, which is what bounded a packed pass of eight rows (`bench_kernels` compares the
//! layouts; for one row they are alike).
//!
//! A group's block `i`: the 16 rows' f16 scales (32 bytes); Q4_1's 16 f16 minimums (32 bytes)
//! or Q5_0's 16 `qh` words (64 bytes); then the values in 64-byte pieces, piece `c` holding
//! bytes `4c..4c+4` of each row's values in turn: four pieces of nibbles (their low nibbles
//! are values `4c..4c+4`, the high ones `16+4c..16+4c+4`), or Q8_0's eight pieces of values
//! offset by 128 (unsigned, as `vpdpbusd` wants one operand). As many bytes as the stored
//! blocks: the copy is made once at load, in place of them. A matrix's last group repeats its
//! last row to fill 16 rows; those sums are never read.

use candle_core::quantized::GgmlDType;
use half::f16;

use super::avx512::Avx512;
use super::blocks::{BlockQ8, BlockQ8_0, NibbleKind, Nibbles, BLOCK};
use super::{GROUP, ROWS};

/// The AVX-512 kernel of one group against up to [`ROWS`] activation rows.
type GroupKernel = fn(Avx512, &[u8], usize, &[&[BlockQ8]]) -> [[f32; GROUP]; ROWS];

/// `w`'s `(n, kb)` blocks (rows of `kb` blocks) in the interleaved layout.
pub(super) fn interleave<W: Nibbles>(w: &[W], shape: (usize, usize)) -> Vec<u8> {
    groups_of(w, shape, |blocks, out| {
        let parts = blocks.map(|b| b.parts());
        parts.iter().for_each(|p| out.extend_from_slice(&p.1[..2]));
        match W::KIND {
            NibbleKind::Q4_1 => parts.iter().for_each(|p| out.extend_from_slice(&p.1[2..])),
            NibbleKind::Q5_0 => parts
                .iter()
                .for_each(|p| out.extend_from_slice(&p.2.to_le_bytes())),
            NibbleKind::Q4_0 => {}
        }
        for c in 0..4 {
            parts
                .iter()
                .for_each(|p| out.extend_from_slice(&p.0[4 * c..4 * c + 4]));
        }
    })
}

/// [`interleave`] for Q8_0: the values offset by 128.
pub(super) fn interleave_q8_0(w: &[BlockQ8_0], shape: (usize, usize)) -> Vec<u8> {
    groups_of(w, shape, |blocks, out| {
        blocks.iter().for_each(|b| out.extend_from_slice(&b.d));
        for c in 0..8 {
            for b in blocks {
                out.extend(b.qs[4 * c..4 * c + 4].iter().map(|&q| (q as u8) ^ 0x80));
            }
        }
    })
}

/// The groups of `w`'s `(n, kb)` blocks, block by block, each written by `block` from the
/// group's 16 blocks `i` (the last row repeated past the end).
fn groups_of<W>(
    w: &[W],
    (n, kb): (usize, usize),
    block: impl Fn([&W; GROUP], &mut Vec<u8>),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(n.div_ceil(GROUP) * GROUP * kb * size_of::<W>());
    for first in (0..n).step_by(GROUP) {
        let rows: [&[W]; GROUP] = std::array::from_fn(|l| {
            let r = (first + l).min(n - 1);
            &w[r * kb..(r + 1) * kb]
        });
        for i in 0..kb {
            block(rows.map(|row| &row[i]), &mut out);
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
    groups(
        cpu,
        (data, size_of::<W>()),
        x,
        k,
        out,
        Avx512::interleaved::<W>,
    );
}

/// [`chunk`] for Q8_0.
pub(super) fn chunk_q8_0(cpu: Avx512, data: &[u8], x: &[BlockQ8], k: usize, out: &mut [f32]) {
    groups(
        cpu,
        (data, size_of::<BlockQ8_0>()),
        x,
        k,
        out,
        Avx512::interleaved_q8_0,
    );
}

/// [`chunk`] over blocks of `block_bytes`, each group through `kernel`.
fn groups(
    cpu: Avx512,
    (data, block_bytes): (&[u8], usize),
    x: &[BlockQ8],
    k: usize,
    out: &mut [f32],
    kernel: GroupKernel,
) {
    let kb = k / BLOCK;
    let m = x.len() / kb;
    for (g, out) in data
        .chunks_exact(GROUP * kb * block_bytes)
        .zip(out.chunks_mut(GROUP * m))
    {
        let rows = out.len() / m;
        for (first, block) in x.chunks(ROWS * kb).enumerate() {
            let mut xs: [&[BlockQ8]; ROWS] = [&[]; ROWS];
            for (slot, row) in xs.iter_mut().zip(block.chunks_exact(kb)) {
                *slot = row;
            }
            let count = block.len() / kb;
            let sums = kernel(cpu, g, kb, &xs[..count]);
            for (j, out) in out.chunks_exact_mut(m).take(rows).enumerate() {
                for (r, sums) in sums.iter().enumerate().take(count) {
                    out[first * ROWS + r] = sums[j];
                }
            }
        }
    }
}

/// Rows `ids` of an interleaved `(n, kb)`-block matrix of `dtype` into `out` (`k` values each),
/// dequantized as candle dequantizes the stored blocks, so bit for bit the same values: what
/// a token table shared with its output layer looks up. The caller checked the sizes.
pub(super) fn rows(dtype: GgmlDType, data: &[u8], kb: usize, ids: &[usize], out: &mut [f32]) {
    let block_bytes = dtype.type_size();
    let group = GROUP * kb * block_bytes;
    for (&r, out) in ids.iter().zip(out.chunks_exact_mut(kb * BLOCK)) {
        let (g, l) = (r / GROUP, r % GROUP);
        for (i, values) in out.as_chunks_mut::<BLOCK>().0.iter_mut().enumerate() {
            let b = &data[g * group + i * GROUP * block_bytes..][..GROUP * block_bytes];
            block(dtype, b, l, values);
        }
    }
}

/// Row `l`'s values of one group block `b` (see the layout above) of Q8_0, Q4_1, Q5_0 or
/// else Q4_0 (the types with the layout).
fn block(dtype: GgmlDType, b: &[u8], l: usize, values: &mut [f32; BLOCK]) {
    let f16_at = |at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    let d = f16_at(2 * l);
    // Bytes `4c..4c+4` of the row's values, in the pieces from `first`.
    let bytes = |first: usize, c: usize| &b[first + 64 * c + 4 * l..][..4];
    match dtype {
        GgmlDType::Q8_0 => {
            for c in 0..8 {
                for (t, &q) in bytes(32, c).iter().enumerate() {
                    values[4 * c + t] = ((q ^ 0x80) as i8) as f32 * d;
                }
            }
        }
        GgmlDType::Q4_1 => {
            let m = f16_at(32 + 2 * l);
            nibbles(|c| bytes(64, c), |j, q| values[j] = q as f32 * d + m);
        }
        GgmlDType::Q5_0 => {
            let at = 32 + 4 * l;
            let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            nibbles(
                |c| bytes(96, c),
                |j, q| values[j] = ((q | ((qh >> j) & 1) << 4) as i32 - 16) as f32 * d,
            );
        }
        _ => nibbles(
            |c| bytes(32, c),
            |j, q| values[j] = (q as i32 - 8) as f32 * d,
        ),
    }
}

/// Each value `j` of a block of nibbles as `value(j, nibble)`: piece `c`'s low nibbles are
/// values `4c..4c+4`, its high ones `16+4c..16+4c+4`.
fn nibbles<'a>(piece: impl Fn(usize) -> &'a [u8], mut value: impl FnMut(usize, u32)) {
    for c in 0..4 {
        for (t, &q) in piece(c).iter().enumerate() {
            value(4 * c + t, u32::from(q & 0xF));
            value(16 + 4 * c + t, u32::from(q >> 4));
        }
    }
}
