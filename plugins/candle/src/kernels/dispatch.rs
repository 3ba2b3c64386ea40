//! Which kernel computes a chunk of a weight type's rows on the path this CPU was checked to
//! run, and the activations each type meets, quantized once per group.

use candle_core::quantized::GgmlDType;
use candle_core::{bail, Result};
use rayon::prelude::*;

use super::blocks::{as_blocks, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ6K, BlockQ8};
use super::blocks::{BlockQ8K, BlockQ8_0, Nibbles, BLOCK, QK_K};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512, interleaved};
use super::{scalar, Layout, Matrix, Path, Tile, GROUP, ROWS, WROWS};

/// A weight type's shape and the function that computes a chunk of its rows.
#[derive(Clone, Copy)]
pub(super) struct Kind {
    /// Weights per block.
    pub(super) values: usize,
    pub(super) block_bytes: usize,
    /// Whether its activations are [`BlockQ8K`] rather than [`BlockQ8`].
    pub(super) super_blocks: bool,
    pub(super) chunk: fn(Cpu, &[u8], &Quantized, usize, &mut [f32]),
    /// Where the type has an interleaved layout.
    #[cfg(target_arch = "x86_64")]
    pub(super) interleaved: Option<Interleaved>,
}

impl Kind {
    pub(super) fn of(dtype: GgmlDType) -> Option<Kind> {
        Some(match dtype {
            GgmlDType::Q4_0 => Kind::nibbles::<BlockQ4_0>(),
            GgmlDType::Q4_1 => Kind::nibbles::<BlockQ4_1>(),
            GgmlDType::Q8_0 => Kind::q8_0(),
            GgmlDType::Q5_0 => Kind::nibbles::<BlockQ5_0>(),
            GgmlDType::Q4K => Kind::new::<BlockQ4K>(),
            GgmlDType::Q6K => Kind::new::<BlockQ6K>(),
            _ => return None,
        })
    }

    fn new<W: Block>() -> Kind {
        Kind {
            values: W::VALUES,
            block_bytes: std::mem::size_of::<W>(),
            super_blocks: W::X::VALUES != BLOCK,
            chunk: chunk::<W>,
            #[cfg(target_arch = "x86_64")]
            interleaved: None,
        }
    }

    /// A nibble type, with [`Layout::Interleaved`]'s copy and AVX-512 kernel.
    #[cfg(target_arch = "x86_64")]
    fn nibbles<W: Block + Nibbles>() -> Kind {
        Kind {
            interleaved: Some(Interleaved {
                copy: |data, shape| {
                    // SAFETY: `data` is whole blocks of `W` ([`Kind::checked`]).
                    interleaved::interleave(unsafe { as_blocks::<W>(data) }, shape)
                },
                chunk: interleaved::chunk::<W>,
            }),
            ..Kind::new::<W>()
        }
    }

    /// Q8_0, with [`Layout::Interleaved`]'s copy and AVX-512 kernel.
    #[cfg(target_arch = "x86_64")]
    fn q8_0() -> Kind {
        Kind {
            interleaved: Some(Interleaved {
                copy: |data, shape| {
                    // SAFETY: `data` is whole Q8_0 blocks ([`Kind::checked`]).
                    interleaved::interleave_q8_0(unsafe { as_blocks::<BlockQ8_0>(data) }, shape)
                },
                chunk: interleaved::chunk_q8_0,
            }),
            ..Kind::new::<BlockQ8_0>()
        }
    }

    /// Q8_0: no interleaved layout off x86_64.
    #[cfg(not(target_arch = "x86_64"))]
    fn q8_0() -> Kind {
        Kind::new::<BlockQ8_0>()
    }

    /// A nibble type: no interleaved layout off x86_64.
    #[cfg(not(target_arch = "x86_64"))]
    fn nibbles<W: Block>() -> Kind {
        Kind::new::<W>()
    }

