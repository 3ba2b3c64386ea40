//! Weights as loaded, and the per-phase weight formats linear layers run in.
//!
//! candle's CPU kernel for Q4_1 (the SmolLM2 GGUF's format) is slow, while f32 GEMM is fast for
//! many rows (prefill) and Q8_0 is fast for one row (decode). So a linear layer may hold two
//! copies converted at load time, one per phase, chosen by option `weights`.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Result, Tensor};

/// A tensor as a checkpoint stores it.
pub enum Weight {
    Dense(Tensor),
    Quantized(QTensor),
}

impl Weight {
    pub fn dims(&self) -> Vec<usize> {
        match self {
            Weight::Dense(t) => t.dims().to_vec(),
            Weight::Quantized(q) => q.shape().dims().to_vec(),
        }
    }

    pub fn is_cpu(&self) -> bool {
        match self {
            Weight::Dense(t) => t.device().is_cpu(),
            Weight::Quantized(q) => q.device().is_cpu(),
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
    /// Dense in the compute dtype for prefill, Q8_0 for decode (quantized checkpoints on CPU);
    /// the stored format elsewhere.
    Auto,
    /// As the checkpoint stores them (quantized stays quantized).
    AsStored,
    /// Dense in the compute dtype.
    Dense,
    /// Requantized to Q8_0.
    Q8_0,
    /// Requantized to Q4_0.
    Q4_0,
}

impl WeightFormat {
    pub const CHOICES: &'static [&'static str] = &["auto", "as_stored", "f32", "q8_0", "q4_0"];

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "auto" => WeightFormat::Auto,
            "as_stored" => WeightFormat::AsStored,
            "f32" | "dense" => WeightFormat::Dense,
            "q8_0" => WeightFormat::Q8_0,
            "q4_0" => WeightFormat::Q4_0,
            _ => return None,
        })
    }
}

/// Rows at or above which a call counts as prefill (uses the prefill copy).
const PREFILL_ROWS: usize = 4;

/// A linear layer `y = x Wᵀ (+ b)` with an optional second copy of W for decoding.
#[derive(Debug, Clone)]
pub struct Linear {
    prefill: QMatMul,
    decode: Option<QMatMul>,
    bias: Option<Tensor>,
}

fn requantize(w: &Weight, to: GgmlDType) -> Result<QMatMul> {
    let dense = w.dense(DType::F32)?;
    // Rows that do not fit the block size stay dense.
    if dense.dim(candle_core::D::Minus1)? % to.block_size() != 0 {
        return Ok(QMatMul::Tensor(dense));
    }
    QMatMul::from_qtensor(QTensor::quantize(&dense, to)?)
}

impl Linear {
    /// Builds the layer in `format`, computing in `dtype` where dense.
    pub fn new(
        w: Weight,
        bias: Option<Tensor>,
        format: WeightFormat,
        dtype: DType,
    ) -> Result<Self> {
        let dense = |w: &Weight| w.dense(dtype).map(QMatMul::Tensor);
        let quantized = matches!(w, Weight::Quantized(_)) && dtype == DType::F32;
        let (prefill, decode) = match format {
            WeightFormat::Auto if quantized && w.is_cpu() => {
                (dense(&w)?, Some(requantize(&w, GgmlDType::Q8_0)?))
            }
            WeightFormat::Auto | WeightFormat::AsStored => match w {
                Weight::Dense(t) => (QMatMul::Tensor(t.to_dtype(dtype)?), None),
                Weight::Quantized(q) => (QMatMul::from_qtensor(q)?, None),
            },
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
        let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?;
        let w = match &self.decode {
            Some(decode) if rows < PREFILL_ROWS => decode,
            _ => &self.prefill,
        };
        let y = w.forward(x)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
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
