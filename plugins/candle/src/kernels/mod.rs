//! Quantized matrix × f32 activations computed the way llama.cpp does it: each activation row is
//! quantized to 8 bits per 32 values ([`BlockQ8`]), each weight block's integer dot product with
//! it is scaled once. Decode streams every weight once per token, so reading 4-bit blocks and
//! multiplying integers is what makes it fast; candle's Q4_1 CPU kernel has no SIMD path.
//!
//! Q4_0, Q4_1 and Q8_0 (the types of SmolLM2's GGUF and of the requantized formats), read in
//! place from a candle `QTensor`'s bytes. An AVX2 path is chosen at run time; the scalar one
//! runs everywhere and computes the same integer sums.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod scalar;

use candle_core::quantized::GgmlDType;
use candle_core::{bail, Result};
use half::f16;
use rayon::prelude::*;

/// Values per block, in every type here.
pub const BLOCK: usize = 32;

/// Which implementation computes the dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    Scalar,
    /// AVX2 with FMA and F16C; refused on a CPU without them.
    Avx2,
}

impl Path {
    /// The paths this CPU runs, scalar first.
    pub fn available() -> Vec<Path> {
        let mut paths = vec![Path::Scalar];
        if avx2_detected() {
            paths.push(Path::Avx2);
        }
        paths
    }

    /// The fastest path this CPU runs.
    pub fn best() -> Path {
        if avx2_detected() {
            Path::Avx2
        } else {
            Path::Scalar
        }
    }
}

fn avx2_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    return avx2::Avx2::detect().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether [`matmul`] has a kernel for `dtype`.
pub fn supports(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q8_0)
}

/// `dst = lhs · Wᵀ`: `lhs` is `(m, k)` row-major f32, `data` the stored bytes of a `(n, k)`
/// matrix of `dtype`, `dst` is `(m, n)`. Runs on the current rayon pool, split over output rows
/// for one activation row (decode) and over activation rows for several.
///
/// Allocates the quantized activations on every call (a reused buffer is a later step).
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

/// A weight block type and its dot product with quantized activations, one row of each.
trait Block: Sized + Sync {
    const DTYPE: GgmlDType;
    /// Weights per block: [`BLOCK`], or 256 for the K-quants' super-blocks. A dot product gets
    /// `VALUES / BLOCK` activation blocks per weight block.
    const VALUES: usize = BLOCK;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32;
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32;
}

impl Block for BlockQ4_0 {
    const DTYPE: GgmlDType = GgmlDType::Q4_0;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q4_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q4_0(w, x)
    }
}

impl Block for BlockQ4_1 {
    const DTYPE: GgmlDType = GgmlDType::Q4_1;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q4_1(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q4_1(w, x)
    }
}

impl Block for BlockQ8_0 {
    const DTYPE: GgmlDType = GgmlDType::Q8_0;
    fn dot_scalar(w: &[Self], x: &[BlockQ8]) -> f32 {
        scalar::dot_q8_0(w, x)
    }
    #[cfg(target_arch = "x86_64")]
    fn dot_avx2(cpu: avx2::Avx2, w: &[Self], x: &[BlockQ8]) -> f32 {
        cpu.dot_q8_0(w, x)
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
    let x = quantize(lhs);
    match path {
        Path::Scalar => split(w, &x, (kb, k / BLOCK), dst, W::dot_scalar),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => match avx2::Avx2::detect() {
            Some(cpu) => split(w, &x, (kb, k / BLOCK), dst, |w, x| W::dot_avx2(cpu, w, x)),
            None => bail!("quantized matmul: this CPU has no AVX2, FMA and F16C"),
        },
        #[cfg(not(target_arch = "x86_64"))]
        Path::Avx2 => bail!("quantized matmul: AVX2 exists only on x86_64"),
    }
    Ok(())
}

/// Activations to 8 bits per block (llama.cpp's `quantize_row_q8_1`). Rows are whole blocks,
/// so blocks never straddle two rows.
fn quantize(lhs: &[f32]) -> Vec<BlockQ8> {
    lhs.chunks_exact(BLOCK)
        .map(|x| {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qs = [0i8; BLOCK];
            let mut sum = 0i32;
            for (q, v) in qs.iter_mut().zip(x) {
                *q = (v * id).round() as i8;
                sum += i32::from(*q);
            }
            BlockQ8 {
                d: f16::from_f32(d).to_f32(),
                s: f16::from_f32(d * sum as f32).to_f32(),
                sum: sum as f32,
                qs,
            }
        })
        .collect()
}

/// Fills `dst` (`(m, n)`) in parallel; a weight row is `wb` blocks, an activation row `xb`.
/// One activation row: chunks of output rows, a few per thread so two threads share the
/// weights. Several: whole activation rows per task, each task streaming the weights once for
/// all of its rows.
fn split<W: Sync>(
    w: &[W],
    x: &[BlockQ8],
    (wb, xb): (usize, usize),
    dst: &mut [f32],
    dot: impl Fn(&[W], &[BlockQ8]) -> f32 + Sync,
) {
    let m = x.len() / xb;
    let n = w.len() / wb;
    if m == 0 || n == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    if m >= threads {
        let rows = m.div_ceil(threads);
        dst.par_chunks_mut(rows * n)
            .zip(x.par_chunks(rows * xb))
            .for_each(|(out, x)| tile(w, x, (wb, xb), out, &dot));
    } else {
        let chunk = n.div_ceil(4 * threads).max(16);
        for (out, x) in dst.chunks_mut(n).zip(x.chunks(xb)) {
            out.par_chunks_mut(chunk)
                .zip(w.par_chunks(chunk * wb))
                .for_each(|(out, w)| tile(w, x, (wb, xb), out, &dot));
        }
    }
}

/// `out[r][j]` = weight row `j` · activation row `r`; each weight row is read once for all the
/// activation rows.
fn tile<W>(
    w: &[W],
    x: &[BlockQ8],
    (wb, xb): (usize, usize),
    out: &mut [f32],
    dot: &impl Fn(&[W], &[BlockQ8]) -> f32,
) {
    let width = w.len() / wb;
    for (j, w) in w.chunks_exact(wb).enumerate() {
        for (r, x) in x.chunks_exact(xb).enumerate() {
            out[r * width + j] = dot(w, x);
        }
    }
}
