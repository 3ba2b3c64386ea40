//! A linear layer `y = x Wᵀ (+ b)` with a copy of W per phase, through lmhost's kernels
//! ([`crate::kernels`]) or candle's.

use std::sync::Arc;

use candle_core::quantized::k_quants::{self, BlockQ2K, BlockQ3K, BlockQ5K, BlockQ5_1};
use candle_core::quantized::{GgmlDType, GgmlType, QMatMul, QTensor};
use candle_core::{DType, Module, Result, Tensor};

use smallvec::SmallVec;

use crate::kernels::{self, bf16, Layout, Path};
use crate::memory::PACKED;

use super::*;

/// `dst = lhs · blocksᵀ` over a matrix's stored bytes, `(m, k, n)`.
type BlockMatmul = fn(&[u8], (usize, usize, usize), &[f32], &mut [f32]) -> Result<()>;

/// A linear layer `y = x Wᵀ (+ b)` with an optional second copy of W for generating.
#[derive(Debug, Clone)]
pub struct Linear {
    pub(super) prefill: Kernel,
    decode: Option<Kernel>,
    bias: Option<Tensor>,
}

/// How a layer multiplies by its weight.
#[derive(Debug, Clone)]
pub(super) enum Kernel {
    Candle(QMatMul),
    /// A dense CPU matrix rounded to bf16 and packed for [`bf16::Packed::matmul`].
    Bf16(Arc<bf16::Packed>),
    /// A quantized CPU matrix our kernels ([`crate::kernels`]) read.
    Lmhost(Blocks),
    /// A quantized CPU matrix of a type ours lack, read in place by candle's unpacked kernel
    /// for it.
    Unpacked(Arc<QTensor>, BlockMatmul),
}

impl Kernel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Kernel::Candle(w) => w.forward(x),
            Kernel::Lmhost(w) => Ok(lmhost_matmuls(&[w], x)?.remove(0)),
            Kernel::Bf16(w) => on_rows(x, w.shape(), |lhs, dst| {
                w.matmul(lhs, dst);
                Ok(())
            }),
            Kernel::Unpacked(w, kernel) => {
                let (n, k) = w.shape().dims2()?;
                let data = w.data()?;
                on_rows(x, (n, k), |lhs, dst| {
                    kernel(&data, (lhs.len() / k.max(1), k, n), lhs, dst)
                })
            }
        }
    }
}

/// A quantized CPU matrix for our kernels: the stored blocks, read in place, or where the
/// fastest path has a layout of its own for the type ([`kernels::interleave`]) and nothing
/// else holds the stored blocks (a tied table under [`Embedding::new`] does; [`tied`] lets
/// the layer hold them alone), that layout, made once in place of them.
#[derive(Debug, Clone)]
pub(super) struct Blocks {
    pub(super) dtype: GgmlDType,
    pub(super) shape: (usize, usize),
    pub(super) data: BlockData,
}

#[derive(Debug, Clone)]
pub(super) enum BlockData {
    Stored(Arc<QTensor>),
    Interleaved(Arc<Vec<u8>>),
}

impl Blocks {
    /// `q`'s blocks, interleaved where that is faster and `q` is the caller's alone.
    fn new(q: &Arc<QTensor>) -> Result<Blocks> {
        let (dtype, shape) = (q.dtype(), q.shape().dims2()?);
        let interleaved = match Arc::strong_count(q) {
            1 => kernels::interleave(Path::best(), dtype, &q.data()?, shape)?,
            _ => None,
        };
        let data = match interleaved {
            Some(bytes) => BlockData::Interleaved(Arc::new(bytes)),
            None => BlockData::Stored(q.clone()),
        };
        Ok(Blocks { dtype, shape, data })
    }

    /// The matrix our kernels read, borrowing the bytes where they lie.
    fn matrix(&self) -> Result<kernels::Matrix<'_>> {
        let (data, layout) = match &self.data {
            BlockData::Stored(q) => match q.data()? {
                std::borrow::Cow::Borrowed(data) => (data, Layout::Stored),
                std::borrow::Cow::Owned(_) => candle_core::bail!("blocks off the CPU"),
            },
            BlockData::Interleaved(bytes) => (bytes.as_slice(), Layout::Interleaved),
        };
        Ok(kernels::Matrix {
            dtype: self.dtype,
            data,
            rows: self.shape.0,
            layout,
        })
    }

    /// The bytes and their layout.
    fn bytes(&self) -> Result<(std::borrow::Cow<'_, [u8]>, Layout)> {
        Ok(match &self.data {
            BlockData::Stored(q) => (q.data()?, Layout::Stored),
            BlockData::Interleaved(bytes) => (bytes.as_slice().into(), Layout::Interleaved),
        })
    }
}

