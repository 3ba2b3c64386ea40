//! The pre-norm decoder the Llama-shaped families share: RMSNorm, attention with RoPE, residual,
//! RMSNorm, SiLU-gated MLP, residual; final RMSNorm and the output layer.
//!
//! The op order follows candle-transformers' `quantized_llama.rs` (logits agree with it to float
//! precision on the same weights). Family files say only what differs, which tensors make up a
//! block ([`BlockLoader`], chosen by [`super::load_decoder`]): `llama.rs` (Llama 2/3.x, Mistral, Qwen2, SmolLM), `qwen3.rs`
//! (per-head q/k norms), `phi3.rs` (fused q/k/v and gate/up matrices). So the packed pass
//! (sequences sharing a prefix, each with its own KV state) is written once for all of them.

mod block;
mod config;

use std::sync::Arc;

use candle_core::{DType, Result, Tensor};

pub use block::{embedding, Block, BlockLoader, GateUp, LoadResult, Loader, Qkv, EMBED};
pub use config::{LlamaConfig, PP_PLAN, TP_PLAN};

use super::glu::{self, Act};
use super::norm::RmsNorm;
use super::rope::{Rope, RopeRows};
use super::step::{self, Workspace};
use super::vision::{has_images, token_ids, with_image_rows, ImageFeatures};
use super::{attend_packed, packed_logits, BuildOptions, Mask, PackedRows, Seq};
use crate::attention::Attention;
use crate::kv::KvState;
use crate::weights::{Embedding, Linear, WeightSource};

/// A loaded decoder-only model of one of the Llama-shaped families.
pub struct Decoder {
    cfg: LlamaConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    attention: Arc<dyn Attention>,
    max_context: usize,
    /// Whether decode passes run in place ([`step`]): every matrix decodes through our
    /// kernels, in f32 on CPU, and attention is a built-in one
    /// ([`Attention::rows_in_place`]: an application's own is called for every pass).
    steps_in_place: bool,
    /// How its states store keys and values.
    kv_dtype: DType,
    /// A vision-language model's image features (Idefics3's), which stand in the input where
    /// its prompts hold image ids.
    images: Option<Arc<ImageFeatures>>,
}

