//! A decode pass over buffers kept between passes: the families' decode steps in place.
//!
//! A decode pass through candle's ops makes a tensor per op (each a few heap allocations: its
//! storage, shape and strides), some 5400 allocations a SmolLM2 token, and copies keys and
//! values into views. Where every matrix of a model decodes through our kernels (`weights =
//! auto`, `compact` or `mixed` on CPU in f32) and attention is a built-in implementation (an
//! application's own, `attention::register`, is called for every pass), its step instead runs
//! over a [`Workspace`] of f32 buffers that a thread keeps from pass to pass, writes each
//! position's keys and values into its state's buffer in place ([`KvState::push`]) and attends
//! to them where they lie ([`crate::attention::decode::states`]): nothing is allocated per
//! layer, only the logits handed back. Each value is computed with the op-by-op pass's
//! operations in the same order (candle's CPU norms, RoPE and soft-cap written out; our kernels
//! and attention heads shared), so the two agree bit for bit (`tests/decode_in_place.rs`).

use candle_core::{DType, Result, Tensor};

use super::norm::RmsNorm;
use super::rope::Rope;
use super::BuildOptions;
use super::Seq;
use crate::attention::decode;
use crate::kernels::Scratch;
use crate::kv::KvState;
use crate::weights::{Embedding, Linear};

/// A decode pass's buffers, each grown to the largest pass seen, never shrunk.
#[derive(Default)]
pub struct Workspace {
    /// The residual stream, `(rows, hidden)`.
    x: Vec<f32>,
    /// A normalized copy of it (a matmul's input).
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Attention's output, shaped as `q`.
    attn: Vec<f32>,
    /// A block's output before the residual add, `(rows, hidden)`.
    out: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The gated activations, `(rows, intermediate)`.
    act: Vec<f32>,
    /// The output of a fused matrix (Phi-3's qkv, gate_up) before it is split.
    fused: Vec<f32>,
    logits: Vec<f32>,
    /// Each row's position (its state's length before the pass).
    positions: Vec<usize>,
    scratch: Scratch,
}

impl Workspace {
    /// Runs `f` with this thread's workspace (a new one if a call further up this thread's
    /// stack holds it: a pool thread waiting in a parallel region may run another pass).
    pub fn with<R>(f: impl FnOnce(&mut Workspace) -> R) -> R {
        thread_local! {
            static SPARE: std::cell::Cell<Option<Box<Workspace>>> =
                const { std::cell::Cell::new(None) };
        }
        let mut ws = SPARE.take().unwrap_or_default();
        let result = f(&mut ws);
        SPARE.set(Some(ws));
        result
    }
}

/// A model's widths, which size a pass's buffers.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
}

/// A pass's buffers ([`Workspace`]'s, each sized for its rows), its input rows looked up.
pub struct Pass<'w> {
    pub x: &'w mut [f32],
    pub normed: &'w mut [f32],
    pub q: &'w mut [f32],
    pub k: &'w mut [f32],
    pub v: &'w mut [f32],
    pub attn: &'w mut [f32],
    pub out: &'w mut [f32],
    pub gate: &'w mut [f32],
    pub up: &'w mut [f32],
    pub act: &'w mut [f32],
    pub fused: &'w mut Vec<f32>,
    pub logits: &'w mut [f32],
    pub positions: &'w [usize],
    pub scratch: &'w mut Scratch,
    dims: Dims,
}

