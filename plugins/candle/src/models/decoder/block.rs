//! A Llama-shaped block and what loads one: the tensors each family names, read by Hugging
//! Face name and checked against the config.

use candle_core::{DType, Result, Tensor};

use super::config::LlamaConfig;
use crate::kernels;
use crate::models::glu::{self, Act};
use crate::models::norm::RmsNorm;
use crate::models::step;
use crate::models::BuildOptions;
use crate::weights::{self, Embedding, Linear, Weight, WeightSource};

pub type LoadResult<T> = std::result::Result<T, String>;

/// Builds block `i` from a source: one function per family.
pub type BlockLoader = fn(&mut Loader<'_>, &LlamaConfig, usize) -> LoadResult<Block>;

/// The q, k and v projections: three matrices, or one whose output rows hold q, k, v in order.
pub enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

impl Qkv {
    /// q, k and v of `x` (rows of `h` values) into the caller's buffers, through the layers'
    /// decode kernels ([`Linear::decode_into`]); a fused matrix's rows are split after.
    pub(super) fn decode_into(
        &self,
        (x, h): (&[f32], usize),
        [q, k, v]: [&mut [f32]; 3],
        ws_fused: &mut Vec<f32>,
        scratch: &mut kernels::Scratch,
    ) -> Result<()> {
        match self {
            Qkv::Separate {
                q: lq,
                k: lk,
                v: lv,
            } => Linear::decode_into(&[lq, lk, lv], (x, h), &mut [q, k, v], scratch),
            Qkv::Fused(qkv) => {
                let rows = x.len() / h.max(1);
                let widths = [q.len() / rows, k.len() / rows, v.len() / rows];
                let fused = step::sized(ws_fused, q.len() + k.len() + v.len());
                Linear::decode_into(&[qkv], (x, h), &mut [&mut *fused], scratch)?;
                step::split_rows(fused, &mut [q, k, v], &widths);
                Ok(())
            }
        }
    }

    pub(super) fn layers(&self) -> Vec<&Linear> {
        match self {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(qkv) => vec![qkv],
        }
    }

    pub(super) fn forward(
        &self,
        x: &Tensor,
        q_width: usize,
        kv_width: usize,
    ) -> Result<[Tensor; 3]> {
        match self {
            Qkv::Separate { q, k, v } => Linear::forward_group([q, k, v], x),
            Qkv::Fused(qkv) => {
                let y = qkv.forward(x)?;
                Ok([
                    y.narrow(2, 0, q_width)?,
                    y.narrow(2, q_width, kv_width)?,
                    y.narrow(2, q_width + kv_width, kv_width)?,
                ])
            }
        }
    }
}

/// The MLP's gate and up projections: two matrices, or one whose output holds gate then up.
pub enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

pub struct Block {
    pub attn_norm: RmsNorm,
    pub qkv: Qkv,
    /// RMSNorm over each head of q and of k, before RoPE (Qwen3).
    pub qk_norm: Option<(RmsNorm, RmsNorm)>,
    pub o: Linear,
    pub mlp_norm: RmsNorm,
    pub gate_up: GateUp,
    pub down: Linear,
}

impl GateUp {
    /// gate and up of `x` into the caller's buffers, as [`Qkv::decode_into`].
    pub(super) fn decode_into(
        &self,
        (x, h): (&[f32], usize),
        [gate, up]: [&mut [f32]; 2],
        ws_fused: &mut Vec<f32>,
        scratch: &mut kernels::Scratch,
    ) -> Result<()> {
        match self {
            GateUp::Separate { gate: lg, up: lu } => {
                Linear::decode_into(&[lg, lu], (x, h), &mut [gate, up], scratch)
            }
            GateUp::Fused(gate_up) => {
                let rows = x.len() / h.max(1);
                let width = gate.len() / rows.max(1);
                let fused = step::sized(ws_fused, gate.len() + up.len());
                Linear::decode_into(&[gate_up], (x, h), &mut [&mut *fused], scratch)?;
                step::split_rows(fused, &mut [gate, up], &[width, width]);
                Ok(())
            }
        }
    }

    pub(super) fn layers(&self) -> Vec<&Linear> {
        match self {
            GateUp::Separate { gate, up } => vec![gate, up],
            GateUp::Fused(gate_up) => vec![gate_up],
        }
    }
}

impl Block {
    /// Every matrix of the block.
    pub(super) fn layers(&self) -> Vec<&Linear> {
        let mut layers = self.qkv.layers();
        layers.extend(self.gate_up.layers());
        layers.extend([&self.o, &self.down]);
        layers
    }

    pub(super) fn mlp(&self, x: &Tensor, ffn: usize) -> Result<Tensor> {
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => {
                let [gate, up] = Linear::forward_group([gate, up], x)?;
                (gate, up)
            }
            GateUp::Fused(gate_up) => {
                let y = gate_up.forward(x)?;
                (y.narrow(2, 0, ffn)?, y.narrow(2, ffn, ffn)?)
            }
        };
        let coarse = self.down.rounds_input_to_bf16();
        self.down
            .forward(&glu::gated(Act::Silu, &gate, &up, coarse)?)
    }
}

