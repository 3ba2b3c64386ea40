//! Quantized matrix × f32 activations computed the way llama.cpp does it: each activation row is
//! quantized to 8 bits per 32 values ([`blocks::BlockQ8`]), each weight block's integer dot product with
//! it is scaled once. Decode streams every weight once per token, so reading 4-bit blocks and
//! multiplying integers is what makes it fast; candle's Q4_1 CPU kernel has no SIMD path.
//!
//! Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K (SmolLM2's GGUF, a Q4_K_M file's mix, and the
//! requantized formats), read in place from a candle `QTensor`'s bytes ([`Layout::Stored`]) or,
//! for Q4_0, Q4_1, Q5_0 and Q8_0 on AVX-512, from a copy made once with 16 rows' blocks side
//! by side ([`Layout::Interleaved`], see `interleaved.rs`). The K-quants' 256-value
//! super-blocks meet llama.cpp's Q8_K activations ([`blocks::BlockQ8K`]), one scale per 256
//! values, so that a super-block's sums stay integers until its one scaling. The fastest path
//! this CPU has is chosen at run time: AVX-512 VNNI (Q4_0, Q4_1, Q5_0, Q8_0; the K-quants
//! through AVX2), AVX2, or the scalar one, which runs everywhere and computes the same integer
//! sums.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod bf16;
mod blocks;
mod dispatch;
#[cfg(target_arch = "x86_64")]
mod interleaved;
#[cfg(target_arch = "x86_64")]
mod kquants_avx2;
mod scalar;

use candle_core::quantized::GgmlDType;
use candle_core::{bail, Result};
use rayon::prelude::*;
use smallvec::SmallVec;

pub use blocks::BLOCK;
use dispatch::{Cpu, Kind, Quantized};

/// Activation rows one pass over the weights serves: each weight block is loaded and unpacked
/// once for all of them (where the path can), which is what makes a packed pass of a few
/// decode rows cheaper than as many single-row passes. Eight: a packed pass of eight
/// sequences unpacks each block once rather than twice, and the AVX-512 kernels' eight
/// accumulators still leave registers for the unpacked block.
pub const ROWS: usize = 8;

/// Weight rows computed together, one per 128-bit lane of the AVX-512 kernels.
const WROWS: usize = 4;

/// Rows of an [`Layout::Interleaved`] group, one per 32-bit lane of a 512-bit register; work
/// is split in whole groups (and so in whole [`WROWS`] tiles).
const GROUP: usize = 16;

/// How a matrix's blocks lie in its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As GGUF files and candle store them: each row's blocks in turn.
    Stored,
    /// [`interleave`]d for the AVX-512 kernels: block `i` of 16 rows side by side.
    Interleaved,
}

/// A tile's results: `[j][r]` is weight row `j` · activation row `r`.
type Tile = [[f32; ROWS]; WROWS];

/// Which implementation computes the dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Scalar,
    /// AVX2 with FMA and F16C; refused on a CPU without them.
    Avx2,
    /// AVX-512 F, BW and VNNI (with the above), two blocks per instruction.
    Avx512,
}

impl Path {
    /// The paths this CPU runs, scalar first.
    pub fn available() -> Vec<Path> {
        let mut paths = vec![Path::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if avx2::Avx2::detect().is_some() {
                paths.push(Path::Avx2);
            }
            if avx512::Avx512::detect().is_some() {
                paths.push(Path::Avx512);
            }
        }
        paths
    }

    /// The fastest path this CPU runs.
    pub fn best() -> Path {
        static BEST: std::sync::OnceLock<Path> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Path::available().last().copied().unwrap_or(Path::Scalar))
    }
}

/// Whether [`matmul`] has a kernel for `dtype`.
pub fn supports(dtype: GgmlDType) -> bool {
    Kind::of(dtype).is_some()
}

/// `dst = lhs · Wᵀ`: `lhs` is `(m, k)` row-major f32, `data` the stored bytes of a `(n, k)`
/// matrix of `dtype`, `dst` is `(m, n)`. Runs on the current rayon pool, split over chunks of
/// weight rows however many activation rows there are.
pub fn matmul(
    path: Path,
    dtype: GgmlDType,
    data: &[u8],
    (m, k, n): (usize, usize, usize),
    lhs: &[f32],
    dst: &mut [f32],
) -> Result<()> {
    let matrix = Matrix::stored(dtype, data, n);
    let scratch = &mut Scratch::default();
    matmul_group(path, &[matrix], (m, k), lhs, &mut [dst], scratch)
}

