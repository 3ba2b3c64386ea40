//! Qwen3 (dense): the Llama block with an RMSNorm over each head of q and of k before RoPE, and no
//! q/k/v bias; `head_dim` is its own setting (128 where hidden / heads is not).
//!
//! Reference code: llama.cpp `src/models/qwen3.cpp` (the logits `tests/families.rs` compares
//! against), candle-transformers `models/qwen3.rs`, Transformers `models/qwen3/modeling_qwen3.py`.
//! GGUF files keep Hugging Face's q/k row order: RoPE rotates halves (llama.cpp's NEOX mode).

use super::decoder::{Block, LlamaConfig, LoadResult, Loader};

/// Block `i`: [`super::llama::block`] plus `self_attn.q_norm` and `self_attn.k_norm`.
pub fn block(l: &mut Loader<'_>, cfg: &LlamaConfig, i: usize) -> LoadResult<Block> {
    let mut block = super::llama::block(l, cfg, i)?;
    let (d, eps) = (cfg.head_dim(), cfg.rms_norm_eps);
    let p = format!("model.layers.{i}.self_attn");
    block.qk_norm = Some((
        l.norm(&format!("{p}.q_norm"), d, eps)?,
        l.norm(&format!("{p}.k_norm"), d, eps)?,
    ));
    Ok(block)
}
