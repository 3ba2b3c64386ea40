//! Attention of a pass's query rows (a prompt's, a scored reply's) read where the states hold
//! their keys and values: a prefix that several sequences of the pass continue (where the prefix
//! cache keeps it), then each sequence's own positions.
//!
//! Explain scores hundreds of coalitions after one cached context, each computing only its last
//! rows (under `hide`, the question and the reply). Through the generic path each coalition
//! would copy the context's keys and values into a state of its own, pad them and attend with a
//! GEMM per layer, so time and memory grew with context × coalitions. Here a coalition's state
//! holds only its own rows ([`crate::kv::KvState::after`]), and the rows of every sequence
//! continuing the prefix meet its keys block by block, while the block is in cache.
//!
//! Each (row, query head) is computed alone and in one order, whatever the pass: its visible
//! keys in position order, scored key by key, one softmax over them, and the values summed one
//! key after another, wherever they lie. So a row comes out bit for bit the same whether its
//! prefix came from the cache or was computed with it, alone or in a pass of many, in one chunk
//! or several. f32 queries on CPU, keys and values both f32 or both f16; elsewhere [`attend`]
//! answers `None` and the caller takes the generic path.
//!
//! Under `sdpa_bf16` (`Panels`) a shared prefix is scored and weighed in bf16 products
//! instead, block by block at fixed positions, in an online softmax ([`Online`], as flash
//! attention keeps one) that the row's own keys join last: a block's weights are computed,
//! rounded and summed against its values while the block's scores are in L1, and each output is
//! divided once at the end, instead of a pass over every score for the maximum, another for the
//! exponentials and a third for the division. Their exponentials need only bf16's precision, so
//! they take a shorter polynomial ([`Ops::coarse_exp_sum`]). A row then comes out the same alone
//! or in a pass of many, but differs by that rounding from the same row computed with its
//! prefix.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Range;

use candle_core::{DType, Layout, Result, Storage, Tensor};
use rayon::prelude::*;

use super::decode::{strides, Elem, Heads, Pair};
use super::ops::Ops;
use super::{AttnParams, Shared};
use crate::kernels::bf16;
use crate::kv::Values;

/// Keys per block: a block's keys or values (16 KB at head width 64) stay in L1 while the
/// queries of a task meet them.
const BLOCK: usize = 64;

/// Rows of one sequence per task: their query heads of one key/value head share every block.
const TILE: usize = 32;