/// One matrix of a [`matmul_group`]: its type, its bytes and their layout, its row count.
#[derive(Debug, Clone, Copy)]
pub struct Matrix<'a> {
    pub dtype: GgmlDType,
    pub data: &'a [u8],
    pub rows: usize,
    pub layout: Layout,
}

impl<'a> Matrix<'a> {
    /// `rows` rows of `dtype` as stored.
    pub fn stored(dtype: GgmlDType, data: &'a [u8], rows: usize) -> Self {
        Matrix {
            dtype,
            data,
            rows,
            layout: Layout::Stored,
        }
    }
}

/// The stored `(n, k)` matrix `data` of `dtype` in the layout `path` computes it fastest in,
/// where that is not the stored one: [`Layout::Interleaved`] for Q4_0, Q4_1, Q5_0 and Q8_0 on
/// AVX-512. The same number of bytes (a last group of fewer than 16 rows is padded).
pub fn interleave(
    path: Path,
    dtype: GgmlDType,
    data: &[u8],
    (n, k): (usize, usize),
) -> Result<Option<Vec<u8>>> {
    let kind = Kind::checked(&Matrix::stored(dtype, data, n), k)?;
    #[cfg(target_arch = "x86_64")]
    if let (Path::Avx512, Some(interleaved)) = (path, kind.interleaved) {
        return Ok(Some((interleaved.copy)(data, (n, k / kind.values))));
    }
    let _ = (path, kind);
    Ok(None)
}

/// Rows `ids` of the interleaved `(n, k)` matrix `data` of `dtype` ([`interleave`]'s copy),
/// `(ids, k)` row-major: the values the stored blocks dequantize to, bit for bit.
pub fn interleaved_rows(
    dtype: GgmlDType,
    data: &[u8],
    (n, k): (usize, usize),
    ids: &[usize],
) -> Result<Vec<f32>> {
    let mut out = vec![0f32; ids.len() * k];
    interleaved_rows_into(dtype, data, (n, k), ids, &mut out)?;
    Ok(out)
}

