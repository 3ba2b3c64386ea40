//! Whisper's encoder-decoder transformer (Radford et al. 2022, <https://arxiv.org/abs/2212.04356>).
//!
//! Reference code: `openai/whisper/model.py`, Hugging Face `modeling_whisper.py`, and
//! candle-transformers' `models/whisper/model.rs`. Unlike the latter, the decoder keeps its
//! self-attention keys and values in the plugin's own [`KvState`] (one token per step instead of
//! re-running the whole prefix), and the cross-attention keys and values are computed once per
//! audio window ([`CrossKv`]), so they can be cached with the encoder output. Tensor names are
//! Hugging Face's (`model.encoder.layers.0.self_attn.q_proj`); the CTranslate2 reader renames
//! to them. GELU is the exact (erf) form, as in both references' PyTorch code.

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{Conv1d, Conv1dConfig, LayerNorm, Linear, VarBuilder};

use super::Config;
use crate::kv::KvState;

fn layer_norm(size: usize, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        vb.get(size, "weight")?,
        vb.get(size, "bias")?,
        1e-5,
    ))
}

fn linear(d_in: usize, d_out: usize, bias: bool, vb: VarBuilder) -> Result<Linear> {
    let weight = vb.get((d_out, d_in), "weight")?;
    let bias = if bias {
        Some(vb.get(d_out, "bias")?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

fn conv1d(d_in: usize, d_out: usize, stride: usize, vb: VarBuilder) -> Result<Conv1d> {
    let config = Conv1dConfig {
        padding: 1,
        stride,
        ..Default::default()
    };
    Ok(Conv1d::new(
        vb.get((d_out, d_in, 3), "weight")?,
        Some(vb.get(d_out, "bias")?),
        config,
    ))
}

/// Multi-head attention; the key projection has no bias.
#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
}

impl Attention {
    fn load(d: usize, heads: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Attention {
            q: linear(d, d, true, vb.pp("q_proj"))?,
            k: linear(d, d, false, vb.pp("k_proj"))?,
            v: linear(d, d, true, vb.pp("v_proj"))?,
            out: linear(d, d, true, vb.pp("out_proj"))?,
            heads,
        })
    }

    /// `(1, seq, d)` to `(1, heads, seq, d / heads)`.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, n, d) = x.dims3()?;
        x.reshape((b, n, self.heads, d / self.heads))?
            .transpose(1, 2)?
            .contiguous()
    }

    fn keys_values(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            self.split_heads(&self.k.forward(x)?)?,
            self.split_heads(&self.v.forward(x)?)?,
        ))
    }

    fn attend(&self, x: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let q = self.split_heads(&self.q.forward(x)?)?;
        let head_dim = q.dim(D::Minus1)?;
        let scores = (q.matmul(&k.t()?)? / (head_dim as f64).sqrt())?;
        let scores = match mask {
            Some(mask) => scores.broadcast_add(mask)?,
            None => scores,
        };
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let (b, _, n, _) = q.dims4()?;
        let y = weights
            .matmul(v)?
            .transpose(1, 2)?
            .reshape((b, n, self.heads * head_dim))?;
        self.out.forward(&y)
    }
}

