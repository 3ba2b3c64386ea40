//! Gemma 3's settings: from GGUF metadata (`source/gguf.rs`) or a Hugging Face `config.json`
//! ([`TextConfig`], with Transformers' defaults), resolved into one [`Gemma3Config`] with the
//! local/global pattern spelled out per layer; what the model does not implement is refused
//! naming the key.

use serde::Deserialize;

use super::super::rope::RopeScaling;
use super::LoadResult;

/// The `general.architecture` this file implements.
pub const ARCHITECTURE: &str = "gemma3";

/// config.json `model_type`s of Gemma 3: text-only checkpoints (270M, 1B), and multimodal ones
/// (4B and up) with the language model's settings under `text_config`.
pub const MODEL_TYPES: &[&str] = &["gemma3_text", ARCHITECTURE];

/// RoPE base of the local layers when the file does not say.
pub const LOCAL_ROPE_BASE: f64 = 10_000.0;

/// Layers per local/global cycle when the file does not say (Gemma 3: five local, one global).
pub const PATTERN: usize = 6;

/// Named after Transformers' `Gemma3TextConfig`, with the layer pattern resolved per layer.
#[derive(Debug, Clone)]
pub struct Gemma3Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// RoPE base of the global layers.
    pub rope_theta: f64,
    pub rope_local_base_freq: f64,
    /// Linear RoPE scaling of the global layers (1: none).
    pub rope_scaling_factor: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    /// None: every layer is global.
    pub sliding_window: Option<usize>,
    /// Per layer: local (sliding window) or global.
    pub local_layers: Vec<bool>,
    /// Queries are scaled by 1/sqrt of this.
    pub query_pre_attn_scalar: f64,
    pub final_logit_softcapping: Option<f64>,
}

/// Which layers are local for a layer-pattern length, as llama.cpp's `set_swa_pattern` reads
/// `attention.sliding_window_pattern`: all but every `pattern`-th layer (0: all of them).
pub fn local_layers(layers: usize, pattern: usize) -> Vec<bool> {
    (0..layers)
        .map(|i| pattern == 0 || i % pattern < pattern - 1)
        .collect()
}

/// `config.json` of a Gemma 3 language model (Transformers' `Gemma3TextConfig`), defaults
/// included: a multimodal checkpoint's `text_config` spells out only what differs from them.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub hidden_activation: String,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    /// RoPE base of the global layers.
    pub rope_theta: f64,
    pub rope_local_base_freq: f64,
    /// Scaling of the global layers (Transformers 4).
    pub rope_scaling: Option<RopeScaling>,
    /// Transformers 5: per layer type, or one set that applies to the global layers.
    pub rope_parameters: Option<RopeParameters>,
    pub attention_bias: bool,
    pub query_pre_attn_scalar: f64,
    pub sliding_window: Option<usize>,
    /// Every this many layers the last is global; `layer_types`, where given, overrides it.
    pub sliding_window_pattern: usize,
    /// `"sliding_attention"` or `"full_attention"` per layer (newer Transformers).
    pub layer_types: Option<Vec<String>>,
    pub final_logit_softcapping: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    /// EmbeddingGemma's encoder mode.
    pub use_bidirectional_attention: bool,
    pub tie_word_embeddings: bool,
}

/// `rope_parameters` as Transformers 5 writes it for Gemma 3.
#[derive(Debug, Clone, Deserialize)]
pub struct RopeParameters {
    pub full_attention: Option<RopeScaling>,
    pub sliding_attention: Option<RopeScaling>,
    /// A set not keyed by layer type: the global layers'.
    #[serde(flatten)]
    pub shared: RopeScaling,
}

impl Default for TextConfig {
    /// `Gemma3TextConfig`'s defaults.
    fn default() -> Self {
        TextConfig {
            vocab_size: 262_208,
            hidden_size: 2304,
            intermediate_size: 9216,
            num_hidden_layers: 26,
            num_attention_heads: 8,
            num_key_value_heads: 4,
            head_dim: 256,
            hidden_activation: "gelu_pytorch_tanh".into(),
            max_position_embeddings: 131_072,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_local_base_freq: LOCAL_ROPE_BASE,
            rope_scaling: None,
            rope_parameters: None,
            attention_bias: false,
            query_pre_attn_scalar: 256.0,
            sliding_window: Some(4096),
            sliding_window_pattern: PATTERN,
            layer_types: None,
            final_logit_softcapping: None,
            attn_logit_softcapping: None,
            use_bidirectional_attention: false,
            tie_word_embeddings: true,
        }
    }
}

