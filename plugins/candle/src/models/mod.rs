//! The models the plugin runs, behind one small trait.
//!
//! The plugin owns its model code (instead of candle-transformers') because the prefix cache needs
//! the KV state outside the model: every forward takes a `&mut KvState` that it extends, so a
//! caller can snapshot, crop and resume it. Weights are immutable after loading, so one model
//! serves many threads at once, each with its own state.

pub mod decoder;
pub mod gemma3;
pub mod glu;
pub mod idefics3;
mod llama;
pub mod norm;
mod phi3;
mod qwen3;
pub mod rope;
pub mod step;
pub mod vision;
pub mod whisper;

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device};

use candle_core::{Result, Tensor};

use crate::attention::{Attention, AttnParams, Hidden, RowKeys, Shared};
use crate::kv::{KvState, Prefix};
use crate::weights::{self, WeightFormat, WeightSource};
use lmhost_plugin_kit::multimodal::image_runs;

use decoder::{BlockLoader, Decoder, LlamaConfig, LoadResult};

/// The text architectures the plugin runs (option `model_class`, config.json `model_type`, GGUF
/// `general.architecture`): the Llama-shaped ones and Gemma 3.
pub fn text_architectures() -> Vec<&'static str> {
    let mut names: Vec<_> = LLAMA_SHAPED.iter().map(|(name, _)| *name).collect();
    names.push(gemma3::ARCHITECTURE);
    names
}

/// The `model_type`s (GGUF `general.architecture`s) the Llama-shaped [`Decoder`] runs, each
/// with what loads its family's blocks.
const LLAMA_SHAPED: &[(&str, BlockLoader)] = &[
    ("llama", llama::block),
    ("mistral", llama::block),
    ("qwen2", llama::block),
    ("smollm", llama::block),
    ("qwen3", qwen3::block),
    ("phi3", phi3::block),
];

/// Whether `model_type` is one the Llama-shaped [`Decoder`] runs.
pub fn is_llama_shaped(model_type: &str) -> bool {
    LLAMA_SHAPED.iter().any(|(name, _)| *name == model_type)
}

/// The Llama-shaped decoder of `cfg.model_type`'s family, every tensor from `src`.
pub fn load_decoder(
    cfg: LlamaConfig,
    src: &mut dyn WeightSource,
    opts: BuildOptions,
) -> LoadResult<Decoder> {
    let Some(&(_, block)) = LLAMA_SHAPED
        .iter()
        .find(|(name, _)| *name == cfg.model_type)
    else {
        return Err(format!(
            "unknown architecture {:?}; supported: {}",
            cfg.model_type,
            text_architectures().join(", ")
        ));
    };
    Decoder::load(cfg, block, src, opts)
}

/// How to build the model besides its config.
pub struct BuildOptions {
    pub dtype: DType,
    pub device: Device,
    pub format: WeightFormat,
    pub attention: Arc<dyn Attention>,
    /// Longest context to prepare RoPE tables for.
    pub max_context: usize,
    /// The most bytes the weights may take (None: no limit); see `crate::memory::fit`.
    pub memory_budget: Option<u64>,
    /// How states store keys and values: f32, or f16 (`kv_cache_dtype`).
    pub kv_dtype: DType,
}

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None: the pass only fills the KV state (a prompt prefix).
    None,
    /// The last position, to pick the next token from (a prompt's last row, a decode step):
    /// the output layer runs in its decode format ([`Seq::sampled`]).
    Last,
    /// Every position (scoring, equivalence tests).
    All,
}

/// What a forward pass returns.
pub struct Forward {
    /// `(positions, vocab)` in f32; `positions` is 0, 1 or the input length per [`Logits`].
    pub logits: Option<Tensor>,
    /// `(input length, hidden)`: the final (normalized) hidden states, when asked for.
    pub hidden: Option<Tensor>,
}

