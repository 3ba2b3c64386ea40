//! Gemma 3 (text): 270M, 1B and the language model of 4B, 12B and 27B.
//!
//! Paper: <https://arxiv.org/abs/2503.19786>; reference code: llama.cpp `src/models/gemma3.cpp`
//! (the logits this file is tested against) and Transformers `models/gemma3/modeling_gemma3.py`.
//! What differs from Llama: the embedding is scaled by sqrt(hidden); each block normalizes the
//! input and the output of both attention and MLP, and q and k per head; the MLP is GeGLU (tanh
//! GELU); of every `pattern` layers all but the last are local (a sliding window, RoPE base
//! 10000) and the last is global (the file's base, with linear scaling); logits may be
//! soft-capped; the output layer is the token embedding unless the file has its own.
//!
//! Norm weights are taken as the multiplier itself: Transformers' `Gemma3RMSNorm` computes
//! x·(1 + w) and llama.cpp's converter stores 1 + w in GGUF files, so the checkpoint source adds
//! the 1 to Hugging Face's w (`source/safetensors.rs`). GGUF keeps q/k rows in Hugging Face
//! order, so both rotate halves (llama.cpp's NEOX mode, Transformers' `rotate_half`).

mod config;
pub mod vision;

use std::sync::Arc;

use candle_core::{DType, Result, Tensor};

use super::decoder::{embedding, LoadResult, Loader, EMBED};
use super::glu::{self, Act};
use super::norm::RmsNorm;
use super::rope::{Rope, RopeRows};
use super::step::{self, Workspace};
use super::vision::{has_images, token_ids, with_image_rows, ImageFeatures};
use super::BuildOptions;
use super::{attend_packed, packed_logits, Mask, PackedRows, Seq};
use crate::attention::Attention;
use crate::kv::KvState;
use crate::weights::{Embedding, Linear, WeightSource};

pub use config::{
    local_layers, Gemma3Config, RopeParameters, TextConfig, ARCHITECTURE, LOCAL_ROPE_BASE,
    MODEL_TYPES, PATTERN,
};

struct Block {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    gate: Linear,
    up: Linear,
    down: Linear,
    attn_norm: RmsNorm,
    post_attn_norm: RmsNorm,
    ffn_norm: RmsNorm,
    post_ffn_norm: RmsNorm,
    /// The sliding window of a local layer.
    window: Option<usize>,
}

/// A loaded Gemma 3 model.
pub struct Gemma3 {
    cfg: Gemma3Config,
    embed: Embedding,
    /// A multimodal model's image features, which stand in the input where its prompts hold
    /// image ids.
    images: Option<Arc<ImageFeatures>>,
    /// sqrt(hidden) as a 0-d tensor in the compute dtype (rounded to it, as Transformers does).
    embed_scale: Tensor,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    local_rope: Rope,
    global_rope: Rope,
    attention: Arc<dyn Attention>,
    max_context: usize,
    /// Whether decode passes run in place ([`step`]), as the Llama-shaped decoder's do.
    steps_in_place: bool,
    /// How its states store keys and values.
    kv_dtype: DType,
}

impl Block {
    /// Every matrix of the block.
    fn layers(&self) -> [&Linear; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down,
        ]
    }
}

/// Block `i`, its norm weights used as stored: the multiplier 1 + w (see the module doc).
fn block(l: &mut Loader<'_>, cfg: &Gemma3Config, i: usize) -> LoadResult<Block> {
    let (h, d, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
    let (nh, kvh, ffn) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
    );
    let p = format!("model.layers.{i}");
    Ok(Block {
        q: l.linear(&format!("{p}.self_attn.q_proj"), nh * d, h, false)?,
        k: l.linear(&format!("{p}.self_attn.k_proj"), kvh * d, h, false)?,
        v: l.linear(&format!("{p}.self_attn.v_proj"), kvh * d, h, false)?,
        o: l.linear(&format!("{p}.self_attn.o_proj"), h, nh * d, false)?,
        q_norm: l.norm(&format!("{p}.self_attn.q_norm"), d, eps)?,
        k_norm: l.norm(&format!("{p}.self_attn.k_norm"), d, eps)?,
        gate: l.linear(&format!("{p}.mlp.gate_proj"), ffn, h, false)?,
        up: l.linear(&format!("{p}.mlp.up_proj"), ffn, h, false)?,
        down: l.linear(&format!("{p}.mlp.down_proj"), h, ffn, false)?,
        attn_norm: l.norm(&format!("{p}.input_layernorm"), h, eps)?,
        post_attn_norm: l.norm(&format!("{p}.post_attention_layernorm"), h, eps)?,
        ffn_norm: l.norm(&format!("{p}.pre_feedforward_layernorm"), h, eps)?,
        post_ffn_norm: l.norm(&format!("{p}.post_feedforward_layernorm"), h, eps)?,
        window: cfg.sliding_window.filter(|_| cfg.local_layers[i]),
    })
}

