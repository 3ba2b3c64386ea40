//! The Llama family: Llama 2/3.x, Mistral, Qwen2, SmolLM; and the config every Llama-shaped
//! family reads (Qwen3 and Phi-3 spell their config.json the same way).
//!
//! Paper: <https://arxiv.org/abs/2302.13971>; reference code: candle-transformers
//! `models/llama.rs` and `models/quantized_llama.rs`, llama.cpp `src/models/{llama,qwen2}.cpp`.
//! Differences between members are config flags: grouped-query attention, RoPE theta and Llama
//! 3.x's frequency scaling, qkv bias (Qwen2), tied or separate output, a sliding window
//! (Mistral). GGUF Llama files permute q/k rows so RoPE rotates interleaved pairs; Hugging Face
//! checkpoints (and GGUF Qwen and Phi files) rotate halves: `rope_interleaved` says which. The
//! network itself is `decoder.rs`; this file names a block's tensors.

use std::sync::Arc;

use candle_core::{DType, Device};
use serde::Deserialize;

use super::decoder::{Block, GateUp, LoadResult, Loader, Qkv};
use super::rope::RopeScaling;
use crate::attention::Attention;
use crate::weights::WeightFormat;

/// `config.json` fields the Llama-shaped families use (GGUF metadata is mapped onto the same
/// struct).
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
    /// Transformers 5 calls it `rope_parameters`.
    #[serde(default, alias = "rope_parameters")]
    pub rope_scaling: Option<RopeScaling>,
    /// Phi-3 style partial rotation: only 1.0 (every dimension rotated) is implemented.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
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

/// The `model_type`s (GGUF `general.architecture`s) the Llama-shaped decoder runs: this file's,
/// `qwen3.rs`'s and `phi3.rs`'s.
pub const ARCHITECTURES: &[&str] = &["llama", "mistral", "qwen2", "smollm", "qwen3", "phi3"];

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
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias || self.model_type == "qwen2"
    }
    /// The sliding window: Qwen configs carry one that applies only with `use_sliding_window`;
    /// 0 means none (Phi-3 GGUF files write 0 for "no window").
    pub fn window(&self) -> Option<usize> {
        match self.model_type.as_str() {
            "qwen2" | "qwen3" if self.use_sliding_window != Some(true) => None,
            _ => self.sliding_window.filter(|&w| w > 0),
        }
    }
    /// The RoPE base (`rope_parameters` carries its own in Transformers 5).
    pub fn rope_base(&self) -> f64 {
        self.rope_scaling
            .as_ref()
            .and_then(|s| s.rope_theta)
            .unwrap_or(self.rope_theta)
    }
    /// Per-pair divisors of the RoPE frequencies `rope_scaling` implies, if any.
    pub fn rope_factors(&self) -> LoadResult<Option<Vec<f32>>> {
        match &self.rope_scaling {
            Some(s) => s.factors(self.head_dim(), self.rope_base()),
            None => Ok(None),
        }
    }

    /// The widths a decode pass in place sizes its buffers by.
    pub fn dims(&self) -> super::step::Dims {
        super::step::Dims {
            hidden: self.hidden_size,
            heads: self.num_attention_heads,
            kv_heads: self.kv_heads(),
            head_dim: self.head_dim(),
            ffn: self.intermediate_size,
            vocab: self.vocab_size,
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
        if let Some(f) = self.partial_rotary_factor.filter(|&f| f != 1.0) {
            return Err(format!(
                "partial_rotary_factor {f}: only RoPE over the whole head (1.0) is implemented"
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
    /// The most bytes the weights may take (None: no limit); see `crate::memory::fit`.
    pub memory_budget: Option<u64>,
    /// How states store keys and values: f32, or f16 (`kv_cache_dtype`).
    pub kv_dtype: DType,
}

/// Block `i` of a Llama-family model: separate q/k/v (biased for Qwen2), gate, up and down.
pub fn block(l: &mut Loader<'_>, cfg: &LlamaConfig, i: usize) -> LoadResult<Block> {
    let (h, d, kvh) = (cfg.hidden_size, cfg.head_dim(), cfg.kv_heads());
    let (nh, ffn, eps) = (
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.rms_norm_eps,
    );
    let bias = cfg.qkv_bias();
    let p = format!("model.layers.{i}");
    Ok(Block {
        attn_norm: l.norm(&format!("{p}.input_layernorm"), h, eps)?,
        qkv: Qkv::Separate {
            q: l.linear(&format!("{p}.self_attn.q_proj"), nh * d, h, bias)?,
            k: l.linear(&format!("{p}.self_attn.k_proj"), kvh * d, h, bias)?,
            v: l.linear(&format!("{p}.self_attn.v_proj"), kvh * d, h, bias)?,
        },
        qk_norm: None,
        o: l.linear(&format!("{p}.self_attn.o_proj"), h, nh * d, false)?,
        mlp_norm: l.norm(&format!("{p}.post_attention_layernorm"), h, eps)?,
        gate_up: GateUp::Separate {
            gate: l.linear(&format!("{p}.mlp.gate_proj"), ffn, h, false)?,
            up: l.linear(&format!("{p}.mlp.up_proj"), ffn, h, false)?,
        },
        down: l.linear(&format!("{p}.mlp.down_proj"), h, ffn, false)?,
    })
}