/// One sequence of a packed forward pass: `ids` run at positions `start..`, after the positions
/// `kv` holds or, with `share`, after positions taken from an earlier sequence of the pass.
pub struct Seq<'a> {
    pub ids: &'a [u32],
    /// Extended by the pass with the keys and values of `ids`.
    pub kv: &'a mut KvState,
    /// `(i, n)`: positions `0..n` are those of earlier sequence `i` of the same pass (their
    /// tokens agree), adopted layer by layer as `i` computes them; `kv` must be empty. This is
    /// how prompts of one batch share a prefix none of them has cached yet.
    pub share: Option<(usize, usize)>,
    /// Rows `logits_from..` of `ids` get logits (`ids.len()`: none).
    pub logits_from: usize,
    /// Keys hidden from some of its rows (a prompt scored with text hidden).
    pub hidden: Option<Hidden<'a>>,
    /// Its logits only pick the next token (a generation's prompt, a decode step), so the
    /// output layer may run in its decode format, as every sampled token's does. A pass whose
    /// logit rows all sample runs its output layer so; one that scores any row does not.
    pub sampled: bool,
}

impl Seq<'_> {
    /// The position of the sequence's first id.
    pub fn start(&self) -> usize {
        self.share.map_or(self.kv.len(), |(_, n)| n)
    }
}

/// A causal language model: ids in, logits out, attention state in a [`KvState`].
pub trait CausalLm: Send + Sync {
    /// Runs several sequences in one pass. The linear layers see all their rows at once, so the
    /// weights are read once per pass, not once per sequence; attention runs per sequence.
    /// Returns the logits each sequence asked for, and the final hidden states of all rows
    /// `(total rows, hidden)` when `hidden` is set.
    fn forward_packed(
        &self,
        seqs: &mut [Seq<'_>],
        hidden: bool,
    ) -> Result<(Vec<Option<Tensor>>, Option<Tensor>)>;

    /// Runs `ids` at positions `kv.len()..`, appending their keys and values to `kv`.
    fn forward(
        &self,
        ids: &[u32],
        kv: &mut KvState,
        logits: Logits,
        hidden: bool,
    ) -> Result<Forward> {
        let logits_from = match logits {
            Logits::None => ids.len(),
            Logits::Last => ids.len().saturating_sub(1),
            Logits::All => 0,
        };
        let mut seq = [Seq {
            ids,
            kv,
            share: None,
            logits_from,
            hidden: None,
            sampled: logits == Logits::Last,
        }];
        let (mut logits, hidden) = self.forward_packed(&mut seq, hidden)?;
        Ok(Forward {
            logits: logits.pop().flatten(),
            hidden,
        })
    }
    /// A fresh, empty state for this model.
    fn new_state(&self) -> KvState;
    /// The input-embedding rows of `ids`, `(ids.len(), hidden)` in f32.
    fn embed(&self, ids: &[u32]) -> Result<Tensor>;
    /// The longest sequence the model was built for.
    fn max_context(&self) -> usize;
    /// The architecture name (`llama`, `mistral`, `qwen2`...).
    fn architecture(&self) -> &str;
}

/// How a layer's weight is split across devices for tensor parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpStyle {
    /// Split the output features: each device computes a slice of the output.
    Colwise,
    /// Split the input features: each device computes a partial sum, then all-reduce.
    Rowwise,
}

impl TpStyle {
    /// Parses a style name; only the two styles engines implement are valid.
    pub fn parse(name: &str) -> std::result::Result<Self, String> {
        match name {
            "colwise" => Ok(TpStyle::Colwise),
            "rowwise" => Ok(TpStyle::Rowwise),
            other => Err(format!(
                "tensor-parallel style {other:?} is not one of \"colwise\", \"rowwise\""
            )),
        }
    }
}

/// One block of a pipeline plan: its name, input names and output names.
pub type PipelineStage = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

/// Checks a declared tensor-parallel plan: every style is colwise or rowwise.
pub fn validate_tp_plan(
    plan: &[(&str, &str)],
) -> std::result::Result<Vec<(String, TpStyle)>, String> {
    plan.iter()
        .map(|(pattern, style)| {
            TpStyle::parse(style)
                .map(|s| (pattern.to_string(), s))
                .map_err(|e| format!("{pattern}: {e}"))
        })
        .collect()
}

/// Mean over the rows of a `(n, d)` tensor, as a vector.
pub fn mean_rows(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(candle_core::DType::F32)?
        .mean(0)?
        .to_vec1::<f32>()
}

/// Concatenates tensors along the first axis, or none.
pub fn cat_rows(parts: &[Tensor]) -> Result<Option<Tensor>> {
    if parts.is_empty() {
        return Ok(None);
    }
    Tensor::cat(parts, 0).map(Some)
}

/// The rows of a packed pass: each sequence's start position, and every row's id and position
/// in order.
pub struct PackedRows {
    pub starts: Vec<usize>,
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
}