impl Workspace {
    /// The buffers of a decode pass over `seqs`, each row's token looked up in `embed` and its
    /// position read before the pass grows the states (one at or past `max_context` is
    /// refused, as [`super::PackedRows::of`] does).
    pub fn pass<'w>(
        &'w mut self,
        seqs: &[Seq<'_>],
        dims: Dims,
        max_context: usize,
        embed: &Embedding,
    ) -> Result<Pass<'w>> {
        let m = seqs.len();
        let Dims {
            hidden: h,
            heads,
            kv_heads,
            head_dim: d,
            ffn,
            vocab,
        } = dims;
        self.positions.clear();
        self.positions.extend(seqs.iter().map(|s| s.kv.len()));
        if let Some(&last) = self.positions.iter().max().filter(|&&p| p >= max_context) {
            candle_core::bail!(
                "position {last} is past the model's context of {max_context} tokens"
            );
        }
        let x = sized(&mut self.x, m * h);
        for (seq, row) in seqs.iter().zip(x.chunks_exact_mut(h)) {
            let id = seq.ids[0];
            if !embed.row_into(id, row)? {
                let ids = Tensor::new(&[id], &embed.device())?;
                row.copy_from_slice(&embed.forward(&ids)?.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        Ok(Pass {
            x,
            normed: sized(&mut self.normed, m * h),
            q: sized(&mut self.q, m * heads * d),
            k: sized(&mut self.k, m * kv_heads * d),
            v: sized(&mut self.v, m * kv_heads * d),
            attn: sized(&mut self.attn, m * heads * d),
            out: sized(&mut self.out, m * h),
            gate: sized(&mut self.gate, m * ffn),
            up: sized(&mut self.up, m * ffn),
            act: sized(&mut self.act, m * ffn),
            fused: &mut self.fused,
            logits: sized(&mut self.logits, m * vocab),
            positions: &self.positions,
            scratch: &mut self.scratch,
            dims,
        })
    }
}

impl Pass<'_> {
    /// Layer `layer`'s attention for every row: its k and v (rotated) appended to its state,
    /// then its q against the state's keys, seen through `window`, into `attn`.
    pub fn attend(
        &mut self,
        seqs: &mut [Seq<'_>],
        (layer, window, scale): (usize, Option<usize>, f32),
    ) -> Result<()> {
        let dims = self.dims;
        push_rows(seqs, layer, (self.k, self.v), dims.kv_heads)?;
        let shape = decode::Shape {
            heads: dims.heads,
            n_rep: dims.heads / dims.kv_heads.max(1),
            d: dims.head_dim,
        };
        let at = (layer, window, scale);
        decode::states(
            self.q,
            self.attn,
            shape,
            at,
            self.positions,
            &state_of(seqs),
        )
        .ok_or_else(|| candle_core::Error::Msg("keys not f32 on CPU".into()))
    }

    /// The final norm of every row, then the output layer into `logits`.
    pub fn output(&mut self, norm: &RmsNorm, head: &Linear) -> Result<()> {
        norm.forward_into(self.x, self.normed)?;
        let (input, logits) = ((&*self.normed, self.dims.hidden), &mut *self.logits);
        Linear::decode_into(&[head], input, &mut [logits], self.scratch)
    }
}

/// Whether a model built with `opts` decodes in place: in f32 on CPU, through a built-in
/// attention ([`crate::attention::Attention::rows_in_place`]), and every matrix of `layers`
/// (all the model's) through our kernels ([`Linear::decodes_in_place`]).
pub fn runs_in_place<'l>(
    opts: &BuildOptions,
    mut layers: impl Iterator<Item = &'l Linear>,
) -> bool {
    opts.dtype == DType::F32
        && opts.device.is_cpu()
        && opts.attention.rows_in_place()
        && layers.all(Linear::decodes_in_place)
}

/// The first `len` values of `buf`, grown (zeroed) if it is shorter.
pub fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// Whether a packed pass is a decode pass the in-place step runs: one sampled row per
/// sequence after its own state, nothing hidden or shared (and at least one sequence).
pub fn is_decode(seqs: &[Seq<'_>]) -> bool {
    crate::weights::is_generating()
        && !seqs.is_empty()
        && seqs.iter().all(|s| {
            s.ids.len() == 1
                && s.share.is_none()
                && s.hidden.is_none()
                && s.logits_from == 0
                && s.sampled
        })
}

/// `x += y`.
pub fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
}

/// Copies each row of `fused`, `(rows, Σ widths)`, into `outs` by column ranges: a fused
/// matrix's output (q, k, v; gate, up) split as the separate matrices would give it.
pub fn split_rows(fused: &[f32], outs: &mut [&mut [f32]], widths: &[usize]) {
    let total: usize = widths.iter().sum();
    for (r, row) in fused.chunks_exact(total).enumerate() {
        let mut at = 0;
        for (out, &w) in outs.iter_mut().zip(widths) {
            out[r * w..(r + 1) * w].copy_from_slice(&row[at..at + w]);
            at += w;
        }
    }
}

/// Rotates each row's q and k heads at its position.
pub fn rotate(rope: &Rope, positions: &[usize], q: &mut [f32], k: &mut [f32]) -> Result<()> {
    let rows = positions.len().max(1);
    let (qw, kw) = (q.len() / rows, k.len() / rows);
    for ((&at, q), k) in positions
        .iter()
        .zip(q.chunks_exact_mut(qw))
        .zip(k.chunks_exact_mut(kw))
    {
        rope.rotate(q, at)
            .and_then(|()| rope.rotate(k, at))
            .ok_or_else(|| candle_core::Error::Msg(format!("no RoPE angles for position {at}")))?;
    }
    Ok(())
}

/// Each row's keys and values, `(rows, kv_heads · d)`, appended to its state at `layer`.
fn push_rows(
    seqs: &mut [Seq<'_>],
    layer: usize,
    (k, v): (&[f32], &[f32]),
    kv_heads: usize,
) -> Result<()> {
    let width = k.len() / seqs.len().max(1);
    for ((seq, k), v) in seqs
        .iter_mut()
        .zip(k.chunks_exact(width))
        .zip(v.chunks_exact(width))
    {
        seq.kv.push(layer, (k, v), kv_heads)?;
    }
    Ok(())
}

/// The state of each row, for [`decode::states`].
fn state_of<'a>(seqs: &'a [Seq<'_>]) -> impl Fn(usize) -> &'a KvState + Sync + 'a {
    move |r| &*seqs[r].kv
}

/// Each row's logits (`(rows, vocab)` in `logits`) as the tensor a packed pass returns.
pub fn logits_out(logits: &[f32], rows: usize) -> Result<Vec<Option<Tensor>>> {
    let vocab = logits.len() / rows.max(1);
    let mut out = Vec::with_capacity(rows);
    for row in logits.chunks_exact(vocab) {
        out.push(Some(Tensor::from_slice(
            row,
            (1, vocab),
            &candle_core::Device::Cpu,
        )?));
    }
    Ok(out)
}