/// Softmax(q kᵀ · scale + mask) v of each sequence of `items`, whose keys are `prefix` (shared by
/// all, positions `0..P`), then its own (positions `P..`), as [`super::hidden_mask`] lets each
/// query see them. With `bf16`, where the CPU has AVX-512 BF16, the prefix's scores and
/// weighted sums are bf16 products with f32 sums (`Panels`). Returns each sequence's output
/// shaped as its `q`; `None` where this path does not apply.
pub fn attend(
    prefix: Option<(&Tensor, &Tensor)>,
    items: &[Shared<'_>],
    bf16: bool,
) -> Result<Option<Vec<Tensor>>> {
    let Some(first) = items.first() else {
        return Ok(Some(Vec::new()));
    };
    let (_, heads, _, d) = first.q.dims4()?;
    let n_rep = first.params.n_rep.max(1);
    let kv_heads = heads / n_rep;
    let prefix_len = prefix.map_or(Ok(0), |(k, _)| k.dim(2))?;
    for item in items {
        let (_, h, n, qd) = item.q.dims4()?;
        let (_, kvh, own, kd) = item.k.dims4()?;
        let applies = item.q.dtype() == DType::F32
            && item.q.device().is_cpu()
            && (h, qd, kd, kvh) == (heads, d, d, kv_heads)
            && item.params.n_rep == n_rep
            && item.params.offset + n == prefix_len + own
            && item.params.offset >= prefix_len;
        if !applies {
            return Ok(None);
        }
    }
    let prefix_guards = prefix.map(|(k, v)| (k.storage_and_layout(), v.storage_and_layout()));
    let own_guards: Vec<_> = items
        .iter()
        .map(|i| (i.k.storage_and_layout(), i.v.storage_and_layout()))
        .collect();
    let prefix_pair = match &prefix_guards {
        Some(((k, kl), (v, vl))) => match laid((k, kl), (v, vl)) {
            Some(pair) => Some(pair),
            None => return Ok(None),
        },
        None => None,
    };
    let own: Option<Vec<Pair<'_>>> = own_guards
        .iter()
        .map(|((k, kl), (v, vl))| laid((k, kl), (v, vl)))
        .collect();
    let Some(own) = own else {
        return Ok(None);
    };
    let panels = match &prefix_pair {
        Some(pair) if bf16 && prefix_len > 0 => (0..kv_heads)
            .into_par_iter()
            .map(|g| Panels::of(pair, g, prefix_len, d))
            .collect::<Option<Vec<_>>>(),
        _ => None,
    };
    let queries = items
        .iter()
        .map(|i| i.q.contiguous()?.flatten_all()?.to_vec1::<f32>())
        .collect::<Result<Vec<_>>>()?;
    let shape = Shape {
        n_rep,
        d,
        prefix: prefix_len,
    };
    let tasks: Vec<Task> = items
        .iter()
        .enumerate()
        .flat_map(|(i, item)| {
            let n = item.q.dims()[2];
            (0..n).step_by(TILE).flat_map(move |r| {
                (0..kv_heads).map(move |g| Task {
                    item: i,
                    rows: r..(r + TILE).min(n),
                    g,
                })
            })
        })
        .collect();
    let outs: Option<Vec<Vec<f32>>> = tasks
        .par_iter()
        .map(|task| {
            let item = &items[task.item];
            let q = Queries {
                data: &queries[task.item],
                n: item.q.dims()[2],
                d,
            };
            let panels = panels.as_ref().map(|all| &all[task.g]);
            match (prefix_pair.as_ref(), &own[task.item]) {
                (None, Pair::F32(k, v)) => tile(shape, task, &item.params, q, None, (k, v), None),
                (Some(Pair::F32(pk, pv)), Pair::F32(k, v)) => {
                    tile(shape, task, &item.params, q, Some((pk, pv)), (k, v), panels)
                }
                (None, Pair::F16(k, v)) => tile(shape, task, &item.params, q, None, (k, v), None),
                (Some(Pair::F16(pk, pv)), Pair::F16(k, v)) => {
                    tile(shape, task, &item.params, q, Some((pk, pv)), (k, v), panels)
                }
                _ => None,
            }
        })
        .collect();
    let Some(outs) = outs else {
        return Ok(None);
    };
    // Each task's rows, `(row, rep, d)`, into its sequence's `(heads, n, d)`.
    let mut results: Vec<Vec<f32>> = queries.iter().map(|q| vec![0f32; q.len()]).collect();
    for (task, out) in tasks.iter().zip(outs) {
        let n = items[task.item].q.dims()[2];
        let result = &mut results[task.item];
        for (ri, r) in task.rows.clone().enumerate() {
            for rep in 0..n_rep {
                let h = task.g * n_rep + rep;
                let from = (ri * n_rep + rep) * d;
                result[(h * n + r) * d..][..d].copy_from_slice(&out[from..from + d]);
            }
        }
    }
    results
        .into_iter()
        .zip(items)
        .map(|(out, item)| Tensor::from_vec(out, item.q.dims(), item.q.device()))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Keys and values as their storages hold them, if both are f32 or both f16 on CPU, each
/// position's values contiguous.
fn laid<'a>((k, kl): (&'a Storage, &Layout), (v, vl): (&'a Storage, &Layout)) -> Option<Pair<'a>> {
    Pair::of(
        (Values::of(k)?, strides(kl)?),
        (Values::of(v)?, strides(vl)?),
    )
}

/// What every task of a call shares.
#[derive(Clone, Copy)]
struct Shape {
    n_rep: usize,
    d: usize,
    /// Positions of the shared prefix.
    prefix: usize,
}

/// Rows `rows` of sequence `item`, against key/value head `g`.
struct Task {
    item: usize,
    rows: Range<usize>,
    g: usize,
}

/// A sequence's queries, `(heads, n, d)` row-major.
#[derive(Clone, Copy)]
struct Queries<'a> {
    data: &'a [f32],
    n: usize,
    d: usize,
}

impl<'a> Queries<'a> {
    fn at(&self, h: usize, r: usize) -> &'a [f32] {
        &self.data[(h * self.n + r) * self.d..][..self.d]
    }
}