/// The token table `w`, and the output layer tied to it unless the model has its own
/// (`untied`).
pub fn embedding(
    w: Weight,
    untied: bool,
    opts: &BuildOptions,
) -> LoadResult<(Embedding, Option<Linear>)> {
    if untied {
        let embed = Embedding::new(&w, opts.dtype).map_err(candle_err(EMBED))?;
        return Ok((embed, None));
    }
    let (embed, lm_head) = weights::tied(w, opts.format, opts.dtype).map_err(candle_err(EMBED))?;
    Ok((embed, Some(lm_head)))
}

/// The token table's name.
pub const EMBED: &str = "model.embed_tokens.weight";

/// Names the tensor in a candle error.
pub fn candle_err(name: &str) -> impl Fn(candle_core::Error) -> String + '_ {
    move |e| format!("tensor `{name}`: {e}")
}

/// Reads tensors by Hugging Face name, checking shapes against the config.
pub struct Loader<'a> {
    pub src: &'a mut dyn WeightSource,
    pub opts: &'a BuildOptions,
}

/// GGUF only: Llama 3.x's RoPE frequency divisors, as llama.cpp's converter stores them.
const ROPE_FREQS: &str = "rope_freqs.weight";
/// GGUF only: Phi-3's long-context ("su"/longrope) factors, which this code does not implement.
const LONG_ROPE: [&str; 2] = ["rope_factors_long.weight", "rope_factors_short.weight"];

impl Loader<'_> {
    pub fn weight(&mut self, name: &str, shape: &[usize]) -> LoadResult<Weight> {
        self.src.get(name, shape)
    }

    /// `{name}.weight`, shaped `(out, inp)`, and `{name}.bias` when `bias`.
    pub fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool) -> LoadResult<Linear> {
        let w = self.weight(&format!("{name}.weight"), &[out, inp])?;
        let b = if bias {
            let bname = format!("{name}.bias");
            let b = self.weight(&bname, &[out])?;
            Some(b.dense(self.opts.dtype).map_err(candle_err(&bname))?)
        } else {
            None
        };
        Linear::new(w, b, self.opts.format, self.opts.dtype).map_err(candle_err(name))
    }

    /// `{name}.weight`, shaped `(size)`.
    pub fn norm(&mut self, name: &str, size: usize, eps: f64) -> LoadResult<RmsNorm> {
        let name = format!("{name}.weight");
        let w = self.weight(&name, &[size])?;
        let weight = w.dense(self.opts.dtype).map_err(candle_err(&name))?;
        Ok(RmsNorm::new(weight, eps))
    }

    /// The RoPE frequency divisors: what the file stores (a GGUF's `rope_freqs`), else what
    /// config.json's `rope_scaling` implies.
    pub(super) fn rope_factors(&mut self, cfg: &LlamaConfig) -> LoadResult<Option<Vec<f32>>> {
        if let Some(name) = LONG_ROPE.into_iter().find(|n| self.src.contains(n)) {
            return Err(format!(
                "tensor `{name}`: long-rope scaling (Phi-3 long-context models) is not \
                 implemented; only plain RoPE and Llama 3's `rope_freqs` factors are"
            ));
        }
        if !self.src.contains(ROPE_FREQS) {
            return cfg.rope_factors();
        }
        let w = self.weight(ROPE_FREQS, &[cfg.head_dim() / 2])?;
        let factors = w
            .dense(DType::F32)
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(candle_err(ROPE_FREQS))?;
        if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
            return Err(format!(
                "tensor `{ROPE_FREQS}` holds {bad}; frequency divisors must be positive"
            ));
        }
        Ok(Some(factors))
    }
}