    /// The kind of `matrix`, whose rows of `k` values must be whole blocks of its type, in its
    /// layout (interleaved: whole groups of 16 rows, and only for the types that have one).
    pub(super) fn checked(matrix: &Matrix<'_>, k: usize) -> Result<Kind> {
        let (dtype, n) = (matrix.dtype, matrix.rows);
        let Some(kind) = Kind::of(dtype) else {
            bail!("quantized matmul: no kernel for {dtype:?}");
        };
        if !k.is_multiple_of(kind.values) {
            bail!(
                "quantized matmul: rows of {k} values are not whole {dtype:?} blocks of {}",
                kind.values
            );
        }
        let stored_rows = match matrix.layout {
            Layout::Stored => n,
            Layout::Interleaved if kind.has_interleaved() => n.next_multiple_of(GROUP),
            Layout::Interleaved => bail!("quantized matmul: no interleaved layout for {dtype:?}"),
        };
        if matrix.data.len() != stored_rows * (k / kind.values) * kind.block_bytes {
            bail!(
                "quantized matmul: {} bytes are not a ({n}, {k}) {dtype:?} matrix ({:?})",
                matrix.data.len(),
                matrix.layout
            );
        }
        Ok(kind)
    }

    fn has_interleaved(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.interleaved.is_some();
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

/// [`Layout::Interleaved`] for a type: the copy of `(n, k / BLOCK)` stored blocks, and the
/// AVX-512 kernel of a chunk of whole groups.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Interleaved {
    pub(super) copy: fn(&[u8], (usize, usize)) -> Vec<u8>,
    pub(super) chunk: fn(avx512::Avx512, &[u8], &[BlockQ8], usize, &mut [f32]),
}
/// A [`Path`] this CPU was checked to run.
#[derive(Clone, Copy)]
pub(super) enum Cpu {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(avx2::Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(avx512::Avx512),
}

impl Cpu {
    pub(super) fn of(path: Path) -> Result<Cpu> {
        Ok(match path {
            Path::Scalar => Cpu::Scalar,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => match avx2::Avx2::detect() {
                Some(cpu) => Cpu::Avx2(cpu),
                None => bail!("quantized matmul: this CPU has no AVX2, FMA and F16C"),
            },
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => match avx512::Avx512::detect() {
                Some(cpu) => Cpu::Avx512(cpu),
                None => bail!("quantized matmul: this CPU has no AVX-512 F, BW and VNNI"),
            },
            #[cfg(not(target_arch = "x86_64"))]
            Path::Avx2 | Path::Avx512 => {
                bail!("quantized matmul: {path:?} exists only on x86_64")
            }
        })
    }
}

/// A group's activations, quantized for each block size its matrices take (empty if none).
#[derive(Default)]
pub(super) struct Quantized {
    pub(super) q8: Vec<BlockQ8>,
    pub(super) q8k: Vec<BlockQ8K>,
}

impl Quantized {
    /// Quantizes `lhs` into [`BlockQ8`]s where `q8`, [`BlockQ8K`]s where `q8k`,
    /// reusing the buffers.
    pub(super) fn quantize(
        &mut self,
        path: Path,
        (lhs, k): (&[f32], usize),
        (q8, q8k): (bool, bool),
    ) {
        self.q8.clear();
        self.q8k.clear();
        if q8 {
            quantize(path, lhs, k, &mut self.q8);
        }
        if q8k {
            quantize(path, lhs, k, &mut self.q8k);
        }
    }
}

/// Computes the rows of type `W` in `data` (whole rows of `k` values) into `out`.
fn chunk<W: Block>(cpu: Cpu, data: &[u8], x: &Quantized, k: usize, out: &mut [f32]) {
    // SAFETY: every `Block` is such a struct, and `data` is whole blocks of it
    // ([`Kind::checked`], [`work`]).
    let w = unsafe { as_blocks::<W>(data) };
    let x = W::X::of(x);
    let blocks = (k / W::VALUES, k / W::X::VALUES);
    match cpu {
        Cpu::Scalar => tile(w, x, blocks, out, pairwise(W::dot_scalar)),
        #[cfg(target_arch = "x86_64")]
        Cpu::Avx2(cpu) => tile(w, x, blocks, out, |w, wb, xs, out| {
            W::tile_avx2(cpu, w, wb, xs, out)
        }),
        #[cfg(target_arch = "x86_64")]
        Cpu::Avx512(cpu) => tile(w, x, blocks, out, |w, wb, xs, out| {
            W::dot_avx512(cpu, w, wb, xs, out)
        }),
    }
}

/// Quantized activations: [`BlockQ8`] for the 32-value weight types, [`BlockQ8K`]
/// for the K-quants.
pub(super) trait Activations: Sized + Send + Sync {
    /// Activations per block.
    const VALUES: usize;
    /// A block to overwrite.
    const ZERO: Self;
    /// `lhs`, whole blocks, quantized into `out` (one block each), on every path (inlined
    /// where a path compiles it with its target features).
    fn quantize(lhs: &[f32], out: &mut [Self]);
    /// What [`Activations::quantize`] makes, on AVX2.
    #[cfg(target_arch = "x86_64")]
    fn quantize_avx2(_cpu: avx2::Avx2, lhs: &[f32], out: &mut [Self]) {
        // SAFETY: an `Avx2` proves the features.
        unsafe { quantize_compiled_avx2(lhs, out) }
    }
    /// This block size's activations of a group.
    fn of(x: &Quantized) -> &[Self];
}

/// A weight block type and its dot product with quantized activations, one row of each.
trait Block: Sized + Sync {
    /// Weights per block: [`BLOCK`], or 256 for the K-quants' super-blocks. A dot product gets
    /// `VALUES / X::VALUES` activation blocks per weight block.
    const VALUES: usize = BLOCK;
    /// The activation blocks the dot products take.
    type X: Activations;
    fn dot_scalar(w: &[Self], x: &[Self::X]) -> f32;
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[Self::X]) -> f32;
    /// Up to [`WROWS`] weight rows of `wb` blocks (consecutive in `w`) against each of `xs`
    /// (at most [`ROWS`]), into `out[j][r]`; pair by pair where a type has no tile kernel.
    #[cfg(target_arch = "x86_64")]
    fn tile_avx2(cpu: avx2::Avx2, w: &[Self], wb: usize, xs: &[&[Self::X]], out: &mut Tile) {
        pairwise(|w, x| Self::dot_avx2(cpu, w, x))(w, wb, xs, out)
    }
    /// As [`Block::tile_avx2`]; the AVX2 tile where a type has no AVX-512 kernel.
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512(cpu: avx512::Avx512, w: &[Self], wb: usize, xs: &[&[Self::X]], out: &mut Tile) {
        Self::tile_avx2(cpu.avx2(), w, wb, xs, out)
    }
}

impl Block for BlockQ4_0 {
    type X = BlockQ8;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q4_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q4_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn tile_avx2(cpu: avx2::Avx2, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.tile_nibbles(w, wb, xs, out)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512(cpu: avx512::Avx512, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.dot_nibbles(w, wb, xs, out)
    }
}

impl Block for BlockQ4_1 {
    type X = BlockQ8;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q4_1(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q4_1(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn tile_avx2(cpu: avx2::Avx2, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.tile_nibbles(w, wb, xs, out)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512(cpu: avx512::Avx512, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.dot_nibbles(w, wb, xs, out)
    }
}

impl Block for BlockQ8_0 {
    type X = BlockQ8;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q8_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q8_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn tile_avx2(cpu: avx2::Avx2, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.tile_q8_0(w, wb, xs, out)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512(cpu: avx512::Avx512, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.dot_q8_0(w, wb, xs, out)
    }
}
impl Block for BlockQ5_0 {
    type X = BlockQ8;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q5_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q5_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn tile_avx2(cpu: avx2::Avx2, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.tile_nibbles(w, wb, xs, out)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx512(cpu: avx512::Avx512, w: &[Self], wb: usize, xs: &[&[BlockQ8]], out: &mut Tile) {
        cpu.dot_nibbles(w, wb, xs, out)
    }
}

impl Block for BlockQ4K {
    const VALUES: usize = QK_K;
    type X = BlockQ8K;
    fn dot_scalar(w: &[Self], x: &[BlockQ8K]) -> f32 {
        scalar::dot_q4k(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8K]) -> f32 {
        cpu.dot_q4k(w, x)
    }
}

impl Block for BlockQ6K {
    const VALUES: usize = QK_K;
    type X = BlockQ8K;
    fn dot_scalar(w: &[Self], x: &[BlockQ8K]) -> f32 {
        scalar::dot_q6k(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8K]) -> f32 {
        cpu.dot_q6k(w, x)
    }
}

/// What computes a tile: weight rows of `wb` blocks against activation rows, `out[j][r]`.
trait TileDot<W, X>: Fn(&[W], usize, &[&[X]], &mut Tile) {}
impl<W, X, F: Fn(&[W], usize, &[&[X]], &mut Tile)> TileDot<W, X> for F {}

/// A one-row dot product applied to each (weight row, activation row) pair of a tile.
fn pairwise<W, X>(dot: impl Fn(&[W], &[X]) -> f32) -> impl TileDot<W, X> {
    move |w, wb, xs, out| {
        for (w, out) in w.chunks_exact(wb).zip(out.iter_mut()) {
            for (x, out) in xs.iter().zip(out.iter_mut()) {
                *out = dot(w, x);
            }
        }
    }
}

/// Activations to 8 bits per block. Rows are whole blocks, so blocks never straddle two rows.
/// The same values on every path; with AVX2, [`BlockQ8`]s in vector code of its own and the
/// K-quants' blocks in the scalar code compiled for it.
/// `lhs`, rows of `k` values, quantized: a prompt's many rows in parallel, [`ROWS`] at a
/// time (on one thread they leave the other cores idle), a few decode rows on this thread.
pub(super) fn quantize<X: Activations>(path: Path, lhs: &[f32], k: usize, out: &mut Vec<X>) {
    out.clear();
    out.resize_with(lhs.len() / X::VALUES, || X::ZERO);
    if lhs.len() < 2 * ROWS * k {
        return quantize_rows(path, lhs, out);
    }
    out.par_chunks_mut(ROWS * k / X::VALUES)
        .zip(lhs.par_chunks(ROWS * k))
        .for_each(|(out, rows)| quantize_rows(path, rows, out));
}

/// `lhs` quantized into `out`, a block each.
fn quantize_rows<X: Activations>(path: Path, lhs: &[f32], out: &mut [X]) {
    #[cfg(target_arch = "x86_64")]
    if let (true, Some(cpu)) = (path != Path::Scalar, avx2::Avx2::detect()) {
        return X::quantize_avx2(cpu, lhs, out);
    }
    let _ = path;
    X::quantize(lhs, out)
}

/// [`Activations::quantize`] compiled for AVX2: rounding becomes inline vector code instead of a
/// call to `roundf` per value.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_compiled_avx2<X: Activations>(lhs: &[f32], out: &mut [X]) {
    X::quantize(lhs, out)
}
impl Activations for BlockQ8 {
    const VALUES: usize = BLOCK;

    const ZERO: BlockQ8 = BlockQ8 {
        d: 0.0,
        s: 0.0,
        sum: 0.0,
        qs: [0; BLOCK],
    };

    #[inline(always)]
    fn quantize(lhs: &[f32], out: &mut [BlockQ8]) {
        BlockQ8::quantize(lhs, out)
    }

    #[cfg(target_arch = "x86_64")]
    fn quantize_avx2(cpu: avx2::Avx2, lhs: &[f32], out: &mut [BlockQ8]) {
        cpu.quantize_q8(lhs, out)
    }

    fn of(x: &Quantized) -> &[BlockQ8] {
        &x.q8
    }
}

impl Activations for BlockQ8K {
    const VALUES: usize = QK_K;

    const ZERO: BlockQ8K = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };

    #[inline(always)]
    fn quantize(lhs: &[f32], out: &mut [BlockQ8K]) {
        BlockQ8K::quantize(lhs, out)
    }

    fn of(x: &Quantized) -> &[BlockQ8K] {
        &x.q8k
    }
}

/// `out[j][r]` = weight row `j` · activation row `r`, in tiles of [`WROWS`] weight rows by
/// [`ROWS`] activation rows.
fn tile<W, X>(
    w: &[W],
    x: &[X],
    (wb, xb): (usize, usize),
    out: &mut [f32],
    dot: impl TileDot<W, X>,
) {
    let m = x.len() / xb;
    for (w, out) in w.chunks(WROWS * wb).zip(out.chunks_mut(WROWS * m)) {
        for (g, group) in x.chunks(ROWS * xb).enumerate() {
            let mut rows: [&[X]; ROWS] = [&[]; ROWS];
            for (slot, row) in rows.iter_mut().zip(group.chunks_exact(xb)) {
                *slot = row;
            }
            let count = group.len() / xb;
            let mut sums = [[0f32; ROWS]; WROWS];
            dot(w, wb, &rows[..count], &mut sums);
            for (out, sums) in out.chunks_exact_mut(m).zip(&sums) {
                out[g * ROWS..g * ROWS + count].copy_from_slice(&sums[..count]);
            }
        }
    }
}
