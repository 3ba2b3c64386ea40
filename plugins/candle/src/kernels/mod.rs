//! Quantized matrix × f32 activations computed the way llama.cpp does it: each activation row is
//! quantized to 8 bits per 32 values ([`BlockQ8`]), each weight block's integer dot product with
//! it is scaled once. Decode streams every weight once per token, so reading 4-bit blocks and
//! multiplying integers is what makes it fast; candle's Q4_1 CPU kernel has no SIMD path.
//!
//! Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K (SmolLM2's GGUF, a Q4_K_M file's mix, and the
//! requantized formats), read in place from a candle `QTensor`'s bytes. The K-quants' 256-value
//! super-blocks meet llama.cpp's Q8_K activations ([`kquants::BlockQ8K`]), one scale per 256
//! values, so that a super-block's sums stay integers until its one scaling. The fastest path
//! this CPU has is chosen at run time: AVX-512 VNNI (Q4_0, Q4_1, Q8_0; the others through
//! AVX2), AVX2, or the scalar one, which runs everywhere and computes the same integer sums.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kquants;
#[cfg(target_arch = "x86_64")]
mod kquants_avx2;
mod scalar;

use candle_core::quantized::GgmlDType;
use candle_core::{bail, Result};
use half::f16;
use rayon::prelude::*;

/// Values per activation block, and per weight block in the 32-value types.
pub const BLOCK: usize = 32;

/// Activation rows one pass over the weights serves: each weight block is loaded and unpacked
/// once for all of them (where the path can), which is what makes a packed pass of a few
/// decode rows cheaper than as many single-row passes. Eight: a packed pass of eight
/// sequences unpacks each block once (9% faster than two tiles of four on SmolLM2), and the
/// AVX-512 kernels' eight accumulators still leave registers for the unpacked block.
pub const ROWS: usize = 8;

/// Weight rows computed together, one per 128-bit lane of the AVX-512 kernels.
const WROWS: usize = 4;

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
    matches!(
        dtype,
        GgmlDType::Q4_0
            | GgmlDType::Q4_1
            | GgmlDType::Q8_0
            | GgmlDType::Q5_0
            | GgmlDType::Q4K
            | GgmlDType::Q6K
    )
}

/// `dst = lhs · Wᵀ`: `lhs` is `(m, k)` row-major f32, `data` the stored bytes of a `(n, k)`
/// matrix of `dtype`, `dst` is `(m, n)`. Runs on the current rayon pool, split over chunks of
/// weight rows ([`split`]) however many activation rows there are.
///
/// Allocates the quantized activations on every call, and a transposed result for several
/// rows (reused buffers are a later step).
pub fn matmul(
    path: Path,
    dtype: GgmlDType,
    data: &[u8],
    (m, k, n): (usize, usize, usize),
    lhs: &[f32],
    dst: &mut [f32],
) -> Result<()> {
    if k == 0 || k % BLOCK != 0 {
        bail!("quantized matmul: rows of {k} values are not a multiple of {BLOCK}");
    }
    if lhs.len() != m * k || dst.len() != m * n {
        bail!(
            "quantized matmul: {} inputs and {} outputs for (m, k, n) = ({m}, {k}, {n})",
            lhs.len(),
            dst.len()
        );
    }
    match dtype {
        GgmlDType::Q4_0 => run::<BlockQ4_0>(path, data, (k, n), lhs, dst),
        GgmlDType::Q4_1 => run::<BlockQ4_1>(path, data, (k, n), lhs, dst),
        GgmlDType::Q8_0 => run::<BlockQ8_0>(path, data, (k, n), lhs, dst),
        GgmlDType::Q5_0 => run::<kquants::BlockQ5_0>(path, data, (k, n), lhs, dst),
        GgmlDType::Q4K => run::<kquants::BlockQ4K>(path, data, (k, n), lhs, dst),
        GgmlDType::Q6K => run::<kquants::BlockQ6K>(path, data, (k, n), lhs, dst),
        _ => bail!("quantized matmul: no kernel for {dtype:?}"),
    }
}

