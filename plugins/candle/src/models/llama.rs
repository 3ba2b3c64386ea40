//! The Llama family: Llama 2/3, Mistral, Qwen2, SmolLM.
//!
//! Paper: <https://arxiv.org/abs/2302.13971>; reference code: candle-transformers
//! `models/llama.rs` and `models/quantized_llama.rs` (this file follows the latter's op order, so
//! logits agree with it to float precision on the same weights). Differences between members are
//! config flags: grouped-query attention, RoPE theta, qkv bias (Qwen2), tied or separate output,
//! a sliding window (Mistral). GGUF files permute q/k rows so RoPE rotates interleaved pairs;
//! Hugging Face checkpoints rotate halves: `rope_interleaved` says which.

use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};
use serde::Deserialize;

use super::Seq;
use crate::attention::{Attention, AttnParams};
use crate::kv::KvState;
use crate::weights::{Linear, Weight, WeightFormat, WeightSource};

/// `config.json` fields the family uses (GGUF metadata is mapped onto the same struct).
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Not in config.json: true for GGUF files (see the module doc).
    #[serde(skip)]
    pub rope_interleaved: bool,
}

fn default_model_type() -> String {
    "llama".into()
}
fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_eps() -> f64 {
    1e-5
}
fn default_max_positions() -> usize {
    4096
}

/// The architectures this file implements (`model_type` values).
pub const ARCHITECTURES: &[&str] = &["llama", "mistral", "qwen2", "smollm"];

/// Tensor-parallel plan (Transformers' `base_model_tp_plan`): q/k/v and gate/up split their
/// outputs, o and down their inputs, so each block needs one all-reduce after attention and one
/// after the MLP.
pub const TP_PLAN: &[(&str, &str)] = &[
    ("layers.*.self_attn.q_proj", "colwise"),
    ("layers.*.self_attn.k_proj", "colwise"),
    ("layers.*.self_attn.v_proj", "colwise"),
    ("layers.*.self_attn.o_proj", "rowwise"),
    ("layers.*.mlp.gate_proj", "colwise"),
    ("layers.*.mlp.up_proj", "colwise"),
    ("layers.*.mlp.down_proj", "rowwise"),
];

/// Pipeline plan (`base_model_pp_plan`): each top-level block with its inputs and outputs.
pub const PP_PLAN: &[super::PipelineStage] = &[
    ("embed_tokens", &["input_ids"], &["inputs_embeds"]),
    (
        "layers",
        &["hidden_states", "attention_mask"],
        &["hidden_states"],
    ),
    ("norm", &["hidden_states"], &["hidden_states"]),
];

impl LlamaConfig {
    fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
    fn qkv_bias(&self) -> bool {
        self.attention_bias || self.model_type == "qwen2"
    }
    fn window(&self) -> Option<usize> {
        match self.model_type.as_str() {
            "qwen2" if self.use_sliding_window != Some(true) => None,
            _ => self.sliding_window,
        }
    }

    /// Checks the numbers a forward pass divides by.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let (h, kvh) = (self.num_attention_heads, self.kv_heads());
        if h == 0 || kvh == 0 || h % kvh != 0 {
            return Err(format!(
                "num_attention_heads {h} must be a positive multiple of num_key_value_heads {kvh}"
            ));
        }
        if !self.head_dim().is_multiple_of(2) || self.num_hidden_layers == 0 || self.vocab_size == 0
        {
            return Err(format!(
                "head_dim {} must be even, layers {} and vocab {} positive",
                self.head_dim(),
                self.num_hidden_layers,
                self.vocab_size
            ));
        }
        Ok(())
    }
}

/// How to build the model besides its config.
pub struct BuildOptions {
    pub dtype: DType,
    pub device: Device,
    pub format: WeightFormat,
    pub attention: Arc<dyn Attention>,
    /// Longest context to prepare RoPE tables for.
    pub max_context: usize,
}

struct Rope {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl Rope {
    /// The same table as candle-transformers' quantized_llama (f32 powers, then the dtype).
    fn new(cfg: &LlamaConfig, max_len: usize, dtype: DType, device: &Device) -> Result<Self> {
        let d = cfg.head_dim();
        let base = cfg.rope_theta as f32;
        let theta: Vec<f32> = (0..d)
            .step_by(2)
            .map(|i| 1f32 / base.powf(i as f32 / d as f32))
            .collect();
        let n = theta.len();
        let theta = Tensor::new(theta.as_slice(), device)?;
        let angles = Tensor::arange(0, max_len as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((max_len, 1))?
            .matmul(&theta.reshape((1, n))?)?;
        Ok(Rope {
            cos: angles.cos()?.to_dtype(dtype)?,
            sin: angles.sin()?.to_dtype(dtype)?,
            interleaved: cfg.rope_interleaved,
        })
    }

    /// The table rows of `positions` (one per row of a packed pass).
    fn at(&self, positions: &[u32]) -> Result<RopeRows> {
        let index = Tensor::new(positions, self.cos.device())?;
        Ok(RopeRows {
            cos: self.cos.index_select(&index, 0)?,
            sin: self.sin.index_select(&index, 0)?,
            interleaved: self.interleaved,
        })
    }
}

/// Rotations for the rows of one pass, gathered once and applied in every layer.
struct RopeRows {
    cos: Tensor,
    sin: Tensor,
    interleaved: bool,
}

impl RopeRows {
    /// Rotates `x`, shaped `(1, heads, rows, head_dim)`.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        if self.interleaved {
            candle_nn::rotary_emb::rope_i(&x, &self.cos, &self.sin)
        } else {
            candle_nn::rotary_emb::rope(&x, &self.cos, &self.sin)
        }
    }
}

struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }
}

struct Block {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    attn_norm: RmsNorm,
    mlp_norm: RmsNorm,
}

/// A loaded Llama-family model.
pub struct Llama {
    cfg: LlamaConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    attention: Arc<dyn Attention>,
    max_context: usize,
}

type LoadResult<T> = std::result::Result<T, String>;

fn candle_err(name: &str) -> impl Fn(candle_core::Error) -> String + '_ {
    move |e| format!("tensor `{name}`: {e}")
}

struct Loader<'a> {
    src: &'a mut dyn WeightSource,
    opts: &'a BuildOptions,
}

impl Loader<'_> {
    fn weight(&mut self, name: &str, shape: &[usize]) -> LoadResult<Weight> {
        self.src.get(name, shape)
    }

    fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool) -> LoadResult<Linear> {
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

    fn norm(&mut self, name: &str, size: usize, eps: f64) -> LoadResult<RmsNorm> {
        let name = format!("{name}.weight");
        let w = self.weight(&name, &[size])?;
        let weight = w.dense(self.opts.dtype).map_err(candle_err(&name))?;
        Ok(RmsNorm {
            weight,
            eps: eps as f32,
        })
    }

    fn block(&mut self, cfg: &LlamaConfig, i: usize) -> LoadResult<Block> {
        let (h, d, kvh) = (cfg.hidden_size, cfg.head_dim(), cfg.kv_heads());
        let (nh, ffn, bias) = (
            cfg.num_attention_heads,
            cfg.intermediate_size,
            cfg.qkv_bias(),
        );
        let p = format!("model.layers.{i}");
        Ok(Block {
            q: self.linear(&format!("{p}.self_attn.q_proj"), nh * d, h, bias)?,
            k: self.linear(&format!("{p}.self_attn.k_proj"), kvh * d, h, bias)?,
            v: self.linear(&format!("{p}.self_attn.v_proj"), kvh * d, h, bias)?,
            o: self.linear(&format!("{p}.self_attn.o_proj"), h, nh * d, false)?,
            gate: self.linear(&format!("{p}.mlp.gate_proj"), ffn, h, false)?,
            up: self.linear(&format!("{p}.mlp.up_proj"), ffn, h, false)?,
            down: self.linear(&format!("{p}.mlp.down_proj"), h, ffn, false)?,
            attn_norm: self.norm(&format!("{p}.input_layernorm"), h, cfg.rms_norm_eps)?,
            mlp_norm: self.norm(
                &format!("{p}.post_attention_layernorm"),
                h,
                cfg.rms_norm_eps,
            )?,
        })
    }
}

impl Llama {
    /// Loads every tensor from `src`; a missing or misshapen tensor is an error naming it.
    pub fn load(
        cfg: LlamaConfig,
        src: &mut dyn WeightSource,
        opts: BuildOptions,
    ) -> LoadResult<Self> {
        cfg.validate()?;
        let mut loader = Loader { src, opts: &opts };
        let (vocab, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed_w = loader.weight("model.embed_tokens.weight", &[vocab, h])?;
        let embed = embed_w
            .dense(opts.dtype)
            .map_err(candle_err("model.embed_tokens.weight"))?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| loader.block(&cfg, i))
            .collect::<LoadResult<Vec<_>>>()?;
        let norm = loader.norm("model.norm", h, cfg.rms_norm_eps)?;
        let lm_head = if !cfg.tie_word_embeddings && loader.src.contains("lm_head.weight") {
            loader.linear("lm_head", vocab, h, false)?
        } else {
            Linear::new(embed_w, None, opts.format, opts.dtype).map_err(candle_err("lm_head"))?
        };
        let max_context = opts.max_context.min(cfg.max_position_embeddings).max(1);
        let rope =
            Rope::new(&cfg, max_context, opts.dtype, &opts.device).map_err(|e| e.to_string())?;
        Ok(Llama {
            embed,
            blocks,
            norm,
            lm_head,
            rope,
            attention: opts.attention,
            max_context,
            cfg,
        })
    }