thread_local! {
    /// A task's scores, reused by every task this thread runs.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One task: its rows' query heads of key/value head `g` against the keys each row sees, where
/// they lie (`prefix` for positions below `shape.prefix`, `own` after); the prefix's through
/// `panels` where given. Returns `(row, rep, d)`.
fn tile<E: Elem>(
    shape: Shape,
    task: &Task,
    params: &AttnParams<'_>,
    queries: Queries<'_>,
    prefix: Option<(&Heads<'_, E>, &Heads<'_, E>)>,
    own: (&Heads<'_, E>, &Heads<'_, E>),
    panels: Option<&Panels>,
) -> Option<Vec<f32>> {
    if let Some(panels) = panels {
        return online(shape, task, params, queries, own, panels);
    }
    let Shape { n_rep, d, .. } = shape;
    let runs = visible_runs(task, params);
    let counts: Vec<usize> = runs
        .iter()
        .map(|r| r.iter().map(|r| r.len()).sum())
        .collect();
    let starts = Rows::starts(&counts, n_rep);
    let rows = Rows {
        starts: &starts,
        counts: &counts,
        n_rep,
    };
    // A piece's keys (or values) where they lie: in the prefix's state or the sequence's own.
    let lying = |piece: &Piece, values: bool| {
        let (k, v) = if piece.in_prefix { prefix? } else { own };
        (if values { v } else { k }).run(task.g, piece.keys.clone(), d)
    };
    let mut by_key = Vec::new();
    pieces(&runs, shape.prefix, |ri, at, keys, in_prefix| {
        by_key.push(Piece {
            ri,
            at,
            keys,
            in_prefix,
        })
    });
    let ops = Ops::new(d);
    let mut out = vec![0f32; task.rows.len() * n_rep * d];
    let weigh = |_: usize, scores: &mut [f32], _: &mut [f32]| ops.softmax(scores);
    let call = (ops, task, queries, params.scale as f32);
    per_key(call, &by_key, rows, lying, weigh, &mut out)?;
    Some(out)
}

/// The per-key operations over `pieces`: each piece's scores, where `rows` keeps them; then
/// `weigh(h, scores, output)` turns each query head's scores into weights (`h` is row ·
/// `n_rep` + rep; `output` its `d` values); then each piece's values, weighted, added to `out`
/// (`(row, rep, d)`). `lying(piece, values)` finds a piece's keys (or values); `None` where one
/// is not laid out as the kernels read it.
fn per_key<'a, E: Elem + 'a>(
    (ops, task, queries, scale): (Ops, &Task, Queries<'_>, f32),
    pieces: &[Piece],
    rows: Rows<'_>,
    lying: impl Fn(&Piece, bool) -> Option<&'a [E]>,
    mut weigh: impl FnMut(usize, &mut [f32], &mut [f32]),
    out: &mut [f32],
) -> Option<()> {
    let n_rep = rows.n_rep;
    let d = out.len() / (rows.counts.len() * n_rep);
    let total = rows.counts.iter().sum::<usize>() * n_rep;
    SCORES.with_borrow_mut(|all| {
        // Each visible key's score is written before it is read: the last task's need no
        // clearing.
        if all.len() < total {
            all.resize(total, 0.0);
        }
        let scores = &mut all[..total];
        for piece in pieces {
            let run = lying(piece, false)?;
            let weights = rows
                .of(scores, piece.ri)
                .map(|w| &mut w[piece.at..piece.at + piece.keys.len()]);
            ops.scores(
                row_heads(queries, task, n_rep, piece.ri),
                run,
                scale,
                weights,
            );
        }
        for ri in 0..rows.counts.len() {
            for (rep, w) in rows.of(scores, ri).enumerate() {
                let h = ri * n_rep + rep;
                weigh(h, w, &mut out[h * d..][..d]);
            }
        }
        for piece in pieces {
            let run = lying(piece, true)?;
            let (start, count) = (rows.starts[piece.ri], rows.counts[piece.ri]);
            let weights = scores[start..start + n_rep * count]
                .chunks(count)
                .map(|w| &w[piece.at..piece.at + piece.keys.len()]);
            let outs = out[piece.ri * n_rep * d..][..n_rep * d].chunks_mut(d);
            ops.accumulate(weights, run, outs);
        }
        Some(())
    })
}

/// [`tile`] through `panels`: the rows' query heads meet the prefix block by block
/// ([`Panels::attend`]), then their own keys by the per-key operations, in one online softmax
/// ([`Online`]), each output divided by its weights' sum once at the end.
fn online<E: Elem>(
    shape: Shape,
    task: &Task,
    params: &AttnParams<'_>,
    queries: Queries<'_>,
    own: (&Heads<'_, E>, &Heads<'_, E>),
    panels: &Panels,
) -> Option<Vec<f32>> {
    let Shape { n_rep, d, prefix } = shape;
    let heads = |ri: usize| row_heads(queries, task, n_rep, ri);
    let (mut in_prefix, mut by_key) = (Vec::new(), Vec::new());
    // A row's own keys are counted among its own visible keys only.
    let mut counts = vec![0; task.rows.len()];
    pieces(
        &visible_runs(task, params),
        prefix,
        |ri, at, keys, is_prefix| {
            if is_prefix {
                in_prefix.push(Piece {
                    ri,
                    at,
                    keys,
                    in_prefix: true,
                });
            } else {
                let at = counts[ri];
                counts[ri] += keys.len();
                by_key.push(Piece {
                    ri,
                    at,
                    keys,
                    in_prefix: false,
                });
            }
        },
    );
    let ops = Ops::new(d);
    let scale = params.scale as f32;
    let x = panels.queries((0..task.rows.len()).flat_map(heads), d);
    let mut state = Online::new(task.rows.len() * n_rep);
    let mut out = vec![0f32; task.rows.len() * n_rep * d];
    panels.attend(&x, &in_prefix, n_rep, (scale, ops), (&mut state, &mut out));
    let starts = Rows::starts(&counts, n_rep);
    let rows = Rows {
        starts: &starts,
        counts: &counts,
        n_rep,
    };
    let lying = |piece: &Piece, values: bool| {
        (if values { own.1 } else { own.0 }).run(task.g, piece.keys.clone(), d)
    };
    let weigh = |h: usize, scores: &mut [f32], output: &mut [f32]| {
        state.raise(h, ops.largest(scores, f32::NEG_INFINITY), output);
        state.add(h, ops.exp_sum(scores, state.largest[h]));
    };
    per_key(
        (ops, task, queries, scale),
        &by_key,
        rows,
        lying,
        weigh,
        &mut out,
    )?;
    state.finish(&mut out);
    Some(out)
}

/// Each of a task's query heads' softmax over the keys it has met so far, kept as flash
/// attention keeps it: the largest score and the sum of `e^(s - largest)` over the keys, beside
/// the outputs (`(heads, d)`, the caller's), which hold the values weighted by those, still to
/// be divided by the sum.
struct Online {
    largest: Vec<f32>,
    sum: Vec<f32>,
}

impl Online {
    fn new(heads: usize) -> Online {
        Online {
            largest: vec![f32::NEG_INFINITY; heads],
            sum: vec![0.0; heads],
        }
    }

    /// Head `h` is about to meet keys whose largest score is `top`: what it has summed, and its
    /// `output`, are rescaled to the new largest.
    fn raise(&mut self, h: usize, top: f32, output: &mut [f32]) {
        if top <= self.largest[h] {
            return;
        }
        if self.sum[h] > 0.0 {
            let by = (self.largest[h] - top).exp();
            self.sum[h] *= by;
            output.iter_mut().for_each(|o| *o *= by);
        }
        self.largest[h] = top;
    }

    /// Head `h` met keys whose weights, `e^(s - largest)` (after [`Online::raise`]), sum to
    /// `sum`.
    fn add(&mut self, h: usize, sum: f32) {
        self.sum[h] += sum;
    }

    /// Each head's output divided by its sum.
    fn finish(&self, out: &mut [f32]) {
        let d = out.len() / self.sum.len();
        for (out, &sum) in out.chunks_mut(d).zip(&self.sum) {
            if sum > 0.0 {
                out.iter_mut().for_each(|o| *o /= sum);
            }
        }
    }
}

/// The keys each of a task's rows sees, as [`visible`] gives them.
fn visible_runs(task: &Task, params: &AttnParams<'_>) -> Vec<Vec<Range<usize>>> {
    task.rows
        .clone()
        .map(|r| visible(params.offset + r, params))
        .collect()
}

/// The query heads of a task's row `ri` that its key/value head serves.
fn row_heads<'q>(
    queries: Queries<'q>,
    task: &Task,
    n_rep: usize,
    ri: usize,
) -> impl Iterator<Item = &'q [f32]> {
    let (g, r) = (task.g, task.rows.start + ri);
    (0..n_rep).map(move |rep| queries.at(g * n_rep + rep, r))
}

