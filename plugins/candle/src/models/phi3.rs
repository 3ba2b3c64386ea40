//! Phi-3 (mini, medium; Phi-4 without long-rope scaling): the Llama block with q/k/v in one
//! matrix (`qkv_proj`, GGUF `attn_qkv`) and gate/up in one (`gate_up_proj`, GGUF `ffn_up`, gate
//! rows first).
//!
//! Reference code: llama.cpp `src/models/phi3.cpp` (the logits `tests/families.rs` compares
//! against), candle-transformers `models/phi3.rs`, Transformers `models/phi3/modeling_phi3.py`.
//! RoPE rotates halves (llama.cpp's NEOX mode). The 128k models' long-rope factors ("su",
//! "longrope"; GGUF `rope_factors_long`/`rope_factors_short`) are refused at load time, as are
//! partial rotations. The sliding window is applied as the file declares it (Transformers does;
//! llama.cpp 0.3.36 ignores Phi-3's), which only matters past the window (2047 for mini-4k).

use super::decoder::{Block, GateUp, LlamaConfig, LoadResult, Loader, Qkv};

/// Block `i`: fused `qkv_proj` and `gate_up_proj`, with Llama's norms, `o_proj` and `down_proj`.
pub fn block(l: &mut Loader<'_>, cfg: &LlamaConfig, i: usize) -> LoadResult<Block> {
    let (h, d, kvh) = (cfg.hidden_size, cfg.head_dim(), cfg.kv_heads());
    let (nh, ffn, eps) = (
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.rms_norm_eps,
    );
    let p = format!("model.layers.{i}");
    let qkv = l.linear(
        &format!("{p}.self_attn.qkv_proj"),
        (nh + 2 * kvh) * d,
        h,
        cfg.qkv_bias(),
    )?;
    Ok(Block {
        attn_norm: l.norm(&format!("{p}.input_layernorm"), h, eps)?,
        qkv: Qkv::Fused(qkv),
        qk_norm: None,
        o: l.linear(&format!("{p}.self_attn.o_proj"), h, nh * d, false)?,
        mlp_norm: l.norm(&format!("{p}.post_attention_layernorm"), h, eps)?,
        gate_up: GateUp::Fused(l.linear(&format!("{p}.mlp.gate_up_proj"), 2 * ffn, h, false)?),
        down: l.linear(&format!("{p}.mlp.down_proj"), h, ffn, false)?,
    })
}