impl Decoder {
    /// Loads every tensor from `src` with the blocks of `cfg.model_type`'s family; a missing or
    /// misshapen tensor is an error naming it.
    pub fn load(
        cfg: LlamaConfig,
        block: BlockLoader,
        src: &mut dyn WeightSource,
        opts: BuildOptions,
    ) -> LoadResult<Self> {
        cfg.validate()?;
        let mut loader = Loader { src, opts: &opts };
        let factors = loader.rope_factors(&cfg)?;
        let (vocab, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed_w = loader.weight(EMBED, &[vocab, h])?;
        let untied = !cfg.tie_word_embeddings && loader.src.contains("lm_head.weight");
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
        let rope = Rope::new(
            cfg.head_dim(),
            cfg.rope_base(),
            factors.as_deref(),
            cfg.rope_interleaved,
            max_context,
            opts.dtype,
            &opts.device,
        )
        .map_err(|e| e.to_string())?;
        let layers = blocks.iter().flat_map(Block::layers);
        let steps_in_place = step::runs_in_place(&opts, layers.chain([&lm_head]));
        Ok(Decoder {
            embed,
            blocks,
            norm,
            lm_head,
            rope,
            attention: opts.attention,
            max_context,
            cfg,
            steps_in_place,
            kv_dtype: opts.kv_dtype,
            images: None,
        })
    }

    /// This model seeing images: prompts' image ids take their rows from `images`.
    pub fn seeing(self, images: Arc<ImageFeatures>) -> Self {
        Decoder {
            images: Some(images),
            ..self
        }
    }

    /// The input rows of `ids`, `(ids.len(), h)`: token embeddings, an image id's features.
    fn embed_rows(&self, ids: &[u32]) -> Result<Tensor> {
        let tokens = Tensor::new(token_ids(ids), &self.embed.device())?;
        with_image_rows(self.embed.forward(&tokens)?, ids, self.images.as_deref())
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
        let [q, k, v] = b.qkv.forward(x, nh * d, kvh * d)?;
        let (q_norm, k_norm) = match &b.qk_norm {
            Some((q, k)) => (Some(q), Some(k)),
            None => (None, None),
        };
        // `(1, rows, n * d)` → `(1, n, rows, d)`, each head normalized first when asked.
        let heads = |t: Tensor, n: usize, norm: Option<&RmsNorm>| {
            let t = t.reshape((1, rows, n, d))?;
            match norm {
                Some(norm) => norm.forward(&t)?.transpose(1, 2),
                None => t.transpose(1, 2),
            }
        };
        let q = rope.apply(&heads(q, nh, q_norm)?)?;
        let k = rope.apply(&heads(k, kvh, k_norm)?)?;
        let v = heads(v, kvh, None)?.contiguous()?;
        let y = attend_packed(
            self.attention.as_ref(),
            layer,
            (&q, &k, &v),
            seqs,
            starts,
            1.0 / (d as f64).sqrt(),
            Mask {
                sliding_window: self.cfg.window(),
                images_whole: false,
            },
        )?;
        b.o.forward(&y)
    }

    /// A decode pass in place (see [`step`]): each sequence's logits.
    fn decode_step(&self, seqs: &mut [Seq<'_>], ws: &mut Workspace) -> Result<Vec<Option<Tensor>>> {
        let cfg = &self.cfg;
        let dims = cfg.dims();
        let (h, ffn, qw) = (dims.hidden, dims.ffn, dims.heads * dims.head_dim);
        let mut p = ws.pass(seqs, dims, self.max_context, &self.embed)?;
        let scale = (1.0 / (dims.head_dim as f64).sqrt()) as f32;
        for (i, b) in self.blocks.iter().enumerate() {
            b.attn_norm.forward_into(p.x, p.normed)?;
            b.qkv
                .decode_into((p.normed, h), [p.q, p.k, p.v], p.fused, p.scratch)?;
            if let Some((q_norm, k_norm)) = &b.qk_norm {
                q_norm.forward_in_place(p.q)?;
                k_norm.forward_in_place(p.k)?;
            }
            step::rotate(&self.rope, p.positions, p.q, p.k)?;
            p.attend(seqs, (i, cfg.window(), scale))?;
            Linear::decode_into(&[&b.o], (p.attn, qw), &mut [&mut *p.out], p.scratch)?;
            step::add(p.x, p.out);
            b.mlp_norm.forward_into(p.x, p.normed)?;
            b.gate_up
                .decode_into((p.normed, h), [p.gate, p.up], p.fused, p.scratch)?;
            glu::gated_into(Act::Silu, p.gate, p.up, p.act);
            Linear::decode_into(&[&b.down], (p.act, ffn), &mut [&mut *p.out], p.scratch)?;
            step::add(p.x, p.out);
        }
        p.output(&self.norm, &self.lm_head)?;
        step::logits_out(p.logits, seqs.len())
    }

    /// Runs the blocks over every sequence's ids, returning the final normalized hidden states
    /// of all rows, `(rows, h)`.
    fn trunk(&self, seqs: &mut [Seq<'_>]) -> Result<Tensor> {
        let PackedRows {
            starts,
            ids,
            positions,
        } = PackedRows::of(seqs, self.max_context)?;
        let rope = self.rope.at(&positions)?;
        let mut x = self.embed_rows(&ids)?.unsqueeze(0)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let attn = self.attention(b, &b.attn_norm.forward(&x)?, i, &rope, seqs, &starts)?;
            let x1 = (attn + &x)?;
            x = (b.mlp(&b.mlp_norm.forward(&x1)?, self.cfg.intermediate_size)? + x1)?;
        }
        self.norm.forward(&x)?.squeeze(0)
    }
}

impl super::CausalLm for Decoder {
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
        let logits = packed_logits(seqs, &states, |x| self.lm_head.forward(x))?;
        Ok((logits, hidden.then_some(states)))
    }

    fn new_state(&self) -> KvState {
        KvState::new(self.blocks.len()).stored_as(self.kv_dtype)
    }

    fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        self.embed_rows(ids)?.to_dtype(DType::F32)
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn architecture(&self) -> &str {
        &self.cfg.model_type
    }
}