/// Our kernels' layer for `q`, if they run its type and it is on CPU.
fn lmhost_kernel(q: &Arc<QTensor>) -> Result<Option<Kernel>> {
    if !(q.device().is_cpu() && kernels::supports(q.dtype())) {
        return Ok(None);
    }
    Blocks::new(q).map(|blocks| Some(Kernel::Lmhost(blocks)))
}

/// Candle's unpacked kernel for `q`, for the quantized types ours lack (none for float types,
/// which compute dense).
fn candle_unpacked(q: &Arc<QTensor>) -> Option<Kernel> {
    let kernel: BlockMatmul = match q.dtype() {
        GgmlDType::Q5_1 => matmul_blocks::<BlockQ5_1>,
        GgmlDType::Q2K => matmul_blocks::<BlockQ2K>,
        GgmlDType::Q3K => matmul_blocks::<BlockQ3K>,
        GgmlDType::Q5K => matmul_blocks::<BlockQ5K>,
        _ => return None,
    };
    q.device()
        .is_cpu()
        .then(|| Kernel::Unpacked(q.clone(), kernel))
}

/// `w` requantized to `to`; rows that do not fit its blocks stay dense, in the compute `dtype`.
fn requantize(w: &Weight, to: GgmlDType, dtype: DType) -> Result<Kernel> {
    let dense = w.dense(DType::F32)?;
    if dense.dim(candle_core::D::Minus1)? % to.block_size() != 0 {
        return Ok(Kernel::Candle(QMatMul::Tensor(dense.to_dtype(dtype)?)));
    }
    QMatMul::from_qtensor(QTensor::quantize(&dense, to)?).map(Kernel::Candle)
}

/// `w` rounded to bf16 for [`bf16::Packed`]; refused where that cannot run.
fn bf16_kernel(w: &Weight, dtype: DType) -> Result<Kernel> {
    if dtype != DType::F32 || !w.device().is_cpu() {
        candle_core::bail!(
            "`weights = \"bf16\"` runs on CPU with f32 compute (it rounds only the matrix \
             products' inputs); for another device or dtype use `auto`"
        );
    }
    if !bf16::available() {
        candle_core::bail!(
            "`weights = \"bf16\"` needs a CPU with AVX-512 BF16 (allowed by `LMHOST_SIMD`); this \
             one lacks it: use `auto` (f32 scoring, exact) or `compact` (8-bit activations)"
        );
    }
    let packed = match w {
        // Row by row from the blocks: no f32 copy of the matrix, which is most of a quantized
        // file's load time (allocating and faulting in its pages) under `bf16`.
        Weight::Quantized(q) => {
            let shape = q.shape().dims2()?;
            let data = q.data()?;
            bf16::Packed::from_rows(shape, |j, row| {
                dequantize_row(q.dtype(), &data, j, row).is_ok()
            })
        }
        Weight::Dense(_) => {
            let dense = w.dense(DType::F32)?.contiguous()?;
            let shape = dense.dims2()?;
            f32_values(&dense, |values| bf16::Packed::new(values, shape)).flatten()
        }
    };
    packed
        .map(|packed| Kernel::Bf16(Arc::new(packed)))
        .ok_or_else(|| candle_core::Error::Msg("a bf16 matrix that could not be packed".into()))
}

/// `auto`'s decode copy: the stored blocks where our kernels run them, else [`decode_copy`].
fn stored_for_decode(w: &Weight, dtype: DType) -> Result<Kernel> {
    match w {
        Weight::Quantized(q) => lmhost_kernel(q)?.map_or_else(|| decode_copy(w, dtype), Ok),
        w => decode_copy(w, dtype),
    }
}

/// `mixed`'s decode copy: Q8_0, on CPU through our kernel.
fn decode_copy(w: &Weight, dtype: DType) -> Result<Kernel> {
    Ok(match requantize(w, GgmlDType::Q8_0, dtype)? {
        Kernel::Candle(QMatMul::QTensor(q)) => {
            lmhost_kernel(&q)?.unwrap_or(Kernel::Candle(QMatMul::QTensor(q)))
        }
        other => other,
    })
}

