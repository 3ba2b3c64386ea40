//! Weights as loaded, and the per-phase weight formats linear layers run in.
//!
//! Prefill and scoring pass many rows through each matrix, where f32 GEMM is fast and exact;
//! decode passes one row (or a few, packed), where reading the weights is the cost and integer
//! dot products over the stored 4-bit blocks are fastest. So a linear layer may hold two
//! copies, one per phase, chosen by option `weights` (with `auto` fitted to option
//! `memory_budget` by `crate::memory`). A generation's passes run inside [`generating`]: its
//! decode steps always, its prompt where [`stored_prompts`] says the stored blocks are the
//! faster (the engine caches such prompts' states apart). Every other pass (scoring, explain's
//! scores) uses the prefill copy, so scores stay exact whatever the format.
//!
//! On x86 and aarch64 CPUs candle's quantized matmul keeps a second, repacked copy of Q4_K and
//! Q6_K matrices (and of Q8_0 on VNNI x86 CPUs, Q4_0 and Q5_K on aarch64), made on first use:
//! prefill of many rows runs 4-6x faster, but a Q4_K model takes about 2.3x its file size.
//! `compact` runs the stored blocks instead, no second copy: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and
//! Q6_K through our own kernels ([`crate::kernels`], llama.cpp's integer dot products; on
//! AVX-512 Q4_0, Q4_1, Q5_0 and Q8_0 interleaved, a copy of the same size made at load in
//! place of the stored blocks), other types through candle's unpacked ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use candle_core::quantized::k_quants::{self, BlockQ2K, BlockQ3K, BlockQ5K, BlockQ5_1};
use candle_core::quantized::{GgmlDType, GgmlType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Result, Tensor};

use smallvec::SmallVec;

use crate::kernels::{self, Layout, Path};

/// A tensor as a checkpoint stores it. Cloning shares the data (a tied embedding is both the
/// input table and the output layer).
#[derive(Clone)]
pub enum Weight {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
}

impl Weight {
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Weight::Dense(t) => t.dims().to_vec(),
            Weight::Quantized(q) => q.shape().dims().to_vec(),
        }
    }

    pub fn device(&self) -> Device {
        match self {
            Weight::Dense(t) => t.device().clone(),
            Weight::Quantized(q) => q.device(),
        }
    }

    /// The values in `dtype`.
    pub fn dense(&self, dtype: DType) -> Result<Tensor> {
        match self {
            Weight::Dense(t) => t.to_dtype(dtype),
            Weight::Quantized(q) => q.dequantize(&q.device())?.to_dtype(dtype),
        }
    }
}

/// Option `weights`: which format(s) linear layers compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// Quantized checkpoints on CPU in f32, per phase, when that fits option `memory_budget`:
    /// dense f32 for prefill and scoring (exact), the stored blocks through our kernels for
    /// decode (as llama.cpp does: activations rounded to 8 bits per block, so generate's
    /// logprobs differ from score's by that rounding; Q8_0 copies for types without a kernel);
    /// else as stored; the stored format elsewhere.
    Auto,
    /// Dense in the compute dtype for scoring, Q8_0 for generating (on CPU through our kernel;
    /// prompts too where [`stored_prompts`] says): generate's logprobs differ from score's by
    /// the Q8_0 error.
    Mixed,
    /// As the checkpoint stores them (quantized stays quantized), through candle's kernels.
    AsStored,
    /// As stored, quantized matrices on CPU in place (no repacked copy): the types
    /// [`crate::kernels`] runs through our kernels, other types through candle's unpacked ones.
    Compact,
    /// Dense in the compute dtype.
    Dense,
    /// Requantized to Q8_0.
    Q8_0,
    /// Requantized to Q4_0.
    Q4_0,
}

