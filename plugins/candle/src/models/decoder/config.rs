//! The config every Llama-shaped family reads (Qwen3 and Phi-3 spell their config.json the
//! same way; GGUF metadata is mapped onto it).

use serde::Deserialize;

use crate::models::rope::RopeScaling;
use crate::models::step::Dims;

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
pub const PP_PLAN: &[crate::models::PipelineStage] = &[
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
    pub fn rope_factors(&self) -> Result<Option<Vec<f32>>, String> {
        match &self.rope_scaling {
            Some(s) => s.factors(self.head_dim(), self.rope_base()),
            None => Ok(None),
        }
    }

    /// The widths a decode pass in place sizes its buffers by.
    pub fn dims(&self) -> Dims {
        Dims {
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