/// `x Wᵢᵀ` for quantized CPU matrices of our kernels' types that share the input `x`, in one
/// [`kernels::matmul_group`] call (activations quantized to 8 bits per block, as `QMatMul`
/// does).
fn lmhost_matmuls(ws: &[&Blocks], x: &Tensor) -> Result<Vec<Tensor>> {
    let shapes: Vec<(usize, usize)> = ws.iter().map(|w| w.shape).collect();
    for &shape in &shapes {
        check_input(x, shape)?;
    }
    let (lhs, k) = (rows(x)?, x.dim(candle_core::D::Minus1)?);
    let m = lhs.len() / k.max(1);
    let bytes = ws.iter().map(|w| w.bytes()).collect::<Result<Vec<_>>>()?;
    let matrices: Vec<_> = ws
        .iter()
        .zip(&bytes)
        .zip(&shapes)
        .map(|((w, (data, layout)), &(rows, _))| kernels::Matrix {
            dtype: w.dtype,
            data,
            rows,
            layout: *layout,
        })
        .collect();
    let mut dsts: Vec<Vec<f32>> = shapes.iter().map(|&(n, _)| vec![0f32; m * n]).collect();
    let mut outs: Vec<&mut [f32]> = dsts.iter_mut().map(Vec::as_mut_slice).collect();
    kernels::Scratch::with(|scratch| {
        kernels::matmul_group(Path::best(), &matrices, (m, k), &lhs, &mut outs, scratch)
    })?;
    dsts.into_iter()
        .zip(&shapes)
        .map(|(dst, &(n, _))| output(x, dst, n))
        .collect()
}

/// Refuses an `x` whose last axis is not the `k` of an `(n, k)` weight.
fn check_input(x: &Tensor, (n, k): (usize, usize)) -> Result<()> {
    if x.dim(candle_core::D::Minus1)? != k {
        candle_core::bail!("matmul: input {:?} for a ({n}, {k}) weight", x.dims());
    }
    Ok(())
}

/// `x Wᵀ` for an `(n, k)` matrix, `f(rows, dst)` computing it over `x`'s rows: read where they
/// lie when `x` is f32 on CPU (a pass's activations are), else converted.
fn on_rows(
    x: &Tensor,
    (n, k): (usize, usize),
    f: impl Fn(&[f32], &mut [f32]) -> Result<()>,
) -> Result<Tensor> {
    check_input(x, (n, k))?;
    let x = x.contiguous()?;
    let mut dst = vec![0f32; x.elem_count() / k.max(1) * n];
    match f32_values(&x, |lhs| f(lhs, &mut dst)) {
        Some(done) => done?,
        None => f(&rows(&x)?, &mut dst)?,
    }
    output(&x, dst, n)
}

/// `x`'s values in f32, row-major.
fn rows(x: &Tensor) -> Result<Vec<f32>> {
    x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

/// `dst` shaped as `x` with `n` for its last axis.
fn output(x: &Tensor, dst: Vec<f32>, n: usize) -> Result<Tensor> {
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    Tensor::from_vec(dst, dims, x.device())
}

fn matmul_blocks<T: GgmlType>(
    data: &[u8],
    (m, k, n): (usize, usize, usize),
    lhs: &[f32],
    dst: &mut [f32],
) -> Result<()> {
    k_quants::matmul((m, k, n), lhs, blocks_of::<T>(data, (n, k))?, dst)
}

/// The bytes of a CPU QTensor's `(n, k)` matrix (or of some of its rows) as its blocks.
fn blocks_of<T: GgmlType>(data: &[u8], (n, k): (usize, usize)) -> Result<&[T]> {
    let size = std::mem::size_of::<T>();
    let whole = data.len() == n * (k / T::BLCK_SIZE) * size && k % T::BLCK_SIZE == 0;
    if !whole || data.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        candle_core::bail!(
            "{} bytes are not a ({n}, {k}) {:?} matrix",
            data.len(),
            T::DTYPE
        );
    }
    // SAFETY: candle keeps a CPU QTensor as a Vec of its block type (plain structs of integers
    // and floats, any bit pattern valid) and `data` borrows that Vec's bytes (or whole rows of
    // them): aligned, whole blocks, and as many as the shape needs (all checked above).
    Ok(unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<T>(), data.len() / size) })
}