impl PackedRows {
    /// Read before layer 0 grows the states; refuses bad shares ([`check_shares`]) and a
    /// position at or past `max_context`.
    pub fn of(seqs: &[Seq<'_>], max_context: usize) -> Result<Self> {
        let starts = check_shares(seqs)?;
        let ids = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
        let positions: Vec<u32> = seqs
            .iter()
            .zip(&starts)
            .flat_map(|(s, &start)| (start..start + s.ids.len()).map(|p| p as u32))
            .collect();
        if let Some(&last) = positions.iter().max() {
            if last as usize >= max_context {
                candle_core::bail!(
                    "position {last} is past the model's context of {max_context} tokens"
                );
            }
        }
        Ok(PackedRows {
            starts,
            ids,
            positions,
        })
    }
}

/// What a pass's queries see besides the earlier keys of their own sequence.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mask {
    /// Keys further back than this are out of sight.
    pub sliding_window: Option<usize>,
    /// Each image's tokens see each other whole (Gemma 3), not only the earlier ones (Idefics3
    /// attends to them as to text).
    pub images_whole: bool,
}

/// Attention of every sequence of a packed pass, each sequence's queries against its own keys.
/// `q`, `k`, `v` are `(1, heads, rows, head_dim)` over all rows of the pass (q and k already
/// rotated); each sequence's keys and values are appended to its state at `layer`, after it
/// adopts the prefix it shares with an earlier sequence. A decode pass (one row per sequence,
/// inside [`weights::generating`]) takes all rows in one [`Attention::forward_rows`]; every other
/// pass one `forward` per sequence, so that prompts and scores never depend on it, except that
/// the sequences continuing one prefix where it lies ([`KvState::after`]) go through one
/// [`Attention::forward_shared`] together. Returns `(1, rows, heads * head_dim)`.
pub fn attend_packed(
    attention: &dyn Attention,
    layer: usize,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    seqs: &mut [Seq<'_>],
    starts: &[usize],
    scale: f64,
    mask: Mask,
) -> Result<Tensor> {
    let (_, nh, rows, d) = q.dims4()?;
    let n_rep = nh / k.dim(1)?;
    let decode = weights::is_generating() && seqs.iter().all(|s| s.ids.len() == 1);
    // Where each image's tokens see each other whole, an image must run whole in one pass; its
    // closing marker always follows it, so a run that reaches a pass's end was cut there.
    let blocks: Vec<Vec<Range<usize>>> = (seqs.iter().zip(starts))
        .map(|(s, &start)| match mask.images_whole {
            true => image_runs(s.ids, start),
            false => Vec::new(),
        })
        .collect();
    for (s, runs) in seqs.iter().zip(&blocks) {
        if runs
            .last()
            .is_some_and(|r| r.end == s.start() + s.ids.len())
        {
            candle_core::bail!("a prompt's pass ends inside an image, whose tokens must run whole");
        }
    }
    let mut outs: Vec<Option<Tensor>> = vec![None; seqs.len()];
    let mut states = Vec::with_capacity(seqs.len());
    // Sequences continuing one prefix where it lies, by the prefix they read.
    let mut groups: Vec<(Prefix, Vec<Pending<'_>>)> = Vec::new();
    let mut row = 0;
    for (j, &offset) in starts.iter().enumerate() {
        let (earlier, rest) = seqs.split_at_mut(j);
        let seq = &mut rest[0];
        let n = seq.ids.len();
        if let Some((i, shared)) = seq.share {
            seq.kv.adopt(layer, earlier[i].kv, shared)?;
        }
        let parts = seq
            .kv
            .append_parts(layer, &k.narrow(2, row, n)?, &v.narrow(2, row, n)?)?;
        let params = AttnParams {
            scale,
            n_rep,
            offset,
            sliding_window: mask.sliding_window,
            hidden: seq.hidden,
            blocks: &blocks[j],
        };
        let q_rows = || q.narrow(2, row, n)?.contiguous();
        match parts.prefix {
            Some(prefix) if !decode => {
                let item = (j, q_rows()?, parts.k, parts.v, params);
                match groups.iter_mut().find(|(p, _)| p.id == prefix.id) {
                    Some((_, items)) => items.push(item),
                    None => groups.push((prefix, vec![item])),
                }
            }
            _ => {
                let (k, v) = parts.whole()?;
                // Keys and values stored in f16 are attended to in the queries' dtype (the
                // in-place decode step reads them where they lie instead).
                let (k, v) = (k.to_dtype(q.dtype())?, v.to_dtype(q.dtype())?);
                if decode {
                    states.push((k, v, params));
                } else {
                    outs[j] = Some(attention.forward(&q_rows()?, &k, &v, &params)?);
                }
            }
        }
        row += n;
    }
    attend_groups(attention, &groups, &mut outs)?;
    let y = if decode {
        let keys: Vec<RowKeys<'_>> = states
            .iter()
            .map(|(k, v, params)| RowKeys {
                k,
                v,
                params: *params,
            })
            .collect();
        attention.forward_rows(q, &keys)?
    } else {
        let outs: Option<Vec<Tensor>> = outs.into_iter().collect();
        let outs =
            outs.ok_or_else(|| candle_core::Error::Msg("a sequence had no attention".into()))?;
        Tensor::cat(&outs, 2)?
    };
    y.transpose(1, 2)?.reshape((1, rows, nh * d))
}

/// A sequence of a pass waiting for its group's attention: its index in the pass, its queries,
/// its own keys and values, and how its queries see them.
type Pending<'p> = (usize, Tensor, Tensor, Tensor, AttnParams<'p>);

/// One [`Attention::forward_shared`] per group of sequences continuing one prefix, each output
/// into `outs` at its sequence's index.
fn attend_groups(
    attention: &dyn Attention,
    groups: &[(Prefix, Vec<Pending<'_>>)],
    outs: &mut [Option<Tensor>],
) -> Result<()> {
    for (prefix, items) in groups {
        let shared: Vec<Shared<'_>> = items
            .iter()
            .map(|(_, q, k, v, params)| Shared {
                q,
                k,
                v,
                params: *params,
            })
            .collect();
        let out = attention.forward_shared((&prefix.k, &prefix.v), &shared)?;
        for ((j, ..), out) in items.iter().zip(out) {
            outs[*j] = Some(out);
        }
    }
    Ok(())
}

/// Each sequence's start position, after checking that every share points at an earlier
/// sequence, covers only positions that sequence will hold, and lands in an empty state.
fn check_shares(seqs: &[Seq<'_>]) -> Result<Vec<usize>> {
    let starts: Vec<usize> = seqs.iter().map(Seq::start).collect();
    for (j, seq) in seqs.iter().enumerate() {
        if seq.ids.is_empty() {
            candle_core::bail!("sequence {j} of a packed pass has no ids");
        }
        if let Some((i, n)) = seq.share {
            if i >= j || n > starts[i] + seqs[i].ids.len() || !seq.kv.is_empty() {
                candle_core::bail!("sequence {j} cannot take {n} positions from sequence {i}");
            }
        }
    }
    Ok(starts)
}

/// Each sequence's logits (f32) for the rows it asked for: those rows of `states`, the final
/// hidden states of a packed pass, go through the output layer `head` together.
pub fn packed_logits(
    seqs: &[Seq<'_>],
    states: &Tensor,
    head: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Vec<Option<Tensor>>> {
    let mut wanted = Vec::new();
    // Whether every row asked for only picks a next token.
    let mut sampled = true;
    let mut row = 0;
    for seq in seqs {
        let n = seq.ids.len();
        let from = seq.logits_from.min(n);
        if from < n {
            wanted.push(states.narrow(0, row + from, n - from)?);
            sampled &= seq.sampled;
        }
        row += n;
    }
    let logits = cat_rows(&wanted)?
        .map(|rows| {
            // Gemma 3's output layer is 262144 x 640: 670 MB in f32 for a prompt's one
            // sampled row, 178 MB in its stored Q8_0 (however the prompt's other layers ran).
            let logits = if sampled {
                crate::weights::generating(|| head(&rows))
            } else {
                head(&rows)
            };
            logits?.to_dtype(candle_core::DType::F32)
        })
        .transpose()?;
    let mut at = 0;
    seqs.iter()
        .map(|seq| {
            let count = seq.ids.len() - seq.logits_from.min(seq.ids.len());
            match &logits {
                Some(all) if count > 0 => {
                    at += count;
                    all.narrow(0, at - count, count).map(Some)
                }
                _ => Ok(None),
            }
        })
        .collect()
}
