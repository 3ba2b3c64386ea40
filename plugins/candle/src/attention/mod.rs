//! Attention through a registry of named implementations.
//!
//! Models never call a kernel directly: each attention layer looks up the implementation chosen
//! by option `attn_implementation` (as Transformers' `ALL_ATTENTION_FUNCTIONS` does), so an engine
//! or an embedding application can swap in its own kernel with [`register`] without touching the
//! model code. Every implementation must give the same output within float tolerance (tested).

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, OnceLock, RwLock};

use candle_core::{Device, Result, Tensor, D};

pub mod decode;
pub mod fused;
mod ops;

/// What an attention call needs besides q, k and v.
#[derive(Debug, Clone, Copy)]
pub struct AttnParams<'a> {
    /// Multiplier of q·k (usually 1/sqrt(head_dim)).
    pub scale: f64,
    /// Query heads per key/value head (grouped-query attention).
    pub n_rep: usize,
    /// Position of the first query (keys start at position 0).
    pub offset: usize,
    /// Keys further back than this many positions are invisible (Mistral-style).
    pub sliding_window: Option<usize>,
    /// Keys hidden from some queries besides (explain's `hide` absence); an implementation
    /// must honour it as the mask of [`hidden_mask`] does.
    pub hidden: Option<Hidden<'a>>,
    /// Runs of positions that see each other whole (one image's tokens, as Gemma 3 attends
    /// to them): a query in a run sees every key of its run, later ones too, as
    /// [`hidden_mask`] does. A run lies within this call's queries.
    pub blocks: &'a [Range<usize>],
}

/// Key positions `keys` are invisible to the queries at positions `from..`: the reply rows of
/// a prompt scored with some of its text hidden (the plugin API's `score_hidden`).
#[derive(Debug, Clone, Copy)]
pub struct Hidden<'a> {
    pub from: usize,
    pub keys: &'a [Range<usize>],
}

/// An attention kernel: `q` is `(1, heads, q_len, head_dim)`, `k` and `v` are
/// `(1, kv_heads, kv_len, head_dim)` with `kv_len = offset + q_len`; returns q's shape. `k` and
/// `v` are usually views of the [`crate::kv::KvState`]'s larger buffers, so they are not
/// contiguous across heads.
pub trait Attention: Send + Sync {
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams<'_>) -> Result<Tensor>;

    /// A decode pass: row `i` of `q` `(1, heads, rows, head_dim)` is the one query of sequence
    /// `i`, against that sequence's own keys and values `rows[i]`. Returns q's shape. By default
    /// one [`Attention::forward`] per row.
    fn forward_rows(&self, q: &Tensor, rows: &[RowKeys<'_>]) -> Result<Tensor> {
        each_row(self, q, rows)
    }

    /// Whether [`Attention::forward_rows`] is the built-in decode loop (`decode.rs`), which a
    /// decode pass in place (`models/step.rs`) then runs over the states' buffers itself. An
    /// implementation of its own leaves this false, and every decode pass calls it.
    fn rows_in_place(&self) -> bool {
        false
    }

    /// Attention of sequences of a pass that continue one prefix: `prefix` is its keys and
    /// values `(1, kv_heads, P, head_dim)` where the state that holds them lies, and each item
    /// has its queries, its own keys and values (positions `P..`) and its params (offset at
    /// least `P`). Keys and values may be stored in another dtype than the queries (an f16
    /// state). Returns each item's output shaped as its `q`. By default each item's keys are
    /// copied after the prefix and [`Attention::forward`] runs on them.
    fn forward_shared(
        &self,
        prefix: (&Tensor, &Tensor),
        items: &[Shared<'_>],
    ) -> Result<Vec<Tensor>> {
        by_copy(self, prefix, items)
    }
}

/// [`Attention::forward_shared`] with each item's keys and values copied after the prefix.
fn by_copy<A: Attention + ?Sized>(
    attention: &A,
    (k, v): (&Tensor, &Tensor),
    items: &[Shared<'_>],
) -> Result<Vec<Tensor>> {
    items
        .iter()
        .map(|item| {
            let whole = |prefix: &Tensor, own: &Tensor| {
                Tensor::cat(&[prefix, own], 2)?.to_dtype(item.q.dtype())
            };
            let (k, v) = (whole(k, item.k)?, whole(v, item.v)?);
            attention.forward(item.q, &k, &v, &item.params)
        })
        .collect()
}

/// One sequence of [`Attention::forward_shared`]: its queries `(1, heads, n, head_dim)`, its own
/// keys and values after the shared prefix, and how its queries see them.
pub struct Shared<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub params: AttnParams<'a>,
}

/// One sequence of a decode pass: its keys and values (as for [`Attention::forward`]) and how
/// its single query sees them.
pub struct RowKeys<'a> {
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub params: AttnParams<'a>,
}

/// [`Attention::forward_rows`] one row at a time.
fn each_row<A: Attention + ?Sized>(
    attention: &A,
    q: &Tensor,
    rows: &[RowKeys<'_>],
) -> Result<Tensor> {
    let outs = rows
        .iter()
        .enumerate()
        .map(|(i, r)| attention.forward(&q.narrow(2, i, 1)?.contiguous()?, r.k, r.v, &r.params))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&outs, 2)
}

/// The built-in implementations' decode rows: [`decode::rows`] where it applies, else
/// [`each_row`].
fn built_in_rows<A: Attention + ?Sized>(
    attention: &A,
    q: &Tensor,
    rows: &[RowKeys<'_>],
) -> Result<Tensor> {
    match decode::rows(q, rows)? {
        Some(out) => Ok(out),
        None => each_row(attention, q, rows),
    }
}

type Registry = RwLock<BTreeMap<String, Arc<dyn Attention>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut map: BTreeMap<String, Arc<dyn Attention>> = BTreeMap::new();
        map.insert("sdpa".into(), Arc::new(Sdpa));
        map.insert("sdpa_bf16".into(), Arc::new(SdpaBf16));
        map.insert("eager".into(), Arc::new(Eager::default()));
        map.insert("chunked".into(), Arc::new(Chunked { chunk: 128 }));
        RwLock::new(map)
    })
}

