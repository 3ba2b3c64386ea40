//! The Llama family: Llama 2/3.x, Mistral, Qwen2, SmolLM.
//!
//! Paper: <https://arxiv.org/abs/2302.13971>; reference code: candle-transformers
//! `models/llama.rs` and `models/quantized_llama.rs`, llama.cpp `src/models/{llama,qwen2}.cpp`.
//! Differences between members are config flags: grouped-query attention, RoPE theta and Llama
//! 3.x's frequency scaling, qkv bias (Qwen2), tied or separate output, a sliding window
//! (Mistral). GGUF Llama files permute q/k rows so RoPE rotates interleaved pairs; Hugging Face
//! checkpoints (and GGUF Qwen and Phi files) rotate halves: `rope_interleaved` says which. The
//! network and its config are `decoder/`; this file names a block's tensors.

use super::decoder::{Block, GateUp, LlamaConfig, LoadResult, Loader, Qkv};

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