impl WeightFormat {
    pub const CHOICES: &'static [&'static str] = &[
        "auto",
        "as_stored",
        "compact",
        "f32",
        "q8_0",
        "q4_0",
        "mixed",
    ];

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "auto" => WeightFormat::Auto,
            "as_stored" => WeightFormat::AsStored,
            "compact" => WeightFormat::Compact,
            "f32" | "dense" => WeightFormat::Dense,
            "q8_0" => WeightFormat::Q8_0,
            "q4_0" => WeightFormat::Q4_0,
            "mixed" => WeightFormat::Mixed,
            _ => return None,
        })
    }

    /// Whether `auto` keeps a dense prefill copy of quantized weights (and decodes from the
    /// stored blocks): on CPU in f32, where dense GEMM is fast and exact.
    pub fn auto_dense(dtype: DType, device: &Device) -> bool {
        dtype == DType::F32 && device.is_cpu()
    }

    /// Whether layers of a checkpoint with quantized matrices (`quantized`), or without, keep a
    /// decode copy beside their prefill copy in this format: then generating computes with
    /// other weights than scoring.
    pub fn decode_copy(self, quantized: bool, dtype: DType, device: &Device) -> bool {
        match self {
            WeightFormat::Auto => quantized && WeightFormat::auto_dense(dtype, device),
            WeightFormat::Mixed => true,
            _ => false,
        }
    }

    /// The option's spelling, for messages.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Auto => "auto",
            WeightFormat::AsStored => "as_stored",
            WeightFormat::Compact => "compact",
            WeightFormat::Dense => "f32",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4_0 => "q4_0",
            WeightFormat::Mixed => "mixed",
        }
    }
}