/// Registers (or replaces) an implementation under `name`.
pub fn register(name: &str, implementation: Arc<dyn Attention>) {
    if let Ok(mut map) = registry().write() {
        map.insert(name.to_string(), implementation);
    }
}

/// The implementation registered under `name`.
pub fn get(name: &str) -> Option<Arc<dyn Attention>> {
    registry().read().ok()?.get(name).cloned()
}

/// Every registered name, sorted.
pub fn names() -> Vec<String> {
    registry()
        .read()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// The additive-mask decision: may query `qi` (absolute position) see key `kj`, which
/// `hidden` (when set) says is one of the hidden keys? `same_block`: both lie in one run of
/// [`AttnParams::blocks`].
fn visible(
    (qi, kj): (usize, usize),
    window: Option<usize>,
    hidden: Option<(usize, bool)>,
    same_block: bool,
) -> bool {
    (same_block || (kj <= qi && window.is_none_or(|w| qi - kj < w)))
        && hidden.is_none_or(|(from, hidden)| qi < from || !hidden)
}

/// `(q_len, kv_len)` u8 mask for queries at `offset..`, 1 where the key is hidden; `None` when
/// nothing is hidden.
pub fn hidden_mask(
    q_len: usize,
    offset: usize,
    kv_len: usize,
    p: &AttnParams<'_>,
    device: &Device,
) -> Result<Option<Tensor>> {
    // Which keys are hidden, and which run each position lies in, looked up once per key
    // rather than once per query and key.
    let mut hidden_keys = vec![false; kv_len];
    for r in p.hidden.iter().flat_map(|h| h.keys) {
        hidden_keys[r.start.min(kv_len)..r.end.min(kv_len)].fill(true);
    }
    let mut block_of = vec![usize::MAX; kv_len];
    for (b, r) in p.blocks.iter().enumerate() {
        block_of[r.start.min(kv_len)..r.end.min(kv_len)].fill(b);
    }
    let from = p.hidden.map(|h| h.from);
    let block_of = &block_of;
    let mask: Vec<u8> = (0..q_len)
        .flat_map(|i| {
            let hidden_keys = &hidden_keys;
            let qi = offset + i;
            let q_block = block_of.get(qi).copied().unwrap_or(usize::MAX);
            (0..kv_len).map(move |j| {
                let hidden = from.map(|from| (from, hidden_keys[j]));
                let same_block = q_block != usize::MAX && block_of[j] == q_block;
                u8::from(!visible((qi, j), p.sliding_window, hidden, same_block))
            })
        })
        .collect();
    if mask.iter().all(|&m| m == 0) {
        return Ok(None);
    }
    Tensor::from_vec(mask, (q_len, kv_len), device).map(Some)
}

/// Sets hidden scores to -inf (the same op sequence as candle-transformers' llama models).
fn apply_mask(scores: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    match mask {
        None => Ok(scores.clone()),
        Some(mask) => {
            let neg_inf =
                Tensor::new(f32::NEG_INFINITY, scores.device())?.to_dtype(scores.dtype())?;
            let mask = mask.broadcast_as(scores.shape())?;
            mask.where_cond(&neg_inf.broadcast_as(scores.shape())?, scores)
        }
    }
}

/// Keys are padded (hidden, zero values) to a multiple of this many positions. A query's softmax
/// and weighted sum then run over the same SIMD lanes and GEMM tails whatever the number of real
/// keys, so a row's output does not depend on how its prompt was split into forward passes: a
/// prefix restored from the cache gives bit-identical results to computing it in one pass.
pub const KEY_ALIGN: usize = 64;

/// `(1, kvh, L, d)` → `(1, kvh, L', d)` with `L'` the next multiple of `align`.
fn pad_keys(x: &Tensor, align: usize) -> Result<Tensor> {
    let len = x.dim(2)?;
    let pad = len.next_multiple_of(align.max(1)) - len;
    if pad == 0 {
        return Ok(x.clone());
    }
    x.pad_with_zeros(2, 0, pad)
}

/// Softmax(q kᵀ · scale + mask) v, materializing the whole score matrix; the reference.
/// `key_align: 1` (no padding) is candle-transformers' attention, each key/value head shared
/// by its query heads instead of repeated.
pub struct Eager {
    pub key_align: usize,
}

impl Default for Eager {
    fn default() -> Self {
        Eager {
            key_align: KEY_ALIGN,
        }
    }
}

impl Attention for Eager {
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams<'_>) -> Result<Tensor> {
        let (b, heads, q_len, d) = q.dims4()?;
        let kv_heads = k.dim(1)?;
        // Each key/value head meets its group of query heads as one matrix of n_rep · q_len
        // rows, so the keys are copied once (padded), not once per query head.
        let k = pad_keys(k, self.key_align)?.contiguous()?;
        let v = pad_keys(v, self.key_align)?.contiguous()?;
        let kv_len = k.dim(2)?;
        let grouped = q.contiguous()?.reshape((b, kv_heads, p.n_rep * q_len, d))?;
        let scores = (grouped.matmul(&k.t()?)? * p.scale)?;
        let scores = scores.reshape((b, kv_heads, p.n_rep, q_len, kv_len))?;
        let mask = hidden_mask(q_len, p.offset, kv_len, p, q.device())?;
        let scores = apply_mask(&scores, mask.as_ref())?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?.reshape((
            b,
            kv_heads,
            p.n_rep * q_len,
            kv_len,
        ))?;
        probs.matmul(&v)?.reshape((b, heads, q_len, d))
    }

    fn forward_rows(&self, q: &Tensor, rows: &[RowKeys<'_>]) -> Result<Tensor> {
        built_in_rows(self, q, rows)
    }

    fn rows_in_place(&self) -> bool {
        true
    }
}

/// The default: [`fused`] where it applies (f32 on CPU), so that sequences continuing a cached
/// prefix attend to it where it lies; elsewhere [`Eager`]'s ops.
pub struct Sdpa;

impl Attention for Sdpa {
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams<'_>) -> Result<Tensor> {
        let item = Shared {
            q,
            k,
            v,
            params: *p,
        };
        match fused::attend(None, std::slice::from_ref(&item), false)?.and_then(|mut out| out.pop())
        {
            Some(out) => Ok(out),
            None => Eager::default().forward(q, k, v, p),
        }
    }

    fn forward_shared(
        &self,
        prefix: (&Tensor, &Tensor),
        items: &[Shared<'_>],
    ) -> Result<Vec<Tensor>> {
        match fused::attend(Some(prefix), items, false)? {
            Some(out) => Ok(out),
            None => by_copy(self, prefix, items),
        }
    }

    fn forward_rows(&self, q: &Tensor, rows: &[RowKeys<'_>]) -> Result<Tensor> {
        built_in_rows(self, q, rows)
    }

    fn rows_in_place(&self) -> bool {
        true
    }
}

/// [`Sdpa`], except that sequences continuing a shared prefix attend to it in bf16 products
/// with f32 sums where the CPU has AVX-512 BF16 (f32 elsewhere): `weights = "bf16"`'s choice
/// for `sdpa`, so that explaining under `hide`, whose coalitions all attend to the cached
/// context, runs at the rate of those products (its weights, rounded to bf16 next, from
/// exponentials within 6e-6, in one online softmax with the row's own keys). The rows' own
/// keys stay f32, so a row scored
/// after a cached prefix differs from the same row scored whole by that rounding. (Bf16
/// attention to a long prompt's own keys as well gained little and moved explain's values
/// half as far again.) A generation attends in f32, as under `sdpa`.
pub struct SdpaBf16;

impl Attention for SdpaBf16 {
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams<'_>) -> Result<Tensor> {
        Sdpa.forward(q, k, v, p)
    }

    fn forward_shared(
        &self,
        prefix: (&Tensor, &Tensor),
        items: &[Shared<'_>],
    ) -> Result<Vec<Tensor>> {
        let bf16 = !crate::weights::is_generating();
        match fused::attend(Some(prefix), items, bf16)? {
            Some(out) => Ok(out),
            None => by_copy(self, prefix, items),
        }
    }

    fn forward_rows(&self, q: &Tensor, rows: &[RowKeys<'_>]) -> Result<Tensor> {
        built_in_rows(self, q, rows)
    }

    fn rows_in_place(&self) -> bool {
        true
    }
}

/// Processes queries in chunks and shares each key/value head across its query group without
/// copying it, so a long prefill never holds a `(heads, L, L)` score matrix or repeated keys.
pub struct Chunked {
    pub chunk: usize,
}

impl Attention for Chunked {
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor, p: &AttnParams<'_>) -> Result<Tensor> {
        let (b, heads, q_len, d) = q.dims4()?;
        let kv_heads = k.dim(1)?;
        let kt = pad_keys(k, KEY_ALIGN)?.t()?.contiguous()?;
        let v = pad_keys(v, KEY_ALIGN)?.contiguous()?;
        let mut outs = Vec::new();
        for start in (0..q_len).step_by(self.chunk.max(1)) {
            let len = self.chunk.min(q_len - start);
            // (1, kvh, n_rep * len, d): rows are (rep, position) within each kv head.
            let qc =
                q.narrow(2, start, len)?
                    .contiguous()?
                    .reshape((b, kv_heads, p.n_rep * len, d))?;
            let scores = (qc.matmul(&kt)? * p.scale)?;
            let kv_len = kt.dim(D::Minus1)?;
            let scores = scores.reshape((b, kv_heads, p.n_rep, len, kv_len))?;
            let mask = hidden_mask(len, p.offset + start, kv_len, p, q.device())?;
            let scores = apply_mask(&scores, mask.as_ref())?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?.reshape((
                b,
                kv_heads,
                p.n_rep * len,
                kv_len,
            ))?;
            let out = probs.matmul(&v)?.reshape((b, heads, len, d))?;
            outs.push(out);
        }
        Tensor::cat(&outs, 2)
    }

    fn forward_rows(&self, q: &Tensor, rows: &[RowKeys<'_>]) -> Result<Tensor> {
        built_in_rows(self, q, rows)
    }

    fn rows_in_place(&self) -> bool {
        true
    }
}

/// Checks that an implementation exists, naming the registered ones otherwise.
pub fn resolve(name: &str) -> std::result::Result<Arc<dyn Attention>, String> {
    get(name).ok_or_else(|| {
        format!(
            "option `attn_implementation` names {name:?}, which is not registered; registered: {}",
            names().join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(shape: (usize, usize, usize, usize), seed: f64) -> Tensor {
        let n = shape.0 * shape.1 * shape.2 * shape.3;
        let data: Vec<f32> = (0..n)
            .map(|i| ((i as f64 * 0.7 + seed).sin()) as f32)
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn every_implementation_agrees_with_eager() {
        register("chunked_small", Arc::new(Chunked { chunk: 3 }));
        for (offset, q_len, window) in [(0, 7, None), (5, 4, None), (4, 1, None), (2, 9, Some(3))] {
            let q = rand((1, 6, q_len, 8), 0.3);
            let k = rand((1, 2, offset + q_len, 8), 1.1);
            let v = rand((1, 2, offset + q_len, 8), 2.9);
            let p = AttnParams {
                scale: 0.35,
                n_rep: 3,
                offset,
                sliding_window: window,
                hidden: None,
                blocks: &[],
            };
            let reference = Eager { key_align: 1 }.forward(&q, &k, &v, &p).unwrap();
            for name in names() {
                let out = resolve(&name).unwrap().forward(&q, &k, &v, &p).unwrap();
                let diff = max_diff(&reference, &out);
                assert!(
                    diff < 1e-5,
                    "{name} differs from eager by {diff} at {offset}/{q_len}"
                );
            }
        }
    }

    #[test]
    fn decode_rows_agree_with_eager_one_sequence_at_a_time() {
        // Head widths for the scalar path (20) and the SIMD one (24: three 8-wide chunks; 64:
        // the AVX-512 build's whole tile).
        for d in [20, 24, 64] {
            decode_rows_agree_with_eager(d);
        }
    }

    /// Four sequences at different positions (key counts that are not a multiple of the SIMD
    /// path's four, and 21: two 8-wide softmax steps and a tail), keys read as views of larger
    /// buffers (as a state holds them), one sliding window.
    fn decode_rows_agree_with_eager(d: usize) {
        let (heads, kv_heads) = (6, 2);
        let rows = [(0, None), (4, None), (9, Some(3)), (20, None)];
        let q = rand((1, heads, rows.len(), d), 0.3);
        let buffers: Vec<(Tensor, Tensor)> = (0..rows.len())
            .map(|i| {
                let k = rand((1, kv_heads, 24, d), 1.1 + i as f64);
                let v = rand((1, kv_heads, 24, d), 2.9 + i as f64);
                (k, v)
            })
            .collect();
        let views: Vec<(Tensor, Tensor)> = buffers
            .iter()
            .zip(rows)
            .map(|((k, v), (offset, _))| {
                (
                    k.narrow(2, 0, offset + 1).unwrap(),
                    v.narrow(2, 0, offset + 1).unwrap(),
                )
            })
            .collect();
        let keys: Vec<RowKeys<'_>> = views
            .iter()
            .zip(rows)
            .map(|((k, v), (offset, sliding_window))| RowKeys {
                k,
                v,
                params: AttnParams {
                    scale: 0.35,
                    n_rep: heads / kv_heads,
                    offset,
                    sliding_window,
                    hidden: None,
                    blocks: &[],
                },
            })
            .collect();
        let reference = Eager { key_align: 1 };
        let expected: Vec<Tensor> = keys
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let q = q.narrow(2, i, 1).unwrap().contiguous().unwrap();
                reference.forward(&q, r.k, r.v, &r.params).unwrap()
            })
            .collect();
        let expected = Tensor::cat(&expected, 2).unwrap();
        let fused = decode::rows(&q, &keys).unwrap();
        let fused = fused.expect("f32 on CPU takes the fused path");
        assert!(max_diff(&expected, &fused) < 1e-5);
        // On one thread the six (row, key/value head) tasks are enough to go by group; on more,
        // by query head: the same values either way.
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let grouped = one.install(|| decode::rows(&q, &keys)).unwrap().unwrap();
        let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(values(&grouped), values(&fused));
        // Decoded or scored with the prompt's rows, a row comes out the same bits.
        for (i, r) in keys.iter().enumerate() {
            let row = q.narrow(2, i, 1).unwrap().contiguous().unwrap();
            let scored = Sdpa.forward(&row, r.k, r.v, &r.params).unwrap();
            assert_eq!(
                values(&scored),
                values(&fused.narrow(2, i, 1).unwrap()),
                "row {i}"
            );
        }
        for name in names() {
            let out = resolve(&name).unwrap().forward_rows(&q, &keys).unwrap();
            let diff = max_diff(&expected, &out);
            assert!(
                diff < 1e-5,
                "{name}'s decode rows differ from eager by {diff}"
            );
        }
        // Another dtype falls back to one `forward` per row.
        let half = |t: &Tensor| t.to_dtype(candle_core::DType::F16).unwrap();
        let q16 = half(&q);
        assert!(decode::rows(&q16, &keys).unwrap().is_none());
    }

    /// The reference for hidden keys is independent of the mask: each query row alone against
    /// its keys with the hidden ones cut out (their rotations were already applied).
    #[test]
    fn hidden_keys_are_as_if_cut_out_for_queries_from_their_position() {
        register("chunked_small", Arc::new(Chunked { chunk: 3 }));
        let (offset, q_len) = (5, 4);
        let q = rand((1, 6, q_len, 8), 0.3);
        let k = rand((1, 2, offset + q_len, 8), 1.1);
        let v = rand((1, 2, offset + q_len, 8), 2.9);
        let keys = [1..3, 4..5];
        let hidden = Hidden {
            from: 6,
            keys: &keys,
        };
        let params = |offset, hidden| AttnParams {
            scale: 0.35,
            n_rep: 3,
            offset,
            sliding_window: None,
            hidden,
            blocks: &[],
        };
        let expected: Vec<Tensor> = (0..q_len)
            .map(|i| {
                let position = offset + i;
                let kept: Vec<u32> = (0..=position as u32)
                    .filter(|&j| position < 6 || !keys.iter().any(|r| r.contains(&(j as usize))))
                    .collect();
                let index = Tensor::new(kept.as_slice(), &Device::Cpu).unwrap();
                let (k, v) = (
                    k.index_select(&index, 2).unwrap(),
                    v.index_select(&index, 2).unwrap(),
                );
                let q = q.narrow(2, i, 1).unwrap().contiguous().unwrap();
                Eager { key_align: 1 }
                    .forward(&q, &k, &v, &params(kept.len() - 1, None))
                    .unwrap()
            })
            .collect();
        let expected = Tensor::cat(&expected, 2).unwrap();
        for name in names() {
            let out = resolve(&name)
                .unwrap()
                .forward(&q, &k, &v, &params(offset, Some(hidden)))
                .unwrap();
            let diff = max_diff(&expected, &out);
            assert!(diff < 1e-5, "{name} hides keys off by {diff}");
        }
    }

    /// Sequences continuing one prefix, attended to where it lies, come out bit for bit as each
    /// alone over its whole keys (the cache on and off agree), and within float tolerance of
    /// eager's. The prefix's 70 positions straddle a block of the fused kernel; items hide
    /// keys on both sides of the prefix's end, and one sees through a window. Head widths and
    /// groups for each path: 8 and 24 wide (one and three 8-wide chunks) in groups of three
    /// query heads and of three then one, 20 wide on the scalar path.
    #[test]
    fn sequences_after_a_shared_prefix_attend_as_over_their_whole_keys() {
        for (n_rep, d) in [(3, 8), (4, 24), (2, 20), (3, 64)] {
            after_a_shared_prefix(n_rep, d);
        }
    }

    fn after_a_shared_prefix(n_rep: usize, d: usize) {
        let (prefix_len, heads) = (70, 2 * n_rep);
        let pk = rand((1, 2, prefix_len, d), 1.1);
        let pv = rand((1, 2, prefix_len, d), 2.9);
        let hidden = [3..9, 66..75];
        let cases = [
            (0, 5, None, None),
            (
                4,
                3,
                None,
                Some(Hidden {
                    from: 72,
                    keys: &hidden,
                }),
            ),
            (0, 9, Some(20), None),
        ];
        let inputs: Vec<(Tensor, Tensor, Tensor, AttnParams<'_>)> = cases
            .iter()
            .enumerate()
            .map(|(i, &(before, n, window, hidden))| {
                let own = before + n;
                let params = AttnParams {
                    scale: 0.35,
                    n_rep,
                    offset: prefix_len + before,
                    sliding_window: window,
                    hidden,
                    blocks: &[],
                };
                let seed = i as f64;
                let q = rand((1, heads, n, d), 0.3 + seed);
                let k = rand((1, 2, own, d), 4.1 + seed);
                let v = rand((1, 2, own, d), 5.7 + seed);
                (q, k, v, params)
            })
            .collect();
        let items: Vec<Shared<'_>> = inputs
            .iter()
            .map(|(q, k, v, params)| Shared {
                q,
                k,
                v,
                params: *params,
            })
            .collect();
        let bits = |t: &Tensor| -> Vec<u32> {
            let values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            values.iter().map(|x| x.to_bits()).collect()
        };
        let stored = |t: &Tensor, dtype| t.to_dtype(dtype).unwrap();
        for dtype in [candle_core::DType::F32, candle_core::DType::F16] {
            let (pk, pv) = (stored(&pk, dtype), stored(&pv, dtype));
            let own: Vec<(Tensor, Tensor)> = inputs
                .iter()
                .map(|(_, k, v, _)| (stored(k, dtype), stored(v, dtype)))
                .collect();
            let items: Vec<Shared<'_>> = inputs
                .iter()
                .zip(&own)
                .map(|((q, _, _, params), (k, v))| Shared {
                    q,
                    k,
                    v,
                    params: *params,
                })
                .collect();
            let shared = Sdpa.forward_shared((&pk, &pv), &items).unwrap();
            for (item, out) in items.iter().zip(&shared) {
                let whole = |p: &Tensor, own: &Tensor| {
                    let t = Tensor::cat(&[p, own], 2).unwrap();
                    t.to_dtype(candle_core::DType::F32).unwrap()
                };
                let (k, v) = (whole(&pk, item.k), whole(&pv, item.v));
                let alone = Sdpa.forward(item.q, &k, &v, &item.params).unwrap();
                assert_eq!(bits(out), bits(&alone), "{dtype:?}, {n_rep} x {d}");
                let eager = Eager::default().forward(item.q, &k, &v, &item.params);
                assert!(max_diff(&eager.unwrap(), out) < 1e-5);
            }
        }
        // The generic path copies the prefix before each item's keys: the same values.
        let copied = by_copy(&Eager::default(), (&pk, &pv), &items).unwrap();
        let fused = Sdpa.forward_shared((&pk, &pv), &items).unwrap();
        for (a, b) in copied.iter().zip(&fused) {
            assert!(max_diff(a, b) < 1e-5);
        }
    }

    /// `sdpa_bf16`: sequences after a shared prefix score its keys and weigh its values in bf16
    /// products with f32 sums, their own keys in f32, as an f64 reference of that arithmetic
    /// does; each gets the same bits alone or beside others. Blocks of keys cut by hidden
    /// runs (at odd and even positions, across blocks' edges) and a window, a prefix of
    /// several blocks of sums ending in an odd position (a pair padded) and a head width that
    /// leaves a panel part-filled are covered.
    #[test]
    fn a_shared_prefix_attends_in_bf16_products_where_the_cpu_has_them() {
        // Without AVX-512 BF16 (or under `LMHOST_SIMD=avx2`) `sdpa_bf16` is `sdpa`, tested
        // above; CI's machines have it.
        if !crate::kernels::bf16::available() {
            return;
        }
        for (n_rep, d) in [(3, 64), (2, 40)] {
            bf16_after_a_shared_prefix(n_rep, d);
        }
    }

    fn bf16_after_a_shared_prefix(n_rep: usize, d: usize) {
        let (prefix_len, kv_heads) = (549, 2);
        let heads = kv_heads * n_rep;
        let pk = rand((1, kv_heads, prefix_len, d), 1.1);
        let pv = rand((1, kv_heads, prefix_len, d), 2.9);
        let hidden = [3..9, 70..75, 140..152, 255..258, 400..401, 540..552];
        let cases = [
            (0, 5, None, Some(prefix_len)),
            (2, 4, None, None),
            (0, 3, Some(100), None),
        ];
        let inputs: Vec<(Tensor, Tensor, Tensor, AttnParams<'_>)> = cases
            .iter()
            .enumerate()
            .map(|(i, &(before, n, window, hide_from))| {
                let own = before + n;
                let params = AttnParams {
                    scale: 0.35,
                    n_rep,
                    offset: prefix_len + before,
                    sliding_window: window,
                    hidden: hide_from.map(|from| Hidden {
                        from,
                        keys: &hidden,
                    }),
                    blocks: &[],
                };
                let seed = i as f64;
                let q = rand((1, heads, n, d), 0.3 + seed);
                let k = rand((1, kv_heads, own, d), 4.1 + seed);
                let v = rand((1, kv_heads, own, d), 5.7 + seed);
                (q, k, v, params)
            })
            .collect();
        let items: Vec<Shared<'_>> = inputs
            .iter()
            .map(|(q, k, v, params)| Shared {
                q,
                k,
                v,
                params: *params,
            })
            .collect();
        let together = SdpaBf16.forward_shared((&pk, &pv), &items).unwrap();
        let f32s = Sdpa.forward_shared((&pk, &pv), &items).unwrap();
        for (item, (out, f32_out)) in items.iter().zip(together.iter().zip(&f32s)) {
            let alone = SdpaBf16.forward_shared((&pk, &pv), std::slice::from_ref(item));
            assert_eq!(
                values(out),
                values(&alone.unwrap()[0]),
                "alone and together"
            );
            let k = Tensor::cat(&[&pk, item.k], 2).unwrap();
            let v = Tensor::cat(&[&pv, item.v], 2).unwrap();
            let want = bf16_reference(item.q, &k, &v, &item.params, prefix_len);
            let worst = beyond(&values(out), &want);
            assert!(
                worst <= 1.0,
                "{n_rep} x {d}: {worst} of the bound from the reference"
            );
            // f32 products stray past the bound (1.4 to 6.4 times it here; bf16's at most
            // 0.05): the check tells the two apart.
            let f32_worst = beyond(&values(f32_out), &want);
            assert!(
                f32_worst > 1.0,
                "{n_rep} x {d}: f32 products within {f32_worst} of the bound"
            );
        }
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// The largest difference of `got` from the reference's values, as a share of their bounds.
    fn beyond(got: &[f32], want: &[(f64, f64)]) -> f64 {
        assert_eq!(got.len(), want.len());
        got.iter()
            .zip(want)
            .map(|(&g, (w, bound))| (g as f64 - w).abs() / bound)
            .fold(0.0, f64::max)
    }

    /// Attention in f64 of `q` over `k`, `v` (`(1, kv_heads, len, d)`, positions from 0) as `p`
    /// lets each query see them, the first `in_bf16` keys' products, queries, weights (as the
    /// online softmax of `fused` weighs a block of keys) and values rounded to bf16 first;
    /// each output with how far f32 arithmetic may stray from it: 1e-5, plus, since a weight computed in f32 that lies at a bf16 rounding boundary
    /// may round the other way than in f64 (by a bf16 unit, 2⁻⁷ of it at most; about one
    /// weight in 20,000 here), two such units of the largest weighted value. A wrong key or
    /// value moves an output by whole weights, 64 times that.
    fn bf16_reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        p: &AttnParams<'_>,
        in_bf16: usize,
    ) -> Vec<(f64, f64)> {
        let (_, heads, n, d) = q.dims4().unwrap();
        let len = k.dim(2).unwrap();
        let mask = hidden_mask(n, p.offset, len, p, &Device::Cpu).unwrap();
        let mask = mask.map(|m| m.to_vec2::<u8>().unwrap());
        let (q, k, v) = (values(q), values(k), values(v));
        let bf16 = |x: f32| half::bf16::from_f32(x).to_f32() as f64;
        let product = |j: usize, a: f32, b: f32| match j < in_bf16 {
            true => bf16(a) * bf16(b),
            false => a as f64 * b as f64,
        };
        let mut out = vec![(0f64, 0f64); heads * n * d];
        for h in 0..heads {
            let g = h / p.n_rep;
            for r in 0..n {
                let seen = |j: usize| mask.as_ref().is_none_or(|m| m[r][j] == 0);
                let query = &q[(h * n + r) * d..][..d];
                let key = |j: usize| &k[(g * len + j) * d..][..d];
                let scores: Vec<f64> = (0..=p.offset + r)
                    .map(|j| match seen(j) {
                        false => f64::NEG_INFINITY,
                        true => {
                            let dot: f64 = query
                                .iter()
                                .zip(key(j))
                                .map(|(&a, &b)| product(j, a, b))
                                .sum();
                            dot * p.scale
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                // The bf16 keys' weights are `e^(s - m)` rounded, `m` the largest score of
                // the keys up to the end of their block, rescaled to `max` once rounded.
                let largest_by = |j: usize| {
                    let end = in_bf16.min((j / fused::SUMS + 1) * fused::SUMS);
                    scores[..end]
                        .iter()
                        .copied()
                        .fold(f64::NEG_INFINITY, f64::max)
                };
                let block_max: Vec<f64> = (0..scores.len()).map(largest_by).collect();
                for c in 0..d {
                    let seen = scores.iter().enumerate().filter(|(_, s)| s.is_finite());
                    let terms = seen.map(|(j, s)| {
                        let x = v[(g * len + j) * d + c];
                        let (w, by) = match j < in_bf16 {
                            true => ((s - block_max[j]).exp() as f32, (block_max[j] - max).exp()),
                            false => ((s - max).exp() as f32, 1.0),
                        };
                        let by = by / sum;
                        (product(j, w, x) * by, (w as f64 * by * x as f64).abs())
                    });
                    let (value, largest) = terms.fold((0.0, 0f64), |(sum, big), (t, size)| {
                        (sum + t, big.max(size))
                    });
                    out[(h * n + r) * d + c] = (value, 1e-5 + 2.0 * largest / 128.0);
                }
            }
        }
        out
    }

    #[test]
    fn unknown_name_lists_registered() {
        let err = resolve("flash9").err().unwrap();
        assert!(err.contains("eager") && err.contains("chunked"), "{err}");
    }

    #[test]
    fn sliding_window_hides_old_keys() {
        let p = AttnParams {
            scale: 1.0,
            n_rep: 1,
            offset: 5,
            sliding_window: Some(2),
            hidden: None,
            blocks: &[],
        };
        let m = hidden_mask(1, 5, 6, &p, &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.to_vec2::<u8>().unwrap(), vec![vec![1, 1, 1, 1, 0, 0]]);
    }

    /// A run of [`AttnParams::blocks`] sees itself whole, later keys of the run too, and
    /// nothing of a later run; outside the runs attention stays causal. Every implementation
    /// honours it as eager does.
    #[test]
    fn blocks_see_themselves_whole() {
        let blocks = [3..6, 7..9];
        let p = AttnParams {
            scale: 0.35,
            n_rep: 3,
            offset: 2,
            sliding_window: Some(2),
            hidden: None,
            blocks: &blocks,
        };
        let m = hidden_mask(8, 2, 10, &p, &Device::Cpu).unwrap().unwrap();
        let visible = |q: usize| -> Vec<usize> {
            let row = &m.to_vec2::<u8>().unwrap()[q - 2];
            (0..10).filter(|&k| row[k] == 0).collect()
        };
        assert_eq!(visible(2), [1, 2]);
        assert_eq!(visible(3), [2, 3, 4, 5]);
        assert_eq!(visible(5), [3, 4, 5]);
        assert_eq!(visible(6), [5, 6]);
        assert_eq!(visible(7), [6, 7, 8]);
        register("chunked_blocks", Arc::new(Chunked { chunk: 3 }));
        let q = rand((1, 6, 8, 8), 0.3);
        let k = rand((1, 2, 10, 8), 1.1);
        let v = rand((1, 2, 10, 8), 2.9);
        let eager = Eager::default().forward(&q, &k, &v, &p).unwrap();
        for other in ["chunked_blocks", "sdpa"] {
            let out = get(other).unwrap().forward(&q, &k, &v, &p).unwrap();
            assert!(max_diff(&eager, &out) < 1e-5, "{other}");
        }
    }
}