/// Row `id` of the CPU QTensor bytes `data` of `dtype` into `out` (one row's values).
pub(super) fn dequantize_row(
    dtype: GgmlDType,
    data: &[u8],
    id: usize,
    out: &mut [f32],
) -> Result<()> {
    fn row<T: GgmlType>(data: &[u8], id: usize, out: &mut [f32]) -> Result<()> {
        let k = out.len();
        let bytes = k / T::BLCK_SIZE * std::mem::size_of::<T>();
        let Some(data) = data.get(id * bytes..(id + 1) * bytes) else {
            candle_core::bail!("row {id} is past the end of the tensor");
        };
        T::to_float(blocks_of::<T>(data, (1, k))?, out);
        Ok(())
    }
    use candle_core::quantized::k_quants::*;
    match dtype {
        GgmlDType::F32 => row::<f32>(data, id, out),
        GgmlDType::F16 => row::<half::f16>(data, id, out),
        GgmlDType::BF16 => row::<half::bf16>(data, id, out),
        GgmlDType::Q4_0 => row::<BlockQ4_0>(data, id, out),
        GgmlDType::Q4_1 => row::<BlockQ4_1>(data, id, out),
        GgmlDType::Q5_0 => row::<BlockQ5_0>(data, id, out),
        GgmlDType::Q5_1 => row::<BlockQ5_1>(data, id, out),
        GgmlDType::Q8_0 => row::<BlockQ8_0>(data, id, out),
        GgmlDType::Q8_1 => row::<BlockQ8_1>(data, id, out),
        GgmlDType::Q2K => row::<BlockQ2K>(data, id, out),
        GgmlDType::Q3K => row::<BlockQ3K>(data, id, out),
        GgmlDType::Q4K => row::<BlockQ4K>(data, id, out),
        GgmlDType::Q5K => row::<BlockQ5K>(data, id, out),
        GgmlDType::Q6K => row::<BlockQ6K>(data, id, out),
        GgmlDType::Q8K => row::<BlockQ8K>(data, id, out),
    }
}

/// `w` as stored: through candle's kernels where candle has a fast CPU path for its type (the
/// types it repacks, [`PACKED`]), else through ours where they run it. Candle computes the other
/// types one row pair at a time, which on a scoring pass's many rows made `as_stored` a cliff
/// beside `compact` (ours, on the same blocks).
fn as_stored(w: Weight, dtype: DType) -> Result<Kernel> {
    if let Weight::Quantized(q) = &w {
        if !PACKED.contains(&q.dtype()) {
            if let Some(kernel) = lmhost_kernel(q)? {
                return Ok(kernel);
            }
        }
    }
    candle_as_stored(w, dtype)
}

/// `w` as stored, through candle's kernels (a dense weight in `dtype`).
fn candle_as_stored(w: Weight, dtype: DType) -> Result<Kernel> {
    Ok(Kernel::Candle(match w {
        Weight::Dense(t) => QMatMul::Tensor(t.to_dtype(dtype)?),
        // Candle dequantizes a float-typed matrix (F32, F16, BF16) to f32: it computes in
        // `dtype` too, as a dense weight does (bf16 on CUDA).
        Weight::Quantized(q) => match QMatMul::from_arc(q)? {
            QMatMul::Tensor(t) => QMatMul::Tensor(t.to_dtype(dtype)?),
            other => other,
        },
    }))
}