/// candle's `k_quants::BlockQ4_0`: `w = d · (q - 8)`, q the low nibbles of `qs` for values
/// 0..16, the high ones for 16..32. The f16 scale is kept as bytes so that the struct has
/// alignment 1 and any whole-block byte slice can be read as blocks.
#[repr(C)]
struct BlockQ4_0 {
    d: [u8; 2],
    qs: [u8; BLOCK / 2],
}

/// candle's `k_quants::BlockQ4_1`: `w = d · q + m`, nibbles as in [`BlockQ4_0`].
#[repr(C)]
struct BlockQ4_1 {
    d: [u8; 2],
    m: [u8; 2],
    qs: [u8; BLOCK / 2],
}

/// candle's `k_quants::BlockQ8_0`: `w = d · q`.
#[repr(C)]
struct BlockQ8_0 {
    d: [u8; 2],
    qs: [i8; BLOCK],
}

/// 32 activations, `x ≈ d · qs`, with `sum = Σ qs` (Q4_0's offset of 8) and `s = d · sum`
/// (Q4_1's minimum). `d` and `s` are rounded to f16 as llama.cpp's Q8_0/Q8_1 blocks store them,
/// so results match its kernels up to summation order.
struct BlockQ8 {
    d: f32,
    s: f32,
    sum: f32,
    qs: [i8; BLOCK],
}

/// Quantized activations: [`BlockQ8`] for the 32-value weight types, [`kquants::BlockQ8K`]
/// for the K-quants.
trait Activations: Sized + Sync {
    /// Activations per block.
    const VALUES: usize;
    /// `lhs`, whole blocks, quantized. Inlined into [`quantize`], which compiles it with the
    /// path's target features.
    fn blocks(lhs: &[f32]) -> Vec<Self>;
}

/// A weight block type and its dot product with quantized activations, one row of each.
trait Block: Sized + Sync {
    const DTYPE: GgmlDType;
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
    const DTYPE: GgmlDType = GgmlDType::Q4_0;
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
    const DTYPE: GgmlDType = GgmlDType::Q4_1;
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
    const DTYPE: GgmlDType = GgmlDType::Q8_0;
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

fn f16_bytes(d: [u8; 2]) -> f32 {
    f16::from_le_bytes(d).to_f32()
}

fn run<W: Block>(
    path: Path,
    data: &[u8],
    (k, n): (usize, usize),
    lhs: &[f32],
    dst: &mut [f32],
) -> Result<()> {
    if k % W::VALUES != 0 {
        bail!(
            "quantized matmul: rows of {k} values are not whole {:?} blocks of {}",
            W::DTYPE,
            W::VALUES
        );
    }
    let kb = k / W::VALUES;
    let size = std::mem::size_of::<W>();
    if data.len() != n * kb * size {
        bail!(
            "quantized matmul: {} bytes are not a ({n}, {k}) {:?} matrix",
            data.len(),
            W::DTYPE
        );
    }
    // SAFETY: `W` is a `repr(C)` struct of byte arrays (alignment 1, no padding, any bit
    // pattern valid), and `data` holds exactly `n * kb` of them (checked above).
    let w = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<W>(), n * kb) };
    let x = quantize::<W::X>(path, lhs);
    let blocks = (kb, k / W::X::VALUES);
    match path {
        Path::Scalar => split(w, &x, blocks, dst, pairwise(W::dot_scalar)),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => match avx2::Avx2::detect() {
            Some(cpu) => split(w, &x, blocks, dst, |w, wb, xs, out| {
                W::tile_avx2(cpu, w, wb, xs, out)
            }),
            None => bail!("quantized matmul: this CPU has no AVX2, FMA and F16C"),
        },
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => match avx512::Avx512::detect() {
            Some(cpu) => split(w, &x, blocks, dst, |w, wb, xs, out| {
                W::dot_avx512(cpu, w, wb, xs, out)
            }),
            None => bail!("quantized matmul: this CPU has no AVX-512 F, BW and VNNI"),
        },
        #[cfg(not(target_arch = "x86_64"))]
        Path::Avx2 | Path::Avx512 => bail!("quantized matmul: {path:?} exists only on x86_64"),
    }
    Ok(())
}