impl Gemma3 {
    /// Loads every tensor from `src`; a missing or misshapen tensor is an error naming it.
    pub fn load(
        cfg: Gemma3Config,
        src: &mut dyn WeightSource,
        opts: BuildOptions,
    ) -> LoadResult<Self> {
        cfg.validate()?;
        let mut loader = Loader { src, opts: &opts };
        let (vocab, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed_w = loader.weight(EMBED, &[vocab, h])?;
        let untied = loader.src.contains("lm_head.weight");
        let (embed, tied_head) = embedding(embed_w, untied, &opts)?;
        let blocks = (0..cfg.num_hidden_layers)
            .map(|i| block(&mut loader, &cfg, i))
            .collect::<LoadResult<Vec<_>>>()?;
        let norm = loader.norm("model.norm", h, cfg.rms_norm_eps)?;
        let lm_head = match tied_head {
            Some(lm_head) => lm_head,
            None => loader.linear("lm_head", vocab, h, false)?,
        };
        let max_context = opts.max_context.min(cfg.max_position_embeddings).max(1);
        // Linear scaling divides every frequency by the factor; halves rotate (not interleaved).
        let rope = |base: f64, factor: f64| {
            let factors = (factor != 1.0).then(|| vec![factor as f32; cfg.head_dim / 2]);
            let (d, dev) = (cfg.head_dim, &opts.device);
            Rope::new(
                d,
                base,
                factors.as_deref(),
                false,
                max_context,
                opts.dtype,
                dev,
            )
            .map_err(|e| e.to_string())
        };
        let local_rope = rope(cfg.rope_local_base_freq, 1.0)?;
        let global_rope = rope(cfg.rope_theta, cfg.rope_scaling_factor)?;
        let embed_scale = Tensor::new((h as f32).sqrt(), &opts.device)
            .and_then(|t| t.to_dtype(opts.dtype))
            .map_err(|e| e.to_string())?;
        let layers = blocks.iter().flat_map(Block::layers);
        let steps_in_place = step::runs_in_place(&opts, layers.chain([&lm_head]));
        Ok(Gemma3 {
            steps_in_place,
            kv_dtype: opts.kv_dtype,
            embed,
            embed_scale,
            images: None,
            blocks,
            norm,
            lm_head,
            local_rope,
            global_rope,
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
        let cfg = &self.cfg;
        let (nh, kvh, d) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        // Normalized per head before the heads axis moves (rms_norm wants contiguous rows).
        let heads = |t: Tensor, n: usize, norm: Option<&RmsNorm>| {
            let t = t.reshape((1, rows, n, d))?;
            let t = match norm {
                Some(norm) => norm.forward(&t)?,
                None => t,
            };
            t.transpose(1, 2)
        };
        let [q, k, v] = Linear::forward_group([&b.q, &b.k, &b.v], x)?;
        let q = rope.apply(&heads(q, nh, Some(&b.q_norm))?)?;
        let k = rope.apply(&heads(k, kvh, Some(&b.k_norm))?)?;
        let v = heads(v, kvh, None)?.contiguous()?;
        let y = attend_packed(
            self.attention.as_ref(),
            layer,
            (&q, &k, &v),
            seqs,
            starts,
            1.0 / cfg.query_pre_attn_scalar.sqrt(),
            Mask {
                sliding_window: b.window,
                images_whole: true,
            },
        )?;
        b.o.forward(&y)
    }

    fn mlp(b: &Block, x: &Tensor) -> Result<Tensor> {
        let [gate, up] = Linear::forward_group([&b.gate, &b.up], x)?;
        let coarse = b.down.rounds_input_to_bf16();
        b.down
            .forward(&glu::gated(Act::GeluTanh, &gate, &up, coarse)?)
    }

    /// This model seeing images: prompts' image ids take their rows from `images`.
    pub fn seeing(self, images: Arc<ImageFeatures>) -> Self {
        Gemma3 {
            images: Some(images),
            ..self
        }
    }

    /// The input rows of `ids`, `(1, ids.len(), h)`: token embeddings scaled by sqrt(h), and
    /// an image id's features as they are (Transformers scatters them in after scaling).
    fn embed_rows(&self, ids: &[u32]) -> Result<Tensor> {
        let tokens = Tensor::new(token_ids(ids), &self.embed.device())?;
        let x = self
            .embed
            .forward(&tokens)?
            .broadcast_mul(&self.embed_scale)?;
        with_image_rows(x, ids, self.images.as_deref())?.unsqueeze(0)
    }

    /// Runs the blocks over every sequence's ids, returning the final normalized hidden states
    /// of all rows, `(rows, h)`.
    fn trunk(&self, seqs: &mut [Seq<'_>]) -> Result<Tensor> {
        let PackedRows {
            starts,
            ids,
            positions,
        } = PackedRows::of(seqs, self.max_context)?;
        let local = self.local_rope.at(&positions)?;
        let global = self.global_rope.at(&positions)?;
        let mut x = self.embed_rows(&ids)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let rope = if b.window.is_some() { &local } else { &global };
            let attn = self.attention(b, &b.attn_norm.forward(&x)?, i, rope, seqs, &starts)?;
            let x1 = (b.post_attn_norm.forward(&attn)? + &x)?;
            let mlp = Self::mlp(b, &b.ffn_norm.forward(&x1)?)?;
            x = (b.post_ffn_norm.forward(&mlp)? + x1)?;
        }
        self.norm.forward(&x)?.squeeze(0)
    }

    /// A decode pass in place (see [`step`]): each sequence's logits.
    fn decode_step(&self, seqs: &mut [Seq<'_>], ws: &mut Workspace) -> Result<Vec<Option<Tensor>>> {
        let cfg = &self.cfg;
        let dims = cfg.dims();
        let (h, ffn, qw) = (dims.hidden, dims.ffn, dims.heads * dims.head_dim);
        let mut p = ws.pass(seqs, dims, self.max_context, &self.embed)?;
        // `embed_scale` in f32, the only dtype a pass in place runs in.
        let embed_scale = (h as f32).sqrt();
        p.x.iter_mut().for_each(|x| *x *= embed_scale);
        let scale = (1.0 / cfg.query_pre_attn_scalar.sqrt()) as f32;
        for (i, b) in self.blocks.iter().enumerate() {
            b.attn_norm.forward_into(p.x, p.normed)?;
            let qkv = [&b.q, &b.k, &b.v];
            Linear::decode_into(&qkv, (p.normed, h), &mut [p.q, p.k, p.v], p.scratch)?;
            b.q_norm.forward_in_place(p.q)?;
            b.k_norm.forward_in_place(p.k)?;
            let rope = match b.window {
                Some(_) => &self.local_rope,
                None => &self.global_rope,
            };
            step::rotate(rope, p.positions, p.q, p.k)?;
            p.attend(seqs, (i, b.window, scale))?;
            Linear::decode_into(&[&b.o], (p.attn, qw), &mut [&mut *p.out], p.scratch)?;
            b.post_attn_norm.forward_in_place(p.out)?;
            step::add(p.x, p.out);
            b.ffn_norm.forward_into(p.x, p.normed)?;
            let gate_up = [&b.gate, &b.up];
            Linear::decode_into(&gate_up, (p.normed, h), &mut [p.gate, p.up], p.scratch)?;
            glu::gated_into(Act::GeluTanh, p.gate, p.up, p.act);
            Linear::decode_into(&[&b.down], (p.act, ffn), &mut [&mut *p.out], p.scratch)?;
            b.post_ffn_norm.forward_in_place(p.out)?;
            step::add(p.x, p.out);
        }
        p.output(&self.norm, &self.lm_head)?;
        if let Some(cap) = self.cfg.final_logit_softcapping {
            let (cap, by) = (cap as f32, (1.0 / cap) as f32);
            p.logits
                .iter_mut()
                .for_each(|l| *l = (*l * by).tanh() * cap);
        }
        step::logits_out(p.logits, seqs.len())
    }

    fn head(&self, x: &Tensor) -> Result<Tensor> {
        let logits = self.lm_head.forward(x)?;
        match self.cfg.final_logit_softcapping {
            Some(cap) => (logits / cap)?.tanh()? * cap,
            None => Ok(logits),
        }
    }
}

impl super::CausalLm for Gemma3 {
    fn forward_packed(
        &self,
        seqs: &mut [Seq<'_>],
        hidden: bool,
    ) -> Result<(Vec<Option<Tensor>>, Option<Tensor>)> {
        let images = seqs.iter().any(|s| has_images(s.ids));
        if self.steps_in_place && !hidden && !images && step::is_decode(seqs) {
            let logits = Workspace::with(|ws| self.decode_step(seqs, ws))?;
            return Ok((logits, None));
        }
        let states = self.trunk(seqs)?;
        let logits = packed_logits(seqs, &states, |x| self.head(x))?;
        Ok((logits, hidden.then_some(states)))
    }

    fn new_state(&self) -> KvState {
        KvState::new(self.blocks.len()).stored_as(self.kv_dtype)
    }

    /// Scaled by sqrt(hidden): the rows the first layer sees.
    fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        self.embed_rows(ids)?.squeeze(0)?.to_dtype(DType::F32)
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn architecture(&self) -> &str {
        ARCHITECTURE
    }
}
