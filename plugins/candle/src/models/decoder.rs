//! The pre-norm decoder the Llama-shaped families share: RMSNorm, attention with RoPE, residual,
//! RMSNorm, SiLU-gated MLP, residual; final RMSNorm and the output layer.
//!
//! The op order follows candle-transformers' `quantized_llama.rs` (logits agree with it to float
//! precision on the same weights). Family files say only what differs, which tensors make up a
//! block ([`BlockLoader`]): `llama.rs` (Llama 2/3.x, Mistral, Qwen2, SmolLM), `qwen3.rs`
//! (per-head q/k norms), `phi3.rs` (fused q/k/v and gate/up matrices). So the packed pass
//! (sequences sharing a prefix, each with its own KV state) is written once for all of them.

use std::sync::Arc;

use candle_core::{DType, Result, Tensor};

use super::glu::{self, Act};
use super::llama::{BuildOptions, LlamaConfig};
use super::rope::{Rope, RopeRows};
use super::step::{self, Workspace};
use super::{attend_packed, packed_logits, PackedRows, Seq};
use crate::attention::Attention;
use crate::kernels;
use crate::kv::KvState;
use crate::weights::{self, Embedding, Linear, Weight, WeightSource};

pub type LoadResult<T> = std::result::Result<T, String>;

/// Builds block `i` from a source: one function per family.
pub type BlockLoader = fn(&mut Loader<'_>, &LlamaConfig, usize) -> LoadResult<Block>;

pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Normalizes over the last axis of a contiguous tensor.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }

    /// [`RmsNorm::forward`] of rows of f32 values into `out` (an in-place decode step).
    pub fn forward_into(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.values(|w| step::rms_norm(x, w, self.eps, out))
    }

    /// [`RmsNorm::forward`] of rows of f32 values into themselves.
    pub fn forward_in_place(&self, x: &mut [f32]) -> Result<()> {
        self.values(|w| step::rms_norm_in_place(x, w, self.eps))
    }

    fn values(&self, f: impl FnOnce(&[f32])) -> Result<()> {
        weights::f32_values(&self.weight, f)
            .ok_or_else(|| candle_core::Error::Msg("a norm's weights are not f32 on CPU".into()))
    }
}

/// The q, k and v projections: three matrices, or one whose output rows hold q, k, v in order.
pub enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

impl Qkv {
    /// q, k and v of `x` (rows of `h` values) into the caller's buffers, through the layers'
    /// decode kernels ([`Linear::decode_into`]); a fused matrix's rows are split after.
    fn decode_into(
        &self,
        (x, h): (&[f32], usize),
        [q, k, v]: [&mut [f32]; 3],
        ws_fused: &mut Vec<f32>,
        scratch: &mut kernels::Scratch,
    ) -> Result<()> {
        match self {
            Qkv::Separate {
                q: lq,
                k: lk,
                v: lv,
            } => Linear::decode_into(&[lq, lk, lv], (x, h), &mut [q, k, v], scratch),
            Qkv::Fused(qkv) => {
                let rows = x.len() / h.max(1);
                let widths = [q.len() / rows, k.len() / rows, v.len() / rows];
                let fused = step::sized(ws_fused, q.len() + k.len() + v.len());
                Linear::decode_into(&[qkv], (x, h), &mut [&mut *fused], scratch)?;
                step::split_rows(fused, &mut [q, k, v], &widths);
                Ok(())
            }
        }
    }

    fn layers(&self) -> Vec<&Linear> {
        match self {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(qkv) => vec![qkv],
        }
    }

    fn forward(&self, x: &Tensor, q_width: usize, kv_width: usize) -> Result<[Tensor; 3]> {
        match self {
            Qkv::Separate { q, k, v } => Linear::forward_group([q, k, v], x),
            Qkv::Fused(qkv) => {
                let y = qkv.forward(x)?;
                Ok([
                    y.narrow(2, 0, q_width)?,
                    y.narrow(2, q_width, kv_width)?,
                    y.narrow(2, q_width + kv_width, kv_width)?,
                ])
            }
        }
    }
}

/// The MLP's gate and up projections: two matrices, or one whose output holds gate then up.
pub enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

pub struct Block {
    pub attn_norm: RmsNorm,
    pub qkv: Qkv,
    /// RMSNorm over each head of q and of k, before RoPE (Qwen3).
    pub qk_norm: Option<(RmsNorm, RmsNorm)>,
    pub o: Linear,
    pub mlp_norm: RmsNorm,
    pub gate_up: GateUp,
    pub down: Linear,
}

impl GateUp {
    /// gate and up of `x` into the caller's buffers, as [`Qkv::decode_into`].
    fn decode_into(
        &self,
        (x, h): (&[f32], usize),
        [gate, up]: [&mut [f32]; 2],
        ws_fused: &mut Vec<f32>,
        scratch: &mut kernels::Scratch,
    ) -> Result<()> {
        match self {
            GateUp::Separate { gate: lg, up: lu } => {
                Linear::decode_into(&[lg, lu], (x, h), &mut [gate, up], scratch)
            }
            GateUp::Fused(gate_up) => {
                let rows = x.len() / h.max(1);
                let width = gate.len() / rows.max(1);
                let fused = step::sized(ws_fused, gate.len() + up.len());
                Linear::decode_into(&[gate_up], (x, h), &mut [&mut *fused], scratch)?;
                step::split_rows(fused, &mut [gate, up], &[width, width]);
                Ok(())
            }
        }
    }