/// What computes a tile: weight rows of `wb` blocks against activation rows, `out[j][r]`.
trait TileDot<W, X>: Fn(&[W], usize, &[&[X]], &mut Tile) + Sync {}
impl<W, X, F: Fn(&[W], usize, &[&[X]], &mut Tile) + Sync> TileDot<W, X> for F {}

/// A one-row dot product applied to each (weight row, activation row) pair of a tile.
fn pairwise<W, X>(dot: impl Fn(&[W], &[X]) -> f32 + Sync) -> impl TileDot<W, X> {
    move |w, wb, xs, out| {
        for (w, out) in w.chunks_exact(wb).zip(out.iter_mut()) {
            for (x, out) in xs.iter().zip(out.iter_mut()) {
                *out = dot(w, x);
            }
        }
    }
}

/// Activations to 8 bits per block. Rows are whole blocks, so blocks never straddle two rows.
/// The same code on every path; compiled for AVX2 where the path has it, rounding becomes
/// inline vector code instead of a call to `roundf` per value.
fn quantize<X: Activations>(path: Path, lhs: &[f32]) -> Vec<X> {
    #[cfg(target_arch = "x86_64")]
    if path != Path::Scalar && avx2::Avx2::detect().is_some() {
        #[target_feature(enable = "avx2,fma,f16c")]
        fn with_avx2<X: Activations>(lhs: &[f32]) -> Vec<X> {
            X::blocks(lhs)
        }
        // SAFETY: the CPU has the features (checked above).
        return unsafe { with_avx2(lhs) };
    }
    let _ = path;
    X::blocks(lhs)
}

impl Activations for BlockQ8 {
    const VALUES: usize = BLOCK;

    /// llama.cpp's `quantize_row_q8_1`. A loop rather than `map(..).collect()`, whose closure
    /// would compile on its own, without the caller's target features.
    #[inline(always)]
    fn blocks(lhs: &[f32]) -> Vec<BlockQ8> {
        let mut blocks = Vec::with_capacity(lhs.len() / BLOCK);
        for x in lhs.chunks_exact(BLOCK) {
            let mut amax = 0f32;
            for v in x {
                amax = amax.max(v.abs());
            }
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qs = [0i8; BLOCK];
            let mut sum = 0i32;
            for (q, v) in qs.iter_mut().zip(x) {
                *q = (v * id).round() as i8;
                sum += i32::from(*q);
            }
            blocks.push(BlockQ8 {
                d: f16::from_f32(d).to_f32(),
                s: f16::from_f32(d * sum as f32).to_f32(),
                sum: sum as f32,
                qs,
            });
        }
        blocks
    }
}

/// Fills `dst` (`(m, n)`) in parallel over chunks of weight rows, a few per thread, so that
/// the weights are read once however many activation rows there are. A weight row is `wb`
/// blocks, an activation row `xb`. Several rows are computed as `dstᵀ` and transposed (one
/// row needs neither).
fn split<W: Sync, X: Sync>(
    w: &[W],
    x: &[X],
    (wb, xb): (usize, usize),
    dst: &mut [f32],
    dot: impl TileDot<W, X>,
) {
    let m = x.len() / xb;
    let n = w.len() / wb;
    if m == 0 || n == 0 {
        return;
    }
    let chunk = n.div_ceil(4 * rayon::current_num_threads()).max(16);
    let fill = |out: &mut [f32]| {
        out.par_chunks_mut(chunk * m)
            .zip(w.par_chunks(chunk * wb))
            .for_each(|(out, w)| tile(w, x, (wb, xb), out, &dot));
    };
    if m == 1 {
        fill(dst);
    } else {
        let mut transposed = vec![0f32; n * m];
        fill(&mut transposed);
        for (j, column) in transposed.chunks_exact(m).enumerate() {
            for (r, v) in column.iter().enumerate() {
                dst[r * n + j] = *v;
            }
        }
    }
}

/// `out[j][r]` = weight row `j` · activation row `r`, in tiles of [`WROWS`] weight rows by
/// [`ROWS`] activation rows.
fn tile<W, X>(
    w: &[W],
    x: &[X],
    (wb, xb): (usize, usize),
    out: &mut [f32],
    dot: &impl TileDot<W, X>,
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