impl TextConfig {
    /// The config this file runs; what it does not implement is refused naming the key.
    pub fn resolve(&self) -> LoadResult<Gemma3Config> {
        let unsupported = |key: &str, value: &dyn std::fmt::Debug, why: &str| {
            Err(format!("`{key}` is {value:?}: {why}"))
        };
        if self.hidden_activation != "gelu_pytorch_tanh" {
            let why = "only \"gelu_pytorch_tanh\" is implemented";
            return unsupported("hidden_activation", &self.hidden_activation, why);
        }
        if let Some(cap) = self.attn_logit_softcapping {
            let why = "attention soft-capping is not implemented (Gemma 3 leaves it null)";
            return unsupported("attn_logit_softcapping", &cap, why);
        }
        if self.attention_bias {
            let why = "q/k/v/o biases are not implemented";
            return unsupported("attention_bias", &true, why);
        }
        if self.use_bidirectional_attention {
            let why = "only causal attention is implemented (not EmbeddingGemma's encoder)";
            return unsupported("use_bidirectional_attention", &true, why);
        }
        let local_layers = self.local_layers()?;
        let window = self.sliding_window.filter(|&w| w > 0);
        if window.is_none() && local_layers.contains(&true) {
            let why = "sliding-attention layers need a positive window";
            return unsupported("sliding_window", &self.sliding_window, why);
        }
        let params = self.rope_parameters.as_ref();
        let keyed = params.filter(|p| p.full_attention.is_some() || p.sliding_attention.is_some());
        let (global, key) = match (keyed, params) {
            (Some(p), _) => (p.full_attention.as_ref(), "rope_parameters.full_attention"),
            (None, Some(p)) => (Some(&p.shared), "rope_parameters"),
            (None, None) => (self.rope_scaling.as_ref(), "rope_scaling"),
        };
        let local = keyed.and_then(|p| p.sliding_attention.as_ref());
        if let Some(kind) = local.and_then(|s| s.rope_type.as_deref()) {
            if kind != "default" {
                let why = "only unscaled RoPE is implemented for the sliding layers";
                return unsupported("rope_parameters.sliding_attention.rope_type", &kind, why);
            }
        }
        Ok(Gemma3Config {
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            rope_theta: global.and_then(|s| s.rope_theta).unwrap_or(self.rope_theta),
            rope_local_base_freq: local
                .and_then(|s| s.rope_theta)
                .unwrap_or(self.rope_local_base_freq),
            rope_scaling_factor: linear_factor(global, key)?,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            sliding_window: window,
            local_layers,
            query_pre_attn_scalar: self.query_pre_attn_scalar,
            final_logit_softcapping: self.final_logit_softcapping.filter(|&c| c > 0.0),
        })
    }

    /// Which layers are local: `layer_types` where given, else every layer but each
    /// `sliding_window_pattern`-th, as Transformers derives it.
    fn local_layers(&self) -> LoadResult<Vec<bool>> {
        let Some(types) = &self.layer_types else {
            if self.sliding_window_pattern == 0 {
                return Err("`sliding_window_pattern` must be positive".into());
            }
            return Ok(local_layers(
                self.num_hidden_layers,
                self.sliding_window_pattern,
            ));
        };
        if types.len() != self.num_hidden_layers {
            return Err(format!(
                "`layer_types` lists {} layers, `num_hidden_layers` is {}",
                types.len(),
                self.num_hidden_layers
            ));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                "sliding_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(format!(
                    "`layer_types[{i}]` is {other:?}, expected \"sliding_attention\" or \
                     \"full_attention\""
                )),
            })
            .collect()
    }
}

/// The linear RoPE scaling factor of the global layers (1: none), from config key `key`; other
/// kinds are refused.
fn linear_factor(scaling: Option<&RopeScaling>, key: &str) -> LoadResult<f64> {
    let Some(s) = scaling else { return Ok(1.0) };
    match s.rope_type.as_deref().unwrap_or("default") {
        "default" => Ok(1.0),
        "linear" => match s.factor {
            Some(f) if f > 0.0 => Ok(f),
            f => Err(format!(
                "`{key}.factor` is {f:?}, linear scaling needs a positive factor"
            )),
        },
        other => Err(format!(
            "`{key}` type {other:?}: only linear RoPE scaling is implemented"
        )),
    }
}

impl Gemma3Config {
    /// The widths a decode pass in place sizes its buffers by.
    pub fn dims(&self) -> crate::models::step::Dims {
        crate::models::step::Dims {
            hidden: self.hidden_size,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            ffn: self.intermediate_size,
            vocab: self.vocab_size,
        }
    }

    /// Checks the numbers a forward pass divides by.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let (h, kvh) = (self.num_attention_heads, self.num_key_value_heads);
        if h == 0 || kvh == 0 || h % kvh != 0 {
            return Err(format!(
                "num_attention_heads {h} must be a positive multiple of num_key_value_heads {kvh}"
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {} must be even", self.head_dim));
        }
        if self.num_hidden_layers == 0 || self.vocab_size == 0 || self.sliding_window == Some(0) {
            return Err(format!(
                "layers {}, vocab {} and sliding window {:?} must be positive",
                self.num_hidden_layers, self.vocab_size, self.sliding_window
            ));
        }
        if self.local_layers.len() != self.num_hidden_layers {
            return Err(format!(
                "the layer pattern covers {} layers, the model has {}",
                self.local_layers.len(),
                self.num_hidden_layers
            ));
        }
        Ok(())
    }
}