/// [`interleaved_rows`] into `out`, `(ids, k)`.
pub fn interleaved_rows_into(
    dtype: GgmlDType,
    data: &[u8],
    (n, k): (usize, usize),
    ids: &[usize],
    out: &mut [f32],
) -> Result<()> {
    let matrix = Matrix {
        dtype,
        data,
        rows: n,
        layout: Layout::Interleaved,
    };
    Kind::checked(&matrix, k)?;
    if let Some(bad) = ids.iter().find(|&&r| r >= n) {
        bail!("row {bad} of a matrix of {n} rows");
    }
    if out.len() != ids.len() * k {
        bail!("{} values for {} rows of {k}", out.len(), ids.len());
    }
    #[cfg(target_arch = "x86_64")]
    {
        interleaved::rows(dtype, data, k / BLOCK, ids, out);
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    bail!("quantized matmul: no interleaved layout off x86_64")
}

/// `dsts[i] = lhs · Wᵢᵀ` for matrices that share their input (q, k and v; gate and up), each
/// `dsts[i]` `(m, rows)`. The activations are quantized once per block type and the rows of
/// all the matrices split in one parallel region: a decode step waits for the pool once for
/// the group, not once per matrix. Each result is the one [`matmul`] gives alone, bit for bit.
/// `scratch` holds what a call needs besides (quantized activations, a transposed result):
/// a caller that keeps it allocates nothing once it is as large as its passes need.
pub fn matmul_group(
    path: Path,
    matrices: &[Matrix<'_>],
    (m, k): (usize, usize),
    lhs: &[f32],
    dsts: &mut [&mut [f32]],
    scratch: &mut Scratch,
) -> Result<()> {
    if k == 0 || k % BLOCK != 0 {
        bail!("quantized matmul: rows of {k} values are not a multiple of {BLOCK}");
    }
    if matrices.len() != dsts.len() {
        bail!(
            "quantized matmul: {} matrices and {} outputs",
            matrices.len(),
            dsts.len()
        );
    }
    let (mut q8, mut q8k) = (false, false);
    for (matrix, dst) in matrices.iter().zip(dsts.iter()) {
        let n = matrix.rows;
        if lhs.len() != m * k || dst.len() != m * n {
            bail!(
                "quantized matmul: {} inputs and {} outputs for (m, k, n) = ({m}, {k}, {n})",
                lhs.len(),
                dst.len()
            );
        }
        let kind = Kind::checked(matrix, k)?;
        q8 |= !kind.super_blocks;
        q8k |= kind.super_blocks;
    }
    let cpu = Cpu::of(path)?;
    if path != Path::Avx512 && matrices.iter().any(|w| w.layout == Layout::Interleaved) {
        bail!("quantized matmul: interleaved blocks run on the AVX-512 path, not {path:?}");
    }
    if m == 0 {
        return Ok(());
    }
    let Scratch { x, transposed } = scratch;
    x.quantize(path, (lhs, k), (q8, q8k));
    let x = &*x;
    // Several activation rows are computed as `dstᵀ` (each weight block read once for all of
    // them) and transposed after; one row needs neither.
    let compute = |(matrix, out): (&Matrix<'_>, &mut [f32])| {
        // Checked above.
        let Some(kind) = Kind::of(matrix.dtype) else {
            return;
        };
        let row_bytes = k / kind.values * kind.block_bytes;
        let chunk = chunk_rows(matrices);
        matrix
            .data
            .par_chunks(chunk * row_bytes)
            .zip(out.par_chunks_mut(chunk * m))
            .for_each(|(data, out)| match matrix.layout {
                Layout::Stored => (kind.chunk)(cpu, data, x, k, out),
                #[cfg(target_arch = "x86_64")]
                Layout::Interleaved => {
                    if let (Cpu::Avx512(cpu), Some(interleaved)) = (cpu, kind.interleaved) {
                        (interleaved.chunk)(cpu, data, &x.q8, k, out)
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                Layout::Interleaved => {}
            });
    };
    if m == 1 {
        matrices
            .par_iter()
            .zip(dsts.par_iter_mut())
            .for_each(|(matrix, dst)| compute((matrix, dst)));
        return Ok(());
    }
    // Every value is written below, so a buffer kept from a larger call is not cleared.
    let total: usize = dsts.iter().map(|d| d.len()).sum();
    if transposed.len() < total {
        transposed.resize(total, 0.0);
    }
    let mut parts = split_like(&mut transposed[..total], matrices, m);
    matrices
        .par_iter()
        .zip(parts.par_iter_mut())
        .for_each(|(matrix, part)| compute((matrix, part)));
    untranspose(&parts, dsts, m);
    Ok(())
}

/// `buffer` cut into each matrix's `(rows, m)` part, in order; held inline for a group of up
/// to three (q, k and v), so that a call allocates nothing.
fn split_like<'b>(
    buffer: &'b mut [f32],
    matrices: &[Matrix<'_>],
    m: usize,
) -> SmallVec<[&'b mut [f32]; 3]> {
    let mut parts = SmallVec::new();
    let mut rest = buffer;
    for matrix in matrices {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(matrix.rows * m);
        parts.push(part);
        rest = tail;
    }
    parts
}

/// What [`matmul_group`] needs besides its inputs and outputs, kept between calls.
#[derive(Default)]
pub struct Scratch {
    x: Quantized,
    transposed: Vec<f32>,
}

impl Scratch {
    /// Runs `f` with this thread's scratch (a new one if a call further up this thread's
    /// stack holds it: a pool thread waiting in a parallel region may run another pass).
    pub fn with<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
        thread_local! {
            static SPARE: std::cell::Cell<Option<Scratch>> = const { std::cell::Cell::new(None) };
        }
        let mut scratch = SPARE.take().unwrap_or_default();
        let result = f(&mut scratch);
        SPARE.set(Some(scratch));
        result
    }
}

/// Writes each `(n, m)` result of `transposed` into its `(m, n)` destination, in parallel:
/// over blocks of [`ROWS`] destination rows, each column of a block [`ROWS`] adjacent values
/// to read and each row written in order (writes a row apart each stall on memory); and a
/// decode pass's one block over [`SPANS`] spans of columns (one task for a wide output layer
/// would leave the other cores idle).
fn untranspose(transposed: &[&mut [f32]], dsts: &mut [&mut [f32]], m: usize) {
    transposed
        .par_iter()
        .zip(dsts.par_iter_mut())
        .for_each(|(t, dst)| {
            let n = t.len() / m;
            if m <= ROWS {
                return untranspose_spans(t, dst, m);
            }
            dst.par_chunks_mut(ROWS * n)
                .enumerate()
                .for_each(|(b, rows)| {
                    let (first, count) = (b * ROWS, rows.len() / n);
                    for (j, column) in t.chunks_exact(m).enumerate() {
                        for (r, v) in column[first..first + count].iter().enumerate() {
                            rows[r * n + j] = *v;
                        }
                    }
                });
        });
}

/// Spans of columns [`untranspose`] splits a block of rows into.
const SPANS: usize = 8;

/// [`untranspose`] of at most [`ROWS`] rows, `(m, n)`, in parallel over [`SPANS`] spans of
/// columns: span `c` of every row is one task's, and each row of it is written in order.
fn untranspose_spans(t: &[f32], dst: &mut [f32], m: usize) {
    let n = t.len() / m.max(1);
    if n == 0 {
        return;
    }
    let width = n.div_ceil(SPANS);
    let mut spans: [[&mut [f32]; ROWS]; SPANS] = Default::default();
    for (r, row) in dst.chunks_exact_mut(n).enumerate() {
        for (c, span) in row.chunks_mut(width).enumerate() {
            spans[c][r] = span;
        }
    }
    spans.par_iter_mut().enumerate().for_each(|(c, rows)| {
        // Past the last column (a narrow matrix has fewer spans), `rows` are empty.
        let from = t.get(c * width * m..).unwrap_or_default();
        for (r, row) in rows[..m].iter_mut().enumerate() {
            for (out, column) in row.iter_mut().zip(from.chunks_exact(m)) {
                *out = column[r];
            }
        }
    });
}

/// Weight rows per parallel task: a few tasks per thread over the whole group, each a whole
/// number of [`GROUP`]s from its matrix's start, so that a row's tile (or group) is the same
/// however the group is split, and so its result.
fn chunk_rows(matrices: &[Matrix<'_>]) -> usize {
    let total: usize = matrices.iter().map(|w| w.rows).sum();
    total
        .div_ceil(4 * rayon::current_num_threads())
        .max(GROUP)
        .next_multiple_of(GROUP)
}

#[cfg(test)]
mod tests {
    use super::blocks::BlockQ8;
    use super::dispatch::quantize;
    use super::*;

    /// Every path quantizes activations to the same blocks, ties included: a block whose
    /// largest value is 127 has a step of 1, so each `x.5` lies halfway between two steps
    /// and rounds away from zero.
    #[test]
    fn every_path_quantizes_to_the_same_blocks() {
        let ties: Vec<f32> = (0..BLOCK)
            .map(|i| match i {
                0 => 127.0,
                _ => (i as f32 - 16.5) * if i % 2 == 0 { 1.0 } else { -3.0 },
            })
            .collect();
        let spread: Vec<f32> = (0..3 * BLOCK)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.0173)
            .collect();
        let zeros = vec![0f32; BLOCK];
        for lhs in [ties, spread, zeros] {
            let mut expected: Vec<BlockQ8> = Vec::new();
            quantize(Path::Scalar, &lhs, BLOCK, &mut expected);
            for path in Path::available() {
                let mut got: Vec<BlockQ8> = Vec::new();
                quantize(path, &lhs, BLOCK, &mut got);
                for (got, want) in got.iter().zip(&expected) {
                    assert_eq!(got.qs, want.qs, "{path:?}");
                    let fields = |b: &BlockQ8| (b.d, b.s, b.sum);
                    assert_eq!(fields(got), fields(want), "{path:?}");
                }
                assert_eq!(got.len(), expected.len());
            }
        }
    }
}