thread_local! {
    /// Whether this thread is inside [`generating`].
    static GENERATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` in the generation phase: linear layers in their decode format (where they have
/// one), and a pass of single rows attends through
/// [`crate::attention::Attention::forward_rows`]. Only a generation's passes run here: a pass
/// that scores must not, however few rows it has. The pool's other workers poll for `f`'s jobs
/// until it ends ([`keep_pool_warm`]).
pub fn generating<R>(f: impl FnOnce() -> R) -> R {
    keep_pool_warm(|| in_phase(true, f))
}

/// Runs `f`, a share of the rows of a pass already inside [`generating`] that another pool
/// thread may have taken, in the generation phase, without pollers of its own.
pub fn generating_share<R>(f: impl FnOnce() -> R) -> R {
    in_phase(true, f)
}

/// Whether a generation's prompt runs through the decode copies, for a checkpoint with
/// quantized matrices (`quantized`) or without: wherever layers have them and our kernels run
/// SIMD, AVX2 or AVX-512 alike, so that a config's replies take the same arithmetic on every
/// x86 CPU (activations quantized to the same blocks bit for bit, only f32 sums in another
/// order), never 8-bit activations on one CPU and f32 on another. Summation order alone can
/// still part near ties later in a reply. With VNNI that is also the faster path; with AVX2
/// alone a long prompt
/// runs a little slower than f32 GEMM, once per generation. The scalar kernels are no match
/// for GEMM on a prompt's rows, so there (other architectures, `LMHOST_SIMD=scalar`) prompts
/// stay dense. Such a prompt's states differ from a scoring pass's, so the engine caches them
/// apart.
pub fn stored_prompts(
    format: WeightFormat,
    quantized: bool,
    dtype: DType,
    device: &Device,
) -> bool {
    format.decode_copy(quantized, dtype, device) && device.is_cpu() && Path::best() != Path::Scalar
}

/// Runs `f` (on a pool worker, outside a decode pass) with a job on each other worker that
/// runs the pool's queued jobs, yielding the core between them, until `f` ends. A decode pass
/// is dozens of short parallel ops a layer (matrices of a few hundred KB, attention) with
/// microseconds of serial work between them, where rayon's idle workers yield and then sleep,
/// and waking one can take longer than a small matrix (`bench_batch`: an 8-row SmolLM2 pass
/// 27.9 against 30.5 ms without). `f` never waits for the pollers, so a long job one of them
/// picked up from another caller delays only that worker, as without them.
fn keep_pool_warm<R>(f: impl FnOnce() -> R) -> R {
    if rayon::current_thread_index().is_none() || GENERATING.get() {
        return f();
    }
    /// Ends the pollers however `f` ends, a panic included.
    struct Done(Arc<AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let done = Done(Arc::new(AtomicBool::new(false)));
    let owner = rayon::current_thread_index();
    for _ in 1..rayon::current_num_threads() {
        let done = done.0.clone();
        rayon::spawn(move || {
            // This thread, waiting inside `f`, may run a poller no other worker took: `f`
            // cannot end under it, so it must not poll.
            if rayon::current_thread_index() == owner {
                return;
            }
            while !done.load(Ordering::Acquire) {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::yield_now();
                }
            }
        });
    }
    f()
}

/// Runs `f` outside the decode phase, whatever this thread was doing. Every other job on the
/// compute pool starts here: a pool thread waiting inside a decode pass's parallel op runs
/// other queued jobs (rayon's work stealing), and a prompt run that way must not inherit the
/// phase, or its result would depend on timing.
pub fn prefilling<R>(f: impl FnOnce() -> R) -> R {
    in_phase(false, f)
}

fn in_phase<R>(generating: bool, f: impl FnOnce() -> R) -> R {
    /// Puts the outer phase back however `f` ends, a caught panic included: the pool thread
    /// goes on to serve other calls.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GENERATING.set(self.0);
        }
    }
    let _restore = Restore(GENERATING.replace(generating));
    f()
}

/// Whether this thread is inside [`generating`].
pub fn is_generating() -> bool {
    GENERATING.get()
}

/// A linear layer `y = x Wᵀ (+ b)` with an optional second copy of W for generating.
#[derive(Debug, Clone)]
pub struct Linear {
    prefill: Kernel,
    decode: Option<Kernel>,
    bias: Option<Tensor>,
}

/// How a layer multiplies by its weight.
#[derive(Debug, Clone)]
enum Kernel {
    Candle(QMatMul),
    /// A quantized CPU matrix our kernels ([`crate::kernels`]) read.
    Ours(Blocks),
    /// A quantized CPU matrix of a type ours lack, read in place by candle's unpacked kernel
    /// for it.
    Unpacked(Arc<QTensor>, BlockMatmul),
}

impl Kernel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Kernel::Candle(w) => w.forward(x),
            Kernel::Ours(w) => Ok(ours(&[w], x)?.remove(0)),
            Kernel::Unpacked(w, kernel) => {
                let (n, k) = w.shape().dims2()?;
                check_input(x, (n, k))?;
                let lhs = rows(x)?;
                let m = lhs.len() / k.max(1);
                let mut dst = vec![0f32; m * n];
                kernel(&w.data()?, (m, k, n), &lhs, &mut dst)?;
                output(x, dst, n)
            }
        }
    }
}

/// A quantized CPU matrix for our kernels: the stored blocks, read in place, or where the
/// fastest path has a layout of its own for the type ([`kernels::interleave`]) and nothing
/// else holds the stored blocks (a tied table under [`Embedding::new`] does; [`tied`] lets
/// the layer hold them alone), that layout, made once in place of them.
#[derive(Debug, Clone)]
struct Blocks {
    dtype: GgmlDType,
    shape: (usize, usize),
    data: BlockData,
}

#[derive(Debug, Clone)]
enum BlockData {
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

/// `dst = lhs · blocksᵀ` over a matrix's stored bytes, `(m, k, n)`.
type BlockMatmul = fn(&[u8], (usize, usize, usize), &[f32], &mut [f32]) -> Result<()>;

/// Our kernels' layer for `q`, if they run its type and it is on CPU.
fn ours_for(q: &Arc<QTensor>) -> Result<Option<Kernel>> {
    if !(q.device().is_cpu() && kernels::supports(q.dtype())) {
        return Ok(None);
    }
    Blocks::new(q).map(|blocks| Some(Kernel::Ours(blocks)))
}

/// Candle's unpacked kernel for `q`, for the quantized types ours lack (none for float types,
/// which compute dense).
fn unpacked(q: &Arc<QTensor>) -> Option<Kernel> {
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

fn requantize(w: &Weight, to: GgmlDType) -> Result<Kernel> {
    let dense = w.dense(DType::F32)?;
    // Rows that do not fit the block size stay dense.
    if dense.dim(candle_core::D::Minus1)? % to.block_size() != 0 {
        return Ok(Kernel::Candle(QMatMul::Tensor(dense)));
    }
    QMatMul::from_qtensor(QTensor::quantize(&dense, to)?).map(Kernel::Candle)
}

/// `auto`'s decode copy: the stored blocks where our kernels run them, else [`decode_copy`].
fn stored_for_decode(w: &Weight) -> Result<Kernel> {
    match w {
        Weight::Quantized(q) => ours_for(q)?.map_or_else(|| decode_copy(w), Ok),
        w => decode_copy(w),
    }
}

/// `mixed`'s decode copy: Q8_0, on CPU through our kernel.
fn decode_copy(w: &Weight) -> Result<Kernel> {
    Ok(match requantize(w, GgmlDType::Q8_0)? {
        Kernel::Candle(QMatMul::QTensor(q)) => {
            ours_for(&q)?.unwrap_or(Kernel::Candle(QMatMul::QTensor(q)))
        }
        other => other,
    })
}

/// `x Wᵢᵀ` for quantized CPU matrices of our kernels' types that share the input `x`, in one
/// [`kernels::matmul_group`] call (activations quantized to 8 bits per block, as `QMatMul`
/// does).
fn ours(ws: &[&Blocks], x: &Tensor) -> Result<Vec<Tensor>> {
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

/// Runs `f` over a contiguous f32 CPU tensor's values where they lie; `None` for any other.
pub fn f32_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F32(data)) = &*storage else {
        return None;
    };
    let (start, end) = layout.contiguous_offsets()?;
    Some(f(data.get(start..end)?))
}

/// Refuses an `x` whose last axis is not the `k` of an `(n, k)` weight.
fn check_input(x: &Tensor, (n, k): (usize, usize)) -> Result<()> {
    if x.dim(candle_core::D::Minus1)? != k {
        candle_core::bail!(
            "compact matmul: input {:?} for a ({n}, {k}) weight",
            x.dims()
        );
    }
    Ok(())
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
fn dequantize_row(dtype: GgmlDType, data: &[u8], id: usize, out: &mut [f32]) -> Result<()> {
    fn row<T: GgmlType>(data: &[u8], id: usize, out: &mut [f32]) -> Result<()> {
        let k = out.len();
        let bytes = k / T::BLCK_SIZE * std::mem::size_of::<T>();
        let Some(data) = data.get(id * bytes..(id + 1) * bytes) else {
            candle_core::bail!("token id {id} is past the embedding table");
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

/// `w` as stored, through candle's kernels (a dense weight in `dtype`).
fn stored(w: Weight, dtype: DType) -> Result<Kernel> {
    Ok(Kernel::Candle(match w {
        Weight::Dense(t) => QMatMul::Tensor(t.to_dtype(dtype)?),
        Weight::Quantized(q) => QMatMul::from_arc(q)?,
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
                (dense(&w)?, Some(stored_for_decode(&w)?))
            }
            WeightFormat::Mixed => (dense(&w)?, Some(decode_copy(&w)?)),
            WeightFormat::Compact => match w {
                Weight::Quantized(q) => match ours_for(&q)?.or_else(|| unpacked(&q)) {
                    Some(kernel) => (kernel, None),
                    None => (stored(Weight::Quantized(q), dtype)?, None),
                },
                w => (stored(w, dtype)?, None),
            },
            WeightFormat::Auto | WeightFormat::AsStored => (stored(w, dtype)?, None),
            WeightFormat::Dense => (dense(&w)?, None),
            WeightFormat::Q8_0 => (requantize(&w, GgmlDType::Q8_0)?, None),
            WeightFormat::Q4_0 => (requantize(&w, GgmlDType::Q4_0)?, None),
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
                Kernel::Ours(w) => Some(w),
                _ => None,
            })
            .collect();
        let ys = match ours_all {
            Some(ws) => ours(&ws, x)?,
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

    /// Whether [`Linear::decode_into`] runs this layer: its decode kernel is ours, its bias
    /// (if any) f32 on CPU.
    pub fn decodes_in_place(&self) -> bool {
        let bias = self
            .bias
            .as_ref()
            .is_none_or(|b| f32_values(b, |_| ()).is_some());
        matches!(self.decode_kernel(), Kernel::Ours(_)) && bias
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
                Kernel::Ours(blocks) if blocks.shape.1 == k => blocks.matrix(),
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
            Some(decode) if GENERATING.get() => decode,
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

/// A token-embedding table and the output layer tied to it. The layer is built first, holding
/// the only reference to quantized CPU blocks, so that it may keep them in the layout its
/// kernel reads fastest ([`kernels::interleave`]) in place of the stored ones; the table then
/// looks its rows up in the layer (bit for bit the values the stored blocks hold): in its
/// dense prefill copy (`auto` on CPU, `mixed`), or in its blocks (`compact`). Formats whose
/// layer holds other values (requantized, or a dtype's rounding) or that compute through
/// candle keep the table beside the layer, sharing the stored blocks ([`Embedding::new`]).
pub fn tied(w: Weight, format: WeightFormat, dtype: DType) -> Result<(Embedding, Linear)> {
    let layer_first = match &w {
        Weight::Quantized(q) if q.device().is_cpu() && kernels::supports(q.dtype()) => match format
        {
            WeightFormat::Compact => true,
            WeightFormat::Auto | WeightFormat::Mixed => {
                format.decode_copy(true, dtype, &w.device())
            }
            _ => false,
        },
        _ => false,
    };
    if !layer_first {
        let embedding = Embedding::new(&w, dtype)?;
        return Ok((embedding, Linear::new(w, None, format, dtype)?));
    }
    let linear = Linear::new(w, None, format, dtype)?;
    let table = match &linear.prefill {
        Kernel::Candle(QMatMul::Tensor(dense)) => Table::Dense(dense.clone()),
        Kernel::Ours(Blocks {
            data: BlockData::Stored(q),
            ..
        }) => Table::Quantized(q.clone()),
        Kernel::Ours(Blocks {
            dtype,
            shape,
            data: BlockData::Interleaved(data),
        }) => Table::Interleaved {
            dtype: *dtype,
            shape: *shape,
            data: data.clone(),
        },
        _ => candle_core::bail!("a tied output layer without the table's values"),
    };
    Ok((Embedding { table, dtype }, linear))
}

/// A token-embedding table. A quantized table on CPU stays as stored and dequantizes only the
/// rows looked up (the values a dense copy would hold), so a 7B model's table costs its size in
/// the file, not four bytes a value.
pub struct Embedding {
    table: Table,
    dtype: DType,
}

enum Table {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
    /// The interleaved blocks of the output layer tied to the table ([`tied`]), `shape`
    /// `(rows, k)`.
    Interleaved {
        dtype: GgmlDType,
        shape: (usize, usize),
        data: Arc<Vec<u8>>,
    },
}

impl Embedding {
    /// The table of `w`, looked up in `dtype`.
    pub fn new(w: &Weight, dtype: DType) -> Result<Self> {
        let table = match w {
            Weight::Quantized(q) if q.device().is_cpu() => Table::Quantized(q.clone()),
            w => Table::Dense(w.dense(dtype)?),
        };
        Ok(Embedding { table, dtype })
    }

    /// The rows of `ids` (a vector of u32), `(ids, hidden)` in the compute dtype.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match &self.table {
            Table::Dense(t) => t.index_select(ids, 0),
            Table::Quantized(q) => q.embedding(ids)?.to_dtype(self.dtype),
            Table::Interleaved { dtype, shape, data } => {
                let ids: Vec<usize> = ids
                    .to_vec1::<u32>()?
                    .into_iter()
                    .map(|i| i as usize)
                    .collect();
                let rows = kernels::interleaved_rows(*dtype, data, *shape, &ids)?;
                Tensor::from_vec(rows, (ids.len(), shape.1), &Device::Cpu)?.to_dtype(self.dtype)
            }
        }
    }

    /// Row `id` into `out` (f32, the values [`Embedding::forward`] gives) where the table lies
    /// on CPU and the compute dtype is f32, with no allocation; `false` for other tables.
    pub fn row_into(&self, id: u32, out: &mut [f32]) -> Result<bool> {
        let (id, k) = (id as usize, out.len());
        match &self.table {
            Table::Dense(t) if self.dtype == DType::F32 => {
                if t.dims().get(1) != Some(&k) {
                    candle_core::bail!("rows of {k} values from a table shaped {:?}", t.dims());
                }
                let row = f32_values(t, |table| {
                    let row = table.get(id * k..(id + 1) * k);
                    row.map(|row| out.copy_from_slice(row)).is_some()
                });
                match row {
                    Some(false) => candle_core::bail!("token id {id} is past the embedding table"),
                    found => Ok(found.is_some()),
                }
            }
            Table::Interleaved { dtype, shape, data } if self.dtype == DType::F32 => {
                kernels::interleaved_rows_into(*dtype, data, *shape, &[id], out)?;
                Ok(true)
            }
            Table::Quantized(q) if self.dtype == DType::F32 => match q.data()? {
                std::borrow::Cow::Borrowed(data) => {
                    dequantize_row(q.dtype(), data, id, out)?;
                    Ok(true)
                }
                std::borrow::Cow::Owned(_) => Ok(false),
            },
            _ => Ok(false),
        }
    }

    pub fn device(&self) -> Device {
        match &self.table {
            Table::Dense(t) => t.device().clone(),
            Table::Quantized(q) => q.device(),
            Table::Interleaved { .. } => Device::Cpu,
        }
    }
}

/// Where a model reads its tensors, by Hugging Face name (`model.layers.0.self_attn.q_proj.weight`);
/// a GGUF source maps the names to its own.
pub trait WeightSource {
    /// The tensor `name`, which must have `shape`; the error names the tensor and both shapes.
    fn get(&mut self, name: &str, shape: &[usize]) -> std::result::Result<Weight, String>;
    fn contains(&self, name: &str) -> bool;
}

/// Checks a loaded tensor's shape against what the config implies.
pub fn check_shape(name: &str, w: Weight, shape: &[usize]) -> std::result::Result<Weight, String> {
    let dims = w.dims();
    if dims != shape {
        return Err(format!(
            "tensor `{name}` has shape {dims:?}, the config implies {shape:?}"
        ));
    }
    Ok(w)
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

    /// A tied table looks up the rows the stored blocks hold in every format, whichever copy it
    /// reads them from (`auto`'s: the layer's dense prefill copy; `compact`'s: the layer's
    /// blocks, interleaved on AVX-512), and the tied layer computes what the same layer untied
    /// (sharing the stored blocks) does, within what the summation order moves.
    #[test]
    fn a_tied_table_reads_the_stored_rows_and_its_layer_computes_as_untied() -> Result<()> {
        let dense = Tensor::randn(0f32, 1.0, (40, 64), &Device::Cpu)?;
        let quantized = || -> Result<Weight> {
            Ok(Weight::Quantized(Arc::new(QTensor::quantize(
                &dense,
                GgmlDType::Q8_0,
            )?)))
        };
        let ids = Tensor::new(&[3u32, 0, 39, 3], &Device::Cpu)?;
        let x = Tensor::randn(0f32, 1.0, (3, 64), &Device::Cpu)?;
        let diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            a.sub(b)?.abs()?.max_all()?.to_scalar::<f32>()
        };
        let w = quantized()?;
        let rows = Embedding::new(&w, DType::F32)?.forward(&ids)?;
        for format in [
            WeightFormat::Auto,
            WeightFormat::Mixed,
            WeightFormat::Compact,
            WeightFormat::AsStored,
            WeightFormat::Q4_0,
        ] {
            let (table, layer) = tied(quantized()?, format, DType::F32)?;
            assert_eq!(diff(&table.forward(&ids)?, &rows)?, 0.0, "{format:?}");
            let untied = Linear::new(w.clone(), None, format, DType::F32)?;
            for phase in [prefilling::<Result<_>>, generating] {
                let (ours, theirs) = phase(|| Ok((layer.forward(&x)?, untied.forward(&x)?)))?;
                let scale = theirs.abs()?.max_all()?.to_scalar::<f32>()?;
                assert!(diff(&ours, &theirs)? <= 1e-5 * scale, "{format:?}");
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

    /// A decode pass whose own thread, waiting inside it (here for another pool), runs the
    /// pass's poller because no other worker is free to take it, still ends.
    #[test]
    fn a_decode_pass_ends_when_its_own_thread_runs_its_poller() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let other = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (started, busy) = std::sync::mpsc::channel();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            let _ = started.send(());
            let _ = blocked.recv();
        });
        busy.recv().unwrap();
        let (finished, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = finished.send(pool.install(|| generating(|| other.install(|| 7))));
        });
        let got = ended.recv_timeout(std::time::Duration::from_secs(60));
        let _ = release.send(());
        assert_eq!(got, Ok(7));
    }
}
