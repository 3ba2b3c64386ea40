//! Option `weights`: the formats linear layers compute in, and which phase runs which copy.

use candle_core::{DType, Device};

use crate::kernels::Path;

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
    /// As the checkpoint stores them (quantized stays quantized), through candle's kernels where
    /// candle has a fast CPU path for the type, else ours (Q4_1, Q5_0), as [`Compact`] runs them.
    ///
    /// [`Compact`]: WeightFormat::Compact
    AsStored,
    /// As stored, quantized matrices on CPU in place (no repacked copy): the types
    /// [`crate::kernels`] runs through our kernels, other types through candle's unpacked ones.
    Compact,
    /// Dense in the compute dtype.
    Dense,
    /// Scoring and prompts in bf16 dot products with f32 sums ([`crate::kernels::bf16`]; CPU
    /// in f32 with AVX-512 BF16), generating from the stored blocks as [`Auto`] does.
    ///
    /// [`Auto`]: WeightFormat::Auto
    Bf16,
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
        "bf16",
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
            "bf16" => WeightFormat::Bf16,
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
            WeightFormat::Auto | WeightFormat::Bf16 => {
                quantized && WeightFormat::auto_dense(dtype, device)
            }
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
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4_0 => "q4_0",
            WeightFormat::Mixed => "mixed",
        }
    }
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