#[derive(Debug, Clone)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn load(d: usize, ffn: usize, vb: &VarBuilder) -> Result<Self> {
        Ok(Mlp {
            fc1: linear(d, ffn, true, vb.pp("fc1"))?,
            fc2: linear(ffn, d, true, vb.pp("fc2"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.gelu_erf()?)
    }
}

#[derive(Debug, Clone)]
struct EncoderLayer {
    attn: Attention,
    attn_ln: LayerNorm,
    mlp: Mlp,
    mlp_ln: LayerNorm,
}

impl EncoderLayer {
    fn load(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        Ok(EncoderLayer {
            attn: Attention::load(d, cfg.encoder_attention_heads, vb.pp("self_attn"))?,
            attn_ln: layer_norm(d, vb.pp("self_attn_layer_norm"))?,
            mlp: Mlp::load(d, cfg.encoder_ffn_dim, &vb)?,
            mlp_ln: layer_norm(d, vb.pp("final_layer_norm"))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.attn_ln.forward(x)?;
        let (k, v) = self.attn.keys_values(&h)?;
        let x = (x + self.attn.attend(&h, &k, &v, None)?)?;
        &x + self.mlp.forward(&self.mlp_ln.forward(&x)?)?
    }
}

/// The audio encoder: two convolutions, learned-or-sinusoidal positions, transformer layers.
#[derive(Debug, Clone)]
pub struct Encoder {
    conv1: Conv1d,
    conv2: Conv1d,
    positions: Tensor,
    layers: Vec<EncoderLayer>,
    ln: LayerNorm,
}

impl Encoder {
    fn load(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        Ok(Encoder {
            conv1: conv1d(cfg.num_mel_bins, d, 1, vb.pp("conv1"))?,
            conv2: conv1d(d, d, 2, vb.pp("conv2"))?,
            positions: vb.get((cfg.max_source_positions, d), "embed_positions.weight")?,
            layers: (0..cfg.encoder_layers)
                .map(|i| EncoderLayer::load(cfg, vb.pp(format!("layers.{i}"))))
                .collect::<Result<_>>()?,
            ln: layer_norm(d, vb.pp("layer_norm"))?,
        })
    }

    /// `mel` is `(1, n_mels, frames)`; returns `(1, frames / 2, d_model)`.
    pub fn forward(&self, mel: &Tensor) -> Result<Tensor> {
        let x = self.conv1.forward(mel)?.gelu_erf()?;
        let x = self.conv2.forward(&x)?.gelu_erf()?.transpose(1, 2)?;
        let n = x.dim(1)?;
        let mut x = x.broadcast_add(&self.positions.narrow(0, 0, n)?)?;
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        self.ln.forward(&x)
    }
}

#[derive(Debug, Clone)]
struct DecoderLayer {
    attn: Attention,
    attn_ln: LayerNorm,
    cross: Attention,
    cross_ln: LayerNorm,
    mlp: Mlp,
    mlp_ln: LayerNorm,
}

impl DecoderLayer {
    fn load(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let (d, heads) = (cfg.d_model, cfg.decoder_attention_heads);
        Ok(DecoderLayer {
            attn: Attention::load(d, heads, vb.pp("self_attn"))?,
            attn_ln: layer_norm(d, vb.pp("self_attn_layer_norm"))?,
            cross: Attention::load(d, heads, vb.pp("encoder_attn"))?,
            cross_ln: layer_norm(d, vb.pp("encoder_attn_layer_norm"))?,
            mlp: Mlp::load(d, cfg.decoder_ffn_dim, &vb)?,
            mlp_ln: layer_norm(d, vb.pp("final_layer_norm"))?,
        })
    }
}

/// Cross-attention keys and values of one encoded audio window, one pair per decoder layer,
/// and which encoder positions the decoder may not attend to (`score_hidden`).
#[derive(Debug, Clone)]
pub struct CrossKv {
    layers: Vec<(Tensor, Tensor)>,
    /// `(1, positions)`: 0 where visible, `-inf` where hidden.
    mask: Option<Tensor>,
    /// Every position is hidden: attending to nothing adds nothing, so the decoder skips its
    /// cross-attention.
    deaf: bool,
}

impl CrossKv {
    /// How many encoder positions (20 ms each) the window has.
    pub fn positions(&self) -> Result<usize> {
        match self.layers.first() {
            Some((k, _)) => k.dim(2),
            None => Ok(0),
        }
    }

    /// These keys and values with the encoder positions where `hidden` is true masked out of
    /// the decoder's attention (the same as deleting them: cross-attention has no positions
    /// of its own).
    pub fn hiding(&self, hidden: &[bool]) -> Result<CrossKv> {
        let positions = self.positions()?;
        let Some((k, _)) = self.layers.first().filter(|_| hidden.len() == positions) else {
            candle_core::bail!(
                "{} hidden flags for {positions} encoder positions in {} layers",
                hidden.len(),
                self.layers.len()
            );
        };
        let mask: Vec<f32> = (hidden.iter())
            .map(|&h| if h { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        let mask = Tensor::from_vec(mask, (1, positions), k.device())?.to_dtype(k.dtype())?;
        Ok(CrossKv {
            layers: self.layers.clone(),
            mask: Some(mask),
            deaf: hidden.iter().all(|&h| h),
        })
    }
}

/// The text decoder; its output projection is tied to the token embedding.
#[derive(Debug, Clone)]
pub struct TextDecoder {
    embed: Tensor,
    positions: Tensor,
    layers: Vec<DecoderLayer>,
    ln: LayerNorm,
}

impl TextDecoder {
    fn load(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let d = cfg.d_model;
        Ok(TextDecoder {
            embed: vb.get((cfg.vocab_size, d), "embed_tokens.weight")?,
            positions: vb.get((cfg.max_target_positions, d), "embed_positions.weight")?,
            layers: (0..cfg.decoder_layers)
                .map(|i| DecoderLayer::load(cfg, vb.pp(format!("layers.{i}"))))
                .collect::<Result<_>>()?,
            ln: layer_norm(d, vb.pp("layer_norm"))?,
        })
    }

    pub fn device(&self) -> candle_core::Device {
        self.embed.device().clone()
    }

    /// The compute dtype (option `dtype`); logits come out in f32 whatever it is.
    pub fn dtype(&self) -> candle_core::DType {
        self.embed.dtype()
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Projects an encoder output `(1, positions, d)` into every layer's cross keys and values.
    pub fn cross_kv(&self, encoded: &Tensor) -> Result<CrossKv> {
        self.layers
            .iter()
            .map(|l| l.cross.keys_values(encoded))
            .collect::<Result<_>>()
            .map(|layers| CrossKv {
                layers,
                mask: None,
                deaf: false,
            })
    }

    /// The token-embedding rows of `ids`, `(len, d)`.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(ids, self.embed.device())?;
        self.embed.index_select(&ids, 0)
    }

    /// Runs `ids` at the positions after those `kv` holds, appending to `kv`; returns the final
    /// hidden states `(1, len, d)` (after the last layer norm).
    pub fn forward(&self, ids: &[u32], kv: &mut KvState, cross: &CrossKv) -> Result<Tensor> {
        self.forward_hiding(ids, kv, cross, &[])
    }

    /// [`Self::forward`] where no later token attends to the tokens at positions `hidden`.
    pub fn forward_hiding(
        &self,
        ids: &[u32],
        kv: &mut KvState,
        cross: &CrossKv,
        hidden: &[usize],
    ) -> Result<Tensor> {
        let offset = kv.len();
        let n = ids.len();
        let x = self.embed(ids)?.unsqueeze(0)?;
        let mut x = x.broadcast_add(&self.positions.narrow(0, offset, n)?)?;
        let mask = causal_mask(n, offset, hidden, x.device())?
            .map(|m| m.to_dtype(x.dtype()))
            .transpose()?;
        for (i, (layer, (ck, cv))) in self.layers.iter().zip(&cross.layers).enumerate() {
            let h = layer.attn_ln.forward(&x)?;
            let (k, v) = layer.attn.keys_values(&h)?;
            let (k, v) = kv.append(i, &k, &v)?;
            x = (&x + layer.attn.attend(&h, &k, &v, mask.as_ref())?)?;
            if !cross.deaf {
                let h = layer.cross_ln.forward(&x)?;
                x = (&x + layer.cross.attend(&h, ck, cv, cross.mask.as_ref())?)?;
            }
            x = (&x + layer.mlp.forward(&layer.mlp_ln.forward(&x)?)?)?;
        }
        self.ln.forward(&x)
    }

    /// Logits `(len, vocab)` in f32 of hidden states `(1, len, d)`.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        hidden
            .squeeze(0)?
            .matmul(&self.embed.t()?)?
            .to_dtype(candle_core::DType::F32)
    }
}

/// `None` for one new token that hides nothing (it may see everything); else `-inf` above the
/// shifted diagonal and, below it, in the columns of `hidden` positions.
fn causal_mask(
    n: usize,
    offset: usize,
    hidden: &[usize],
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    if n == 1 && hidden.is_empty() {
        return Ok(None);
    }
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..offset + n).map(move |j| {
                if j > offset + i || (j < offset + i && hidden.contains(&j)) {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (n, offset + n), device).map(Some)
}

/// The whole model.
#[derive(Debug, Clone)]
pub struct Whisper {
    pub encoder: Encoder,
    pub decoder: TextDecoder,
    pub config: Config,
}

impl Whisper {
    /// Loads from tensors under Hugging Face's names (`model.encoder...`, `model.decoder...`).
    pub fn load(vb: VarBuilder, config: Config) -> Result<Self> {
        Ok(Whisper {
            encoder: Encoder::load(&config, vb.pp("model.encoder"))?,
            decoder: TextDecoder::load(&config, vb.pp("model.decoder"))?,
            config,
        })
    }
}
