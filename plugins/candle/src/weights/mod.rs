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

mod embedding;
mod format;
mod linear;
mod phase;

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

pub use embedding::{tied, Embedding};
pub use format::{stored_prompts, WeightFormat};
pub use linear::Linear;
pub use phase::{generating, generating_share, is_generating, prefilling};

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
            Weight::Quantized(q) if q.device().is_cpu() => dequantized(q)?.to_dtype(dtype),
            Weight::Quantized(q) => q.dequantize(&q.device())?.to_dtype(dtype),
        }
    }
}

/// A CPU QTensor's values, a row at a time on the rayon pool: the same values as candle's
/// `dequantize`, which runs on one thread and was most of a quantized file's load.
fn dequantized(q: &QTensor) -> Result<Tensor> {
    let dims = q.shape().dims().to_vec();
    let k = dims.last().copied().unwrap_or(1).max(1);
    let data = q.data()?;
    let mut values = vec![0f32; q.shape().elem_count()];
    values
        .par_chunks_mut(k)
        .enumerate()
        .with_min_len(16)
        .try_for_each(|(j, row)| linear::dequantize_row(q.dtype(), &data, j, row))?;
    Tensor::from_vec(values, dims, &Device::Cpu)
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