impl Linear {
    /// Builds the layer in `format`, computing in `dtype` where dense.
    pub fn new(
        w: Weight,
        bias: Option<Tensor>,
        format: WeightFormat,
        dtype: DType,
    ) -> Result<Self> {
        let dense = |w: &Weight| w.dense(dtype).map(|t| Kernel::Candle(QMatMul::Tensor(t)));
        let quantized = matches!(w, Weight::Quantized(_));
        let (prefill, decode) = match format {
            WeightFormat::Auto if format.decode_copy(quantized, dtype, &w.device()) => {
                (dense(&w)?, Some(stored_for_decode(&w, dtype)?))
            }
            WeightFormat::Mixed => (dense(&w)?, Some(decode_copy(&w, dtype)?)),
            WeightFormat::Compact => match w {
                Weight::Quantized(q) => match lmhost_kernel(&q)?.or_else(|| candle_unpacked(&q)) {
                    Some(kernel) => (kernel, None),
                    None => (candle_as_stored(Weight::Quantized(q), dtype)?, None),
                },
                w => (candle_as_stored(w, dtype)?, None),
            },
            WeightFormat::Auto | WeightFormat::AsStored => (as_stored(w, dtype)?, None),
            WeightFormat::Dense => (dense(&w)?, None),
            WeightFormat::Bf16 => {
                let decode = quantized
                    .then(|| stored_for_decode(&w, dtype))
                    .transpose()?;
                (bf16_kernel(&w, dtype)?, decode)
            }
            WeightFormat::Q8_0 => (requantize(&w, GgmlDType::Q8_0, dtype)?, None),
            WeightFormat::Q4_0 => (requantize(&w, GgmlDType::Q4_0, dtype)?, None),
        };
        let bias = bias.map(|b| b.to_dtype(dtype)).transpose()?;
        Ok(Linear {
            prefill,
            decode,
            bias,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.add_bias(self.kernel().forward(x)?)
    }

    /// `x Wᵢᵀ (+ bᵢ)` of layers that share their input (q, k and v; gate and up): one call of
    /// our kernels for all of them where each runs ours in this phase (one wait for the pool
    /// instead of one per matrix, the same results), else layer by layer.
    pub fn forward_group<const N: usize>(layers: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let kernels = layers.map(Linear::kernel);
        let ours_all: Option<Vec<&Blocks>> = kernels
            .iter()
            .map(|k| match k {
                Kernel::Lmhost(w) => Some(w),
                _ => None,
            })
            .collect();
        let ys = match ours_all {
            Some(ws) => lmhost_matmuls(&ws, x)?,
            None => kernels
                .iter()
                .map(|k| k.forward(x))
                .collect::<Result<_>>()?,
        };
        let ys = layers
            .iter()
            .zip(ys)
            .map(|(l, y)| l.add_bias(y))
            .collect::<Result<Vec<_>>>()?;
        <[Tensor; N]>::try_from(ys)
            .map_err(|ys| candle_core::Error::Msg(format!("{} outputs of {N} layers", ys.len())))
    }

    /// Whether this phase's product rounds its input to bf16 (`weights = "bf16"` scoring), so
    /// the input need not be computed finer.
    pub fn rounds_input_to_bf16(&self) -> bool {
        matches!(self.kernel(), Kernel::Bf16(_))
    }

    /// Whether [`Linear::decode_into`] runs this layer: its decode kernel is ours, its bias
    /// (if any) f32 on CPU.
    pub fn decodes_in_place(&self) -> bool {
        let bias = self
            .bias
            .as_ref()
            .is_none_or(|b| f32_values(b, |_| ()).is_some());
        matches!(self.decode_kernel(), Kernel::Lmhost(_)) && bias
    }

    /// `outs[i] = x Wᵢᵀ (+ bᵢ)` through each layer's decode kernel, into the caller's
    /// buffers: `x` is rows of `k` values, `outs[i]` as many rows of layer `i`'s outputs.
    /// Allocates nothing once `scratch` is large enough. Every layer must
    /// [`Linear::decodes_in_place`].
    pub fn decode_into(
        layers: &[&Linear],
        (x, k): (&[f32], usize),
        outs: &mut [&mut [f32]],
        scratch: &mut kernels::Scratch,
    ) -> Result<()> {
        let matrices = layers
            .iter()
            .map(|l| match l.decode_kernel() {
                Kernel::Lmhost(blocks) if blocks.shape.1 == k => blocks.matrix(),
                _ => candle_core::bail!("a layer without our decode kernel for {k} inputs"),
            })
            .collect::<Result<SmallVec<[_; 3]>>>()?;
        let m = x.len() / k.max(1);
        kernels::matmul_group(Path::best(), &matrices, (m, k), x, outs, scratch)?;
        for (layer, out) in layers.iter().zip(outs.iter_mut()) {
            if let Some(bias) = &layer.bias {
                f32_values(bias, |b| {
                    for row in out.chunks_exact_mut(b.len().max(1)) {
                        row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                    }
                })
                .ok_or_else(|| candle_core::Error::Msg("a bias off the CPU".into()))?;
            }
        }
        Ok(())
    }

    /// The kernel generating computes with.
    fn decode_kernel(&self) -> &Kernel {
        self.decode.as_ref().unwrap_or(&self.prefill)
    }

    /// The kernel of this phase.
    fn kernel(&self) -> &Kernel {
        match &self.decode {
            Some(decode) if is_generating() => decode,
            _ => &self.prefill,
        }
    }

    fn add_bias(&self, y: Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` on CPU in f32 computes prefill and scoring with the dense f32 matrix (exactly) and
    /// only [`generating`] passes with the stored blocks, through the same kernel `compact` runs.
    #[test]
    fn auto_decodes_from_the_stored_blocks_and_scores_in_f32() -> Result<()> {
        let dense = Tensor::randn(0f32, 1.0, (64, 128), &Device::Cpu)?;
        let w = Weight::Quantized(Arc::new(QTensor::quantize(&dense, GgmlDType::Q4_1)?));
        let x = Tensor::randn(0f32, 1.0, (1, 128), &Device::Cpu)?;
        let layer = |format| Linear::new(w.clone(), None, format, DType::F32);
        let auto = layer(WeightFormat::Auto)?;
        let exact = layer(WeightFormat::Dense)?.forward(&x)?;
        let blocks = layer(WeightFormat::Compact)?.forward(&x)?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            a.sub(b)?.abs()?.max_all()?.to_scalar::<f32>()
        };
        assert_eq!(diff(&auto.forward(&x)?, &exact)?, 0.0);
        assert_eq!(diff(&generating(|| auto.forward(&x))?, &blocks)?, 0.0);
        // The two really differ (8-bit activations), so the checks above tell them apart.
        assert!(diff(&blocks, &exact)? > 0.0);
        // The phase ends with the closure, even one that panics.
        assert_eq!(diff(&auto.forward(&x)?, &exact)?, 0.0);
        assert!(std::panic::catch_unwind(|| generating(|| panic!("in a decode step"))).is_err());
        assert_eq!(diff(&auto.forward(&x)?, &exact)?, 0.0);
        Ok(())
    }

    /// A quantized matrix is dequantized row by row, in parallel, to candle's values bit for
    /// bit; and under `bf16` rounded from its blocks likewise: the same products as the matrix
    /// dequantized whole and then rounded. For a type of 32-value blocks and a K-quant of 256,
    /// over panels a task's share leaves short.
    #[test]
    fn a_quantized_matrix_unpacks_row_by_row_as_candle_dequantizes_it() -> Result<()> {
        let x = Tensor::randn(0f32, 1.0, (7, 256), &Device::Cpu)?;
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q6K] {
            let dense = Tensor::randn(0f32, 1.0, (300, 256), &Device::Cpu)?;
            let q = Arc::new(QTensor::quantize(&dense, dtype)?);
            let values = q.dequantize(&Device::Cpu)?;
            let ours = Weight::Quantized(q.clone()).dense(DType::F32)?;
            assert_eq!(
                ours.flatten_all()?.to_vec1::<f32>()?,
                values.flatten_all()?.to_vec1::<f32>()?,
                "{dtype:?} dequantized"
            );
            // Only a CPU with AVX-512 BF16 packs bf16 matrices; CI's machines have it.
            if !bf16::available() {
                continue;
            }
            let from_blocks =
                Linear::new(Weight::Quantized(q), None, WeightFormat::Bf16, DType::F32)?;
            let from_values =
                Linear::new(Weight::Dense(values), None, WeightFormat::Bf16, DType::F32)?;
            let (a, b) = (from_blocks.forward(&x)?, from_values.forward(&x)?);
            assert_eq!(
                a.flatten_all()?.to_vec1::<f32>()?,
                b.flatten_all()?.to_vec1::<f32>()?,
                "{dtype:?}"
            );
        }
        Ok(())
    }

    /// `as_stored` runs candle's kernels on the types candle repacks, and ours on the types it
    /// computes row pair by row pair (Q4_1, Q5_0): the same results as `compact` there, bit for
    /// bit, and candle's own (which differ from ours in the order of their sums) on Q4_0.
    #[test]
    fn as_stored_runs_ours_where_candle_has_no_fast_kernel() -> Result<()> {
        let x = Tensor::randn(0f32, 1.0, (8, 256), &Device::Cpu)?;
        let dense = Tensor::randn(0f32, 1.0, (64, 256), &Device::Cpu)?;
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q4_0] {
            let w = Weight::Quantized(Arc::new(QTensor::quantize(&dense, dtype)?));
            let layer = |format| Linear::new(w.clone(), None, format, DType::F32);
            let stored = layer(WeightFormat::AsStored)?;
            let ours = !PACKED.contains(&dtype);
            assert_eq!(
                matches!(stored.prefill, Kernel::Lmhost(_)),
                ours,
                "{dtype:?}"
            );
            if ours {
                let compact = layer(WeightFormat::Compact)?.forward(&x)?;
                let gap = stored.forward(&x)?.sub(&compact)?.abs()?.max_all()?;
                assert_eq!(gap.to_scalar::<f32>()?, 0.0, "{dtype:?}");
            }
        }
        Ok(())
    }

    /// A float-typed stored matrix (a GGUF's F16) computes in the compute dtype, as a dense one
    /// does: candle dequantizes it to f32, which a half-precision pass (CUDA's bf16) could not
    /// multiply by.
    #[test]
    fn a_float_typed_stored_matrix_computes_in_the_compute_dtype() -> Result<()> {
        let dense = Tensor::randn(0f32, 1.0, (16, 64), &Device::Cpu)?;
        let w = Weight::Quantized(Arc::new(QTensor::quantize(&dense, GgmlDType::F16)?));
        let x = Tensor::randn(0f32, 1.0, (1, 3, 64), &Device::Cpu)?.to_dtype(DType::F16)?;
        for format in [WeightFormat::AsStored, WeightFormat::Compact] {
            let y = Linear::new(w.clone(), None, format, DType::F16)?.forward(&x)?;
            assert_eq!((y.dtype(), y.dims()), (DType::F16, &[1, 3, 16][..]));
        }
        Ok(())
    }

    /// Requantizing keeps a matrix whose rows do not fit the blocks dense, and in the compute
    /// dtype too, in every format that requantizes, in both phases.
    #[test]
    fn rows_too_short_to_requantize_stay_dense_in_the_compute_dtype() -> Result<()> {
        let w = Weight::Dense(Tensor::randn(0f32, 1.0, (16, 40), &Device::Cpu)?);
        let x = Tensor::randn(0f32, 1.0, (1, 3, 40), &Device::Cpu)?.to_dtype(DType::F16)?;
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Mixed] {
            let layer = Linear::new(w.clone(), None, format, DType::F16)?;
            for y in [layer.forward(&x)?, generating(|| layer.forward(&x))?] {
                assert_eq!((y.dtype(), y.dims()), (DType::F16, &[1, 3, 16][..]));
            }
        }
        Ok(())
    }

    /// A group of layers gives each layer's own result: in one kernel call where all run ours
    /// (decode; biases added after), layer by layer where one does not (prefill's dense copies;
    /// candle's unpacked kernel for a type ours lack).
    #[test]
    fn a_group_of_layers_gives_each_layers_result() -> Result<()> {
        let layer = |dtype, n, format, bias: bool| -> Result<Linear> {
            let dense = Tensor::randn(0f32, 1.0, (n, 256), &Device::Cpu)?;
            let w = Weight::Quantized(Arc::new(QTensor::quantize(&dense, dtype)?));
            let b = bias
                .then(|| Tensor::randn(0f32, 1.0, n, &Device::Cpu))
                .transpose()?;
            Linear::new(w, b, format, DType::F32)
        };
        let q = layer(GgmlDType::Q4_1, 64, WeightFormat::Auto, true)?;
        let k = layer(GgmlDType::Q4K, 20, WeightFormat::Auto, false)?;
        let v = layer(GgmlDType::Q5K, 12, WeightFormat::Compact, true)?;
        let x = Tensor::randn(0f32, 1.0, (1, 3, 256), &Device::Cpu)?;
        let same = |a: &Tensor, b: &Tensor| -> Result<bool> {
            Ok(a.dims() == b.dims() && a.sub(b)?.abs()?.max_all()?.to_scalar::<f32>()? == 0.0)
        };
        for phase in [prefilling::<Result<()>>, generating] {
            phase(|| {
                let [yq, yk] = Linear::forward_group([&q, &k], &x)?;
                assert!(same(&yq, &q.forward(&x)?)? && same(&yk, &k.forward(&x)?)?);
                let [yq, yv] = Linear::forward_group([&q, &v], &x)?;
                assert!(same(&yq, &q.forward(&x)?)? && same(&yv, &v.forward(&x)?)?);
                Ok(())
            })?;
        }
        Ok(())
    }
}