    /// Attention of every sequence of a packed pass: projections over all rows at once, then
    /// each sequence's queries against its own keys.
    fn attention(
        &self,
        b: &Block,
        x: &Tensor,
        layer: usize,
        rope: &RopeRows,
        seqs: &mut [Seq<'_>],
        starts: &[usize],
    ) -> Result<Tensor> {
        let (_, rows, _) = x.dims3()?;
        let (nh, kvh, d) = (
            self.cfg.num_attention_heads,
            self.cfg.kv_heads(),
            self.cfg.head_dim(),
        );
        let heads = |t: Tensor, n: usize| t.reshape((1, rows, n, d))?.transpose(1, 2);
        let q = rope.apply(&heads(b.q.forward(x)?, nh)?)?;
        let k = rope.apply(&heads(b.k.forward(x)?, kvh)?)?;
        let v = heads(b.v.forward(x)?, kvh)?.contiguous()?;
        let mut outs = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for (j, &offset) in starts.iter().enumerate() {
            let (earlier, rest) = seqs.split_at_mut(j);
            let seq = &mut rest[0];
            let n = seq.ids.len();
            if let Some((i, shared)) = seq.share {
                seq.kv.adopt(layer, earlier[i].kv, shared)?;
            }
            let (k, v) = seq
                .kv
                .append(layer, &k.narrow(2, row, n)?, &v.narrow(2, row, n)?)?;
            let params = AttnParams {
                scale: 1.0 / (d as f64).sqrt(),
                n_rep: nh / kvh,
                offset,
                sliding_window: self.cfg.window(),
            };
            let q = q.narrow(2, row, n)?.contiguous()?;
            outs.push(self.attention.forward(&q, &k, &v, &params)?);
            row += n;
        }
        let y = Tensor::cat(&outs, 2)?;
        b.o.forward(&y.transpose(1, 2)?.reshape((1, rows, nh * d))?)
    }

    fn mlp(b: &Block, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&b.gate.forward(x)?)?;
        b.down.forward(&(gate * b.up.forward(x)?)?)
    }

    /// Runs the blocks over every sequence's ids, returning the final normalized hidden states
    /// of all rows, `(rows, h)`.
    fn trunk(&self, seqs: &mut [Seq<'_>]) -> Result<Tensor> {
        // Read before layer 0 grows the states.
        let starts = check_shares(seqs)?;
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
        let positions: Vec<u32> = seqs
            .iter()
            .zip(&starts)
            .flat_map(|(s, &start)| (start..start + s.ids.len()).map(|p| p as u32))
            .collect();
        if let Some(&last) = positions.iter().max() {
            if last as usize >= self.max_context {
                candle_core::bail!(
                    "position {last} is past the model's context of {} tokens",
                    self.max_context
                );
            }
        }
        let rope = self.rope.at(&positions)?;
        let device = self.embed.device();
        let mut x = self
            .embed
            .index_select(&Tensor::new(ids.as_slice(), device)?, 0)?
            .unsqueeze(0)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let attn = self.attention(b, &b.attn_norm.forward(&x)?, i, &rope, seqs, &starts)?;
            let x1 = (attn + &x)?;
            x = (Self::mlp(b, &b.mlp_norm.forward(&x1)?)? + x1)?;
        }
        self.norm.forward(&x)?.squeeze(0)
    }
}

/// Each sequence's start position, after checking that every share points at an earlier
/// sequence, covers only positions that sequence will hold, and lands in an empty state.
fn check_shares(seqs: &[Seq<'_>]) -> Result<Vec<usize>> {
    let starts: Vec<usize> = seqs.iter().map(Seq::start).collect();
    for (j, seq) in seqs.iter().enumerate() {
        if seq.ids.is_empty() {
            candle_core::bail!("sequence {j} of a packed pass has no ids");
        }
        if let Some((i, n)) = seq.share {
            if i >= j || n > starts[i] + seqs[i].ids.len() || !seq.kv.is_empty() {
                candle_core::bail!("sequence {j} cannot take {n} positions from sequence {i}");
            }
        }
    }
    Ok(starts)
}

impl super::CausalLm for Llama {
    fn forward_packed(
        &self,
        seqs: &mut [Seq<'_>],
        hidden: bool,
    ) -> Result<(Vec<Option<Tensor>>, Option<Tensor>)> {
        let states = self.trunk(seqs)?;
        // The rows that want logits go through the output layer together.
        let mut wanted = Vec::new();
        let mut row = 0;
        for seq in seqs.iter() {
            let n = seq.ids.len();
            let from = seq.logits_from.min(n);
            if from < n {
                wanted.push(states.narrow(0, row + from, n - from)?);
            }
            row += n;
        }
        let logits = match wanted.len() {
            0 => None,
            _ => Some(
                self.lm_head
                    .forward(&Tensor::cat(&wanted, 0)?)?
                    .to_dtype(DType::F32)?,
            ),
        };
        let mut at = 0;
        let per_seq = seqs
            .iter()
            .map(|seq| {
                let count = seq.ids.len() - seq.logits_from.min(seq.ids.len());
                match &logits {
                    Some(all) if count > 0 => {
                        at += count;
                        all.narrow(0, at - count, count).map(Some)
                    }
                    _ => Ok(None),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((per_seq, hidden.then_some(states)))
    }

    fn new_state(&self) -> KvState {
        KvState::new(self.blocks.len())
    }

    fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(ids, self.embed.device())?;
        self.embed.index_select(&ids, 0)?.to_dtype(DType::F32)
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn architecture(&self) -> &str {
        &self.cfg.model_type
    }
}