/// Where a task's rows keep their query heads' scores among its scores.
#[derive(Clone, Copy)]
struct Rows<'a> {
    /// Row `ri`'s query heads' scores, `counts[ri]` each, start at `starts[ri]`.
    starts: &'a [usize],
    counts: &'a [usize],
    n_rep: usize,
}

impl Rows<'_> {
    /// Where each row's query heads' scores start, for rows of `counts` keys each: one after
    /// another, `n_rep` heads a row.
    fn starts(counts: &[usize], n_rep: usize) -> Vec<usize> {
        counts
            .iter()
            .scan(0, |at, &c| {
                let start = *at;
                *at += c * n_rep;
                Some(start)
            })
            .collect()
    }

    /// Row `ri`'s query heads' scores, one slice each.
    fn of<'s>(&self, scores: &'s mut [f32], ri: usize) -> std::slice::ChunksMut<'s, f32> {
        let count = self.counts[ri];
        scores[self.starts[ri]..self.starts[ri] + self.n_rep * count].chunks_mut(count.max(1))
    }
}

/// Keys `keys` of a row `ri`, where the row's visible keys reach them: from its `at`-th on.
struct Piece {
    ri: usize,
    at: usize,
    keys: Range<usize>,
    in_prefix: bool,
}

/// A key/value head's prefix in bf16 panels ([`bf16::Packed`]), packed once per call for every
/// task of it: the keys as rows, so that a tile of query heads meets a block's keys in one
/// product, and the values transposed, so that a tile of weights over a block's keys meets
/// them likewise. A score is one chain of products over the head's pairs of values, and a
/// block's weighted sum ([`SUMS`] keys) one chain over its pairs of keys, added to the output
/// block after block; blocks lie at fixed positions, so a row's values do not depend on the
/// rows around it.
struct Panels {
    keys: bf16::Packed,
    values: bf16::Packed,
    /// The prefix's positions.
    len: usize,
}