    fn layers(&self) -> Vec<&Linear> {
        match self {
            GateUp::Separate { gate, up } => vec![gate, up],
            GateUp::Fused(gate_up) => vec![gate_up],
        }
    }
}

impl Block {
    /// Every matrix of the block.
    fn layers(&self) -> Vec<&Linear> {
        let mut layers = self.qkv.layers();
        layers.extend(self.gate_up.layers());
        layers.extend([&self.o, &self.down]);
        layers
    }

    fn mlp(&self, x: &Tensor, ffn: usize) -> Result<Tensor> {
        let (gate, up) = match &self.gate_up {
            GateUp::Separate { gate, up } => {
                let [gate, up] = Linear::forward_group([gate, up], x)?;
                (gate, up)
            }
            GateUp::Fused(gate_up) => {
                let y = gate_up.forward(x)?;
                (y.narrow(2, 0, ffn)?, y.narrow(2, ffn, ffn)?)
            }
        };
        self.down.forward(&glu::gated(Act::Silu, &gate, &up)?)
    }
}

/// The token table `w`, and the output layer tied to it unless the model has its own
/// (`untied`).
pub fn embedding(
    w: Weight,
    untied: bool,
    opts: &BuildOptions,
) -> LoadResult<(Embedding, Option<Linear>)> {
    if untied {
        let embed = Embedding::new(&w, opts.dtype).map_err(candle_err(EMBED))?;
        return Ok((embed, None));
    }
    let (embed, lm_head) = weights::tied(w, opts.format, opts.dtype).map_err(candle_err(EMBED))?;
    Ok((embed, Some(lm_head)))
}

/// The token table's name.
pub const EMBED: &str = "model.embed_tokens.weight";

/// Names the tensor in a candle error.
pub fn candle_err(name: &str) -> impl Fn(candle_core::Error) -> String + '_ {
    move |e| format!("tensor `{name}`: {e}")
}

/// Reads tensors by Hugging Face name, checking shapes against the config.
pub struct Loader<'a> {
    pub src: &'a mut dyn WeightSource,
    pub opts: &'a BuildOptions,
}

/// GGUF only: Llama 3.x's RoPE frequency divisors, as llama.cpp's converter stores them.
const ROPE_FREQS: &str = "rope_freqs.weight";
/// GGUF only: Phi-3's long-context ("su"/longrope) factors, which this code does not implement.
const LONG_ROPE: [&str; 2] = ["rope_factors_long.weight", "rope_factors_short.weight"];

impl Loader<'_> {
    pub fn weight(&mut self, name: &str, shape: &[usize]) -> LoadResult<Weight> {
        self.src.get(name, shape)
    }

    /// `{name}.weight`, shaped `(out, inp)`, and `{name}.bias` when `bias`.
    pub fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool) -> LoadResult<Linear> {
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

    /// `{name}.weight`, shaped `(size)`.
    pub fn norm(&mut self, name: &str, size: usize, eps: f64) -> LoadResult<RmsNorm> {
        let name = format!("{name}.weight");
        let w = self.weight(&name, &[size])?;
        let weight = w.dense(self.opts.dtype).map_err(candle_err(&name))?;
        Ok(RmsNorm {
            weight,
            eps: eps as f32,
        })
    }

    /// The RoPE frequency divisors: what the file stores (a GGUF's `rope_freqs`), else what
    /// config.json's `rope_scaling` implies.
    fn rope_factors(&mut self, cfg: &LlamaConfig) -> LoadResult<Option<Vec<f32>>> {
        if let Some(name) = LONG_ROPE.into_iter().find(|n| self.src.contains(n)) {
            return Err(format!(
                "tensor `{name}`: long-rope scaling (Phi-3 long-context models) is not \
                 implemented; only plain RoPE and Llama 3's `rope_freqs` factors are"
            ));
        }
        if !self.src.contains(ROPE_FREQS) {
            return cfg.rope_factors();
        }
        let w = self.weight(ROPE_FREQS, &[cfg.head_dim() / 2])?;
        let factors = w
            .dense(DType::F32)
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(candle_err(ROPE_FREQS))?;
        if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
            return Err(format!(
                "tensor `{ROPE_FREQS}` holds {bad}; frequency divisors must be positive"
            ));
        }
        Ok(Some(factors))
    }
}

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
}

impl Decoder {
    /// Loads every tensor from `src` with the blocks of `cfg.model_type`'s family; a missing or
    /// misshapen tensor is an error naming it.
    pub fn load(
        cfg: LlamaConfig,
        src: &mut dyn WeightSource,
        opts: BuildOptions,
    ) -> LoadResult<Self> {
        cfg.validate()?;
        let block: BlockLoader = match cfg.model_type.as_str() {
            "qwen3" => super::qwen3::block,
            "phi3" => super::phi3::block,
            _ => super::llama::block,
        };
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
            self.cfg.window(),
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
        let ids = Tensor::new(ids.as_slice(), &self.embed.device())?;
        let mut x = self.embed.forward(&ids)?.unsqueeze(0)?;
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
        if self.steps_in_place && !hidden && step::is_decode(seqs) {
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
        let ids = Tensor::new(ids, &self.embed.device())?;
        self.embed.forward(&ids)?.to_dtype(DType::F32)
    }

    fn max_context(&self) -> usize {
        self.max_context
    }

    fn architecture(&self) -> &str {
        &self.cfg.model_type
    }
}