/// Keys per block of [`Panels::sums`]: each tile of weights meets a block's values (32 KB at
/// head width 64) in one chain of products, added to the outputs once a block.
pub(super) const SUMS: usize = 4 * BLOCK;

const _: () = assert!(
    BLOCK == bf16::WIDE * bf16::LANES,
    "a block is one tile of key panels"
);

impl Panels {
    /// Key/value head `g`'s first `len` positions of `pair`, where the CPU has the
    /// instructions.
    fn of(pair: &Pair<'_>, g: usize, len: usize, d: usize) -> Option<Panels> {
        let (keys, values): (Cow<'_, [f32]>, Cow<'_, [f32]>) = match pair {
            Pair::F32(k, v) => (k.run(g, 0..len, d)?.into(), v.run(g, 0..len, d)?.into()),
            Pair::F16(k, v) => {
                let wide = |run: &[half::f16]| run.iter().map(|x| x.f32()).collect::<Vec<_>>();
                (
                    wide(k.run(g, 0..len, d)?).into(),
                    wide(v.run(g, 0..len, d)?).into(),
                )
            }
        };
        Some(Panels {
            keys: bf16::Packed::new(&keys, (len, d))?,
            values: bf16::Packed::transposed(&values, (len, d))?,
            len,
        })
    }

    /// `heads`, each `d` values, rounded to bf16 pairs, one row each.
    fn queries<'q>(&self, heads: impl Iterator<Item = &'q [f32]>, d: usize) -> Vec<u32> {
        let pairs = d.div_ceil(2);
        let mut x = Vec::new();
        for head in heads {
            x.resize(x.len() + pairs, 0);
            let at = x.len() - pairs;
            self.keys.round_pairs(head, &mut x[at..]);
        }
        x
    }

    /// The query heads `x` holds (bf16 pairs, one row each; `n_rep` a row) meet the prefix
    /// pieces of their rows, block by block of [`SUMS`] keys: the block's scores in tiles of
    /// key panels, each head's largest and weights into `state`, then the weights, rounded,
    /// against the block's value panels, added to the outputs.
    fn attend(
        &self,
        x: &[u32],
        pieces: &[Piece],
        n_rep: usize,
        (scale, ops): (f32, Ops),
        (state, out): (&mut Online, &mut [f32]),
    ) {
        let heads = x.len() / self.keys.shape().1.div_ceil(2);
        let d = out.len() / heads;
        let half = SUMS / 2;
        let mut scores = vec![0f32; heads * SUMS];
        let mut top = vec![f32::NEG_INFINITY; heads];
        let mut weights = vec![0u32; heads * half];
        let mut runs = Vec::new();
        for group in pieces.chunk_by(|a, b| a.keys.start / SUMS == b.keys.start / SUMS) {
            let base = group[0].keys.start / SUMS * SUMS;
            self.block_scores(x, group, base, scale, &mut scores);
            row_lanes(group, base, &mut runs);
            top.fill(f32::NEG_INFINITY);
            for (ri, lanes) in &runs {
                for h in ri * n_rep..(ri + 1) * n_rep {
                    top[h] = ops.largest(&scores[h * SUMS..][lanes.clone()], top[h]);
                }
            }
            for (h, &top) in top.iter().enumerate() {
                state.raise(h, top, &mut out[h * d..][..d]);
            }
            weights.fill(0);
            for (ri, lanes) in &runs {
                for h in ri * n_rep..(ri + 1) * n_rep {
                    let seen = &mut scores[h * SUMS..][lanes.clone()];
                    state.add(h, ops.coarse_exp_sum(seen, state.largest[h]));
                    self.place(seen, lanes.start, &mut weights[h * half..][..half]);
                }
            }
            let first = base / 2;
            let block = first..(first + half).min(self.len.div_ceil(2));
            self.sums(&weights, block, out);
        }
    }

    /// Every head's scaled scores against the keys of the blocks of [`BLOCK`] that `group`'s
    /// pieces reach, from `base`, into `scores` (`SUMS` a head).
    fn block_scores(
        &self,
        x: &[u32],
        group: &[Piece],
        base: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let pairs = self.keys.shape().1.div_ceil(2);
        let heads = x.len() / pairs;
        let mut reached = [false; SUMS / BLOCK];
        group
            .iter()
            .for_each(|p| reached[(p.keys.start - base) / BLOCK] = true);
        let mut tile = [[0f32; BLOCK]; bf16::TILE];
        for b in (0..reached.len()).filter(|&b| reached[b]) {
            let panel = (base / BLOCK + b) * bf16::WIDE;
            for first in (0..heads).step_by(bf16::TILE) {
                let tile = &mut tile[..bf16::TILE.min(heads - first)];
                self.keys
                    .tile(&x[first * pairs..], pairs, 0..pairs, panel, tile);
                for (h, block) in tile.iter().enumerate() {
                    let to = &mut scores[(first + h) * SUMS + b * BLOCK..][..BLOCK];
                    to.iter_mut().zip(block).for_each(|(to, s)| *to = s * scale);
                }
            }
        }
    }

    /// Each head's output `+=` its row of `weights` (bf16 pairs over the keys of `block`, a
    /// block's pairs) times those keys' values.
    fn sums(&self, weights: &[u32], block: Range<usize>, out: &mut [f32]) {
        let d = self.values.shape().0;
        let half = SUMS / 2;
        let mut acc = [[0f32; BLOCK]; bf16::TILE];
        for (i, outs) in out.chunks_mut(bf16::TILE * d).enumerate() {
            let tile = &mut acc[..outs.len() / d];
            let x = &weights[i * bf16::TILE * half..];
            for panel in (0..d.div_ceil(bf16::LANES)).step_by(bf16::WIDE) {
                self.values.tile(x, half, block.clone(), panel, tile);
                let columns = panel * bf16::LANES..d.min((panel + bf16::WIDE) * bf16::LANES);
                for (out, acc) in outs.chunks_exact_mut(d).zip(tile.iter()) {
                    for (o, a) in out[columns.clone()].iter_mut().zip(acc) {
                        *o += a;
                    }
                }
            }
        }
    }

    /// `weights` of a block's keys from `lane` on, rounded, into `words`' halves (zero where no
    /// weight lands: keys the row does not see).
    fn place(&self, weights: &[f32], lane: usize, words: &mut [u32]) {
        let mut half = [0u16];
        let (mut weights, mut lane) = (weights, lane);
        if lane % 2 == 1 && !weights.is_empty() {
            self.values.round(&weights[..1], &mut half);
            words[lane / 2] |= u32::from(half[0]) << 16;
            (weights, lane) = (&weights[1..], lane + 1);
        }
        let even = weights.len() & !1;
        self.values
            .round_pairs(&weights[..even], &mut words[lane / 2..][..even / 2]);
        if even < weights.len() {
            self.values.round(&weights[even..], &mut half);
            words[(lane + even) / 2] |= u32::from(half[0]);
        }
    }
}

/// Into `runs`, each row's lanes of a block from `base` that `group`'s pieces cover, its pieces
/// joined where they meet: one run a row unless keys are hidden from it.
fn row_lanes(group: &[Piece], base: usize, runs: &mut Vec<(usize, Range<usize>)>) {
    runs.clear();
    runs.extend(
        group
            .iter()
            .map(|p| (p.ri, p.keys.start - base..p.keys.end - base)),
    );
    runs.sort_unstable_by_key(|(ri, lanes)| (*ri, lanes.start));
    runs.dedup_by(|(ri, next), (into_ri, into)| {
        let joins = ri == into_ri && next.start == into.end;
        if joins {
            into.end = next.end;
        }
        joins
    });
}

/// Calls `f(row, at, keys, in_prefix)` for every piece of every row's visible runs, block by
/// block of positions: `keys` are positions of the prefix (`in_prefix`) or of the sequence's own
/// keys (counted from the prefix's end), and `at` is where the piece starts among the row's
/// visible keys.
fn pieces(
    runs: &[Vec<Range<usize>>],
    prefix: usize,
    mut f: impl FnMut(usize, usize, Range<usize>, bool),
) {
    let end = runs.iter().flatten().map(|r| r.end).max().unwrap_or(0);
    let mut seen = vec![0usize; runs.len()];
    for block in (0..end).step_by(BLOCK) {
        let block = block..block + BLOCK;
        for (ri, row) in runs.iter().enumerate() {
            for run in row {
                let piece = run.start.max(block.start)..run.end.min(block.end);
                if piece.is_empty() {
                    continue;
                }
                let split = prefix.clamp(piece.start, piece.end);
                if split > piece.start {
                    f(ri, seen[ri], piece.start..split, true);
                }
                if piece.end > split {
                    let at = seen[ri] + split - piece.start;
                    f(ri, at, split - prefix..piece.end - prefix, false);
                }
                seen[ri] += piece.len();
            }
        }
    }
}

/// The keys the query at position `qi` sees, as sorted runs of positions: its own and the
/// window's before it, its whole image run, less the keys hidden from it.
fn visible(qi: usize, p: &AttnParams<'_>) -> Vec<Range<usize>> {
    let start = p.sliding_window.map_or(0, |w| (qi + 1).saturating_sub(w));
    let mut seen = start..qi + 1;
    if let Some(run) = p.blocks.iter().find(|b| b.contains(&qi)) {
        seen = seen.start.min(run.start)..seen.end.max(run.end);
    }
    let mut runs = vec![seen];
    if let Some(hidden) = p.hidden.filter(|h| qi >= h.from) {
        for cut in hidden.keys {
            runs = runs
                .into_iter()
                .flat_map(|r| [r.start..r.end.min(cut.start), r.start.max(cut.end)..r.end])
                .filter(|r| !r.is_empty())
                .collect();
        }
    }
    runs
}
