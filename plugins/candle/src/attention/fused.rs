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

use std::cell::RefCell;
use std::ops::Range;

use candle_core::{DType, Layout, Result, Storage, Tensor};
use rayon::prelude::*;

use super::decode::{self, strides, Elem, Heads, Pair};
use super::{AttnParams, Shared};
use crate::kv::Values;

/// Keys per block: a block's keys or values (16 KB at head width 64) stay in L1 while the
/// queries of a task meet them.
const BLOCK: usize = 64;

/// Rows of one sequence per task: their query heads of one key/value head share every block.
const TILE: usize = 32;

/// Softmax(q kᵀ · scale + mask) v of each sequence of `items`, whose keys are `prefix` (shared by
/// all, positions `0..P`), then its own (positions `P..`), as [`super::hidden_mask`] lets each
/// query see them. Returns each sequence's output shaped as its `q`; `None` where this path does
/// not apply.
pub fn attend(
    prefix: Option<(&Tensor, &Tensor)>,
    items: &[Shared<'_>],
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
            match (prefix_pair.as_ref(), &own[task.item]) {
                (None, Pair::F32(k, v)) => tile(shape, task, &item.params, q, None, (k, v)),
                (Some(Pair::F32(pk, pv)), Pair::F32(k, v)) => {
                    tile(shape, task, &item.params, q, Some((pk, pv)), (k, v))
                }
                (None, Pair::F16(k, v)) => tile(shape, task, &item.params, q, None, (k, v)),
                (Some(Pair::F16(pk, pv)), Pair::F16(k, v)) => {
                    tile(shape, task, &item.params, q, Some((pk, pv)), (k, v))
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
/// they lie (`prefix` for positions below `shape.prefix`, `own` after). Returns `(row, rep, d)`.
fn tile<E: Elem>(
    shape: Shape,
    task: &Task,
    params: &AttnParams<'_>,
    queries: Queries<'_>,
    prefix: Option<(&Heads<'_, E>, &Heads<'_, E>)>,
    own: (&Heads<'_, E>, &Heads<'_, E>),
) -> Option<Vec<f32>> {
    let Shape { n_rep, d, .. } = shape;
    let g = task.g;
    let runs: Vec<Vec<Range<usize>>> = task
        .rows
        .clone()
        .map(|r| visible(params.offset + r, params))
        .collect();
    let counts: Vec<usize> = runs
        .iter()
        .map(|r| r.iter().map(|r| r.len()).sum())
        .collect();
    // Row `ri`'s query heads' scores, `count` each, start at `starts[ri]`.
    let starts: Vec<usize> = counts
        .iter()
        .scan(0, |at, &c| {
            let start = *at;
            *at += c * n_rep;
            Some(start)
        })
        .collect();
    let total = counts.iter().sum::<usize>() * n_rep;
    let heads = |ri: usize| {
        let r = task.rows.start + ri;
        (0..n_rep).map(move |rep| queries.at(g * n_rep + rep, r))
    };
    // A piece's keys (or values) where they lie: in the prefix's state or the sequence's own.
    let lying = |in_prefix: bool, values: bool, keys: Range<usize>| {
        let (k, v) = if in_prefix { prefix? } else { own };
        (if values { v } else { k }).run(g, keys, d)
    };
    let ops = Ops::new(d);
    let scale = params.scale as f32;
    let mut out = vec![0f32; task.rows.len() * n_rep * d];
    let mut complete = true;
    SCORES.with_borrow_mut(|scores| {
        scores.clear();
        scores.resize(total, 0.0);
        pieces(&runs, shape.prefix, |ri, at, keys, in_prefix| {
            let Some(run) = lying(in_prefix, false, keys.clone()) else {
                complete = false;
                return;
            };
            let count = counts[ri];
            let rows = scores[starts[ri]..starts[ri] + n_rep * count].chunks_mut(count);
            let weights = rows.map(|w| &mut w[at..at + keys.len()]);
            ops.scores(heads(ri), run, scale, weights);
        });
        for (ri, &count) in counts.iter().enumerate() {
            let rows = scores[starts[ri]..starts[ri] + n_rep * count].chunks_mut(count);
            rows.for_each(|w| ops.softmax(w));
        }
        pieces(&runs, shape.prefix, |ri, at, keys, in_prefix| {
            let Some(run) = lying(in_prefix, true, keys.clone()) else {
                complete = false;
                return;
            };
            let count = counts[ri];
            let rows = scores[starts[ri]..starts[ri] + n_rep * count].chunks(count);
            let weights = rows.map(|w| &w[at..at + keys.len()]);
            let outs = out[ri * n_rep * d..(ri + 1) * n_rep * d].chunks_mut(d);
            ops.accumulate(weights, run, outs);
        });
    });
    complete.then_some(out)
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

/// The per-key operations on the fastest path this CPU has, chosen once per call so that every
/// row of the call is computed alike. Each query's score against a key and each output's sum
/// over the keys come out the same however the queries and keys are grouped, and on either
/// vector build.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Ops {
    Scalar,
    Avx2,
    /// [`Ops::Avx2`]'s arithmetic in AVX-512's thirty-two registers.
    Avx512,
}

/// Three query heads a kernel call (a row's on SmolLM2, whose key/value heads serve three):
/// each key or value loaded serves them all.
macro_rules! in_threes {
    ($pairs:ident, $kernel:path, $($arg:expr),*) => {
        loop {
            let [a, b, c] = [$pairs.next(), $pairs.next(), $pairs.next()];
            // SAFETY: `Ops::new` found the build's features and a head width that is a
            // multiple of 8.
            unsafe {
                match (a, b, c) {
                    (Some(a), Some(b), Some(c)) => $kernel([a, b, c], $($arg),*),
                    (Some(a), Some(b), None) => $kernel([a, b], $($arg),*),
                    (Some(a), None, _) => $kernel([a], $($arg),*),
                    _ => break,
                }
            }
        }
    };
}

impl Ops {
    fn new(d: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if d.is_multiple_of(8) {
            use crate::kernels::Path;
            match Path::best() {
                Path::Avx512 if is_x86_feature_detected!("avx512vl") => return Ops::Avx512,
                Path::Avx2 | Path::Avx512 => return Ops::Avx2,
                Path::Scalar => {}
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = d;
        Ops::Scalar
    }

    /// Each query's scaled dot product with each key of `keys` (consecutive, `d` values each),
    /// into its `weights`.
    fn scores<'q, 'w, E: Elem>(
        self,
        queries: impl Iterator<Item = &'q [f32]>,
        keys: &[E],
        scale: f32,
        weights: impl Iterator<Item = &'w mut [f32]>,
    ) {
        let mut pairs = queries.zip(weights);
        match self {
            #[cfg(target_arch = "x86_64")]
            Ops::Avx512 => in_threes!(pairs, avx512::scores, keys, scale),
            #[cfg(target_arch = "x86_64")]
            Ops::Avx2 => in_threes!(pairs, avx2::scores, keys, scale),
            _ => {
                for (query, weights) in pairs {
                    let d = query.len();
                    for (w, key) in weights.iter_mut().zip(keys.chunks_exact(d)) {
                        *w = decode::dot(query, key) * scale;
                    }
                }
            }
        }
    }

    fn softmax(self, scores: &mut [f32]) {
        if scores.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !matches!(self, Ops::Scalar) {
            // SAFETY: `Ops::new` found AVX2 and FMA.
            unsafe { decode::avx2::softmax(scores) };
            return;
        }
        decode::softmax(scores);
    }

    /// Each output `+= Σ weights[j] · values[j]`, one key after another, for consecutive
    /// values of `d` each.
    fn accumulate<'w, 'o, E: Elem>(
        self,
        weights: impl Iterator<Item = &'w [f32]>,
        values: &[E],
        outs: impl Iterator<Item = &'o mut [f32]>,
    ) {
        let mut pairs = weights.zip(outs);
        match self {
            #[cfg(target_arch = "x86_64")]
            Ops::Avx512 => in_threes!(pairs, avx512::accumulate, values),
            #[cfg(target_arch = "x86_64")]
            Ops::Avx2 => in_threes!(pairs, avx2::accumulate, values),
            _ => {
                for (weights, out) in pairs {
                    let d = out.len();
                    for (w, value) in weights.iter().zip(values.chunks_exact(d)) {
                        for (o, x) in out.iter_mut().zip(value) {
                            *o += w * x.f32();
                        }
                    }
                }
            }
        }
    }
}

/// The kernels in 256-bit vectors, up to three query heads of a row at a time so that each
/// key or value loaded serves all of them, built twice from one source: for AVX2's sixteen
/// vector registers, and for the thirty-two that AVX-512 gives the same 256-bit instructions,
/// where twice the keys a step and a 64-wide head's whole output stay in registers (on sixteen,
/// that tile spilled accumulators to the stack on every key). A score is the FMA chain over its
/// 8-wide chunks and the same tree of horizontal adds as [`decode`]'s, and each output adds the
/// keys' terms in order, so neither build nor grouping changes a value.
macro_rules! kernels {
    ($name:ident, $features:tt, keys: $keys:expr, chunks: $chunks:expr) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use std::arch::x86_64::*;

            use super::super::decode::Elem;

            /// Keys per step of the scores (a multiple of 4): with three query heads, their
            /// accumulators, the queries' chunks and a key's fill the registers.
            const KEYS: usize = $keys;

            /// 8-wide output chunks per step of the weighted sum.
            const CHUNKS: usize = $chunks;

            /// `weights[j] = query · keys[j] · scale` for each `(query, weights)` pair.
            ///
            /// # Safety
            /// The CPU must have this build's features; each query's width `d` must be a
            /// multiple of 8, `keys` hold `weights.len()` keys of `d` values.
            #[target_feature(enable = $features)]
            pub unsafe fn scores<E: Elem, const Q: usize>(
                mut pairs: [(&[f32], &mut [f32]); Q],
                keys: &[E],
                scale: f32,
            ) {
                let d = pairs[0].0.len();
                let n = pairs[0].1.len();
                let queries: [*const f32; Q] = std::array::from_fn(|i| pairs[i].0.as_ptr());
                let scale = _mm_set1_ps(scale);
                let mut j = 0;
                while j < n {
                    let m = (n - j).min(KEYS);
                    // The last step repeats its last key in the lanes past `m` (computed,
                    // dropped).
                    let mut rows = [keys.as_ptr(); KEYS];
                    for (t, row) in rows.iter_mut().enumerate() {
                        // SAFETY: key `j + min(t, m - 1)` is one of the `n` keys.
                        *row = unsafe { keys.as_ptr().add((j + t.min(m - 1)) * d) };
                    }
                    // SAFETY: the caller's features; `d`-wide queries and keys.
                    let sums = unsafe { step::<E, Q>(queries, rows, d / 8) };
                    for (sums, (_, weights)) in sums.into_iter().zip(pairs.iter_mut()) {
                        let sums = sums.map(|four| _mm_mul_ps(four, scale));
                        if m == KEYS {
                            for (i, four) in sums.into_iter().enumerate() {
                                // SAFETY: weights `j + 4i..j + 4i + 4` are within the `n`.
                                unsafe { _mm_storeu_ps(weights.as_mut_ptr().add(j + 4 * i), four) };
                            }
                        } else {
                            let mut all = [0f32; KEYS];
                            for (four, all) in sums.into_iter().zip(all.chunks_exact_mut(4)) {
                                // SAFETY: `all` holds 4 writable f32s.
                                unsafe { _mm_storeu_ps(all.as_mut_ptr(), four) };
                            }
                            for (w, x) in weights[j..j + m].iter_mut().zip(all) {
                                *w = x;
                            }
                        }
                    }
                    j += KEYS;
                }
            }

            /// Each query's dot products with the keys at `rows`, four keys to a vector.
            ///
            /// # Safety
            /// The CPU must have this build's features; queries and keys hold `chunks`
            /// 8-wide chunks.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn step<E: Elem, const Q: usize>(
                queries: [*const f32; Q],
                rows: [*const E; KEYS],
                chunks: usize,
            ) -> [[__m128; KEYS / 4]; Q] {
                let mut acc = [[_mm256_setzero_ps(); KEYS]; Q];
                for c in 0..chunks {
                    let mut q = [_mm256_setzero_ps(); Q];
                    for (q, query) in q.iter_mut().zip(queries) {
                        // SAFETY: chunk `c` of a query.
                        *q = unsafe { _mm256_loadu_ps(query.add(c * 8)) };
                    }
                    for (t, row) in rows.iter().enumerate() {
                        // SAFETY: chunk `c` of a key; the caller's features.
                        let k = unsafe { E::load8(&*row.add(c * 8).cast::<[E; 8]>()) };
                        for (acc, q) in acc.iter_mut().zip(q) {
                            acc[t] = _mm256_fmadd_ps(q, k, acc[t]);
                        }
                    }
                }
                let mut sums = [[_mm_setzero_ps(); KEYS / 4]; Q];
                for (sums, acc) in sums.iter_mut().zip(&acc) {
                    for (sum, four) in sums.iter_mut().zip(acc.chunks_exact(4)) {
                        *sum = sums4([four[0], four[1], four[2], four[3]]);
                    }
                }
                sums
            }

            /// `out += Σ weights[j] · values[j]` for each `(weights, out)` pair, key after key.
            ///
            /// # Safety
            /// The CPU must have this build's features; each output's width `d` must be a
            /// multiple of 8, `values` hold `weights.len()` rows of `d` values.
            #[target_feature(enable = $features)]
            pub unsafe fn accumulate<E: Elem, const Q: usize>(
                mut pairs: [(&[f32], &mut [f32]); Q],
                values: &[E],
            ) {
                let chunks = pairs[0].1.len() / 8;
                let mut first = 0;
                while first + CHUNKS <= chunks {
                    // SAFETY: the caller's.
                    unsafe { sum_chunks::<E, Q, CHUNKS>(&mut pairs, values, first) };
                    first += CHUNKS;
                }
                while first < chunks {
                    // SAFETY: the caller's.
                    unsafe { sum_chunks::<E, Q, 1>(&mut pairs, values, first) };
                    first += 1;
                }
            }

            /// [`accumulate`] of output chunks `first..first + M`, kept in registers across
            /// the keys.
            ///
            /// # Safety
            /// As [`accumulate`]'s, and chunks `first..first + M` lie within `d`.
            #[target_feature(enable = $features)]
            #[inline]
            unsafe fn sum_chunks<E: Elem, const Q: usize, const M: usize>(
                pairs: &mut [(&[f32], &mut [f32]); Q],
                values: &[E],
                first: usize,
            ) {
                let d = pairs[0].1.len();
                let n = pairs[0].0.len();
                let mut acc = [[_mm256_setzero_ps(); M]; Q];
                for (acc, (_, out)) in acc.iter_mut().zip(pairs.iter()) {
                    for (c, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: chunk `first + c` of a `d`-wide output.
                        *acc = unsafe { _mm256_loadu_ps(out.as_ptr().add((first + c) * 8)) };
                    }
                }
                for j in 0..n {
                    // SAFETY: row `j` of the `n` rows of values.
                    let row = unsafe { values.as_ptr().add(j * d + first * 8) };
                    let mut w = [_mm256_setzero_ps(); Q];
                    for (w, (weights, _)) in w.iter_mut().zip(pairs.iter()) {
                        // SAFETY: `j` is below `n`, the weights' length.
                        *w = _mm256_set1_ps(unsafe { *weights.get_unchecked(j) });
                    }
                    for c in 0..M {
                        // SAFETY: chunk `first + c` of the row; the caller's features.
                        let x = unsafe { E::load8(&*row.add(c * 8).cast::<[E; 8]>()) };
                        for (acc, w) in acc.iter_mut().zip(w) {
                            acc[c] = _mm256_fmadd_ps(w, x, acc[c]);
                        }
                    }
                }
                for (acc, (_, out)) in acc.iter().zip(pairs.iter_mut()) {
                    for (c, acc) in acc.iter().enumerate() {
                        // SAFETY: as above.
                        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add((first + c) * 8), *acc) };
                    }
                }
            }

            /// The sum of each of four vectors' lanes: `((x0 + x1) + (x2 + x3)) + ((x4 + x5)
            /// + (x6 + x7))`, the tree of [`super::decode`]'s eight-key sums.
            #[target_feature(enable = $features)]
            #[inline]
            fn sums4(a: [__m256; 4]) -> __m128 {
                let all = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
                _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps::<1>(all))
            }
        }
    };
}

kernels!(avx2, "avx2,fma,f16c", keys: 4, chunks: 4);
kernels!(avx512, "avx2,fma,f16c,avx512f,avx512vl", keys: 8, chunks: 8);

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use half::f16;

    use super::{avx2, avx512};

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.7548 + seed).sin()).collect()
    }

    /// Three kernel pairs: each of `x` with the same one of `y`.
    fn three<'a>(x: &'a [Vec<f32>], y: &'a mut [Vec<f32>]) -> [(&'a [f32], &'a mut [f32]); 3] {
        let mut y = y.iter_mut();
        std::array::from_fn(|i| {
            (
                x[i].as_slice(),
                y.next().expect("three outputs").as_mut_slice(),
            )
        })
    }

    /// The AVX-512 build's scores and sums are the AVX2 build's, bit for bit, at head widths
    /// that fill its tiles or leave tails, for as many keys as a step takes or a piece leaves.
    #[test]
    fn both_builds_compute_alike() {
        let has = |f: &[&str]| {
            f.iter().all(|f| match *f {
                "avx512vl" => is_x86_feature_detected!("avx512vl"),
                "avx512f" => is_x86_feature_detected!("avx512f"),
                "avx2" => is_x86_feature_detected!("avx2"),
                "fma" => is_x86_feature_detected!("fma"),
                _ => is_x86_feature_detected!("f16c"),
            })
        };
        // Only a CPU with both builds' features can compare them; CI's machines have them.
        if !has(&["avx2", "fma", "f16c", "avx512f", "avx512vl"]) {
            return;
        }
        for d in [8, 24, 64, 128] {
            for n in [1, 3, 7, 8, 9, 64, 67] {
                let keys = values(n * d, 0.3);
                let half: Vec<f16> = keys.iter().map(|&x| f16::from_f32(x)).collect();
                let queries: Vec<Vec<f32>> = (0..3).map(|h| values(d, 1.0 + h as f32)).collect();
                let weights: Vec<Vec<f32>> = (0..3).map(|h| values(n, 2.0 + h as f32)).collect();
                let outs: Vec<Vec<f32>> = (0..3).map(|h| values(d, 3.0 + h as f32)).collect();
                let [mut scores_a, mut scores_b] = [0, 1].map(|_| vec![vec![0f32; n]; 3]);
                let [mut sums_a, mut sums_b] = [0, 1].map(|_| outs.clone());
                let [mut half_a, mut half_b] = [0, 1].map(|_| outs.clone());
                // SAFETY: the CPU has both builds' features (checked above); `d` is a
                // multiple of 8 and the slices hold `n` keys of `d` values.
                unsafe {
                    avx2::scores(three(&queries, &mut scores_a), &keys, 0.125);
                    avx512::scores(three(&queries, &mut scores_b), &keys, 0.125);
                    avx2::accumulate(three(&weights, &mut sums_a), &keys);
                    avx512::accumulate(three(&weights, &mut sums_b), &keys);
                    avx2::accumulate(three(&weights, &mut half_a), &half);
                    avx512::accumulate(three(&weights, &mut half_b), &half);
                }
                let bits = |x: &[Vec<f32>]| -> Vec<u32> {
                    x.concat().iter().map(|v| v.to_bits()).collect()
                };
                assert_eq!(bits(&scores_a), bits(&scores_b), "scores, d {d}, {n} keys");
                assert_eq!(bits(&sums_a), bits(&sums_b), "sums, d {d}, {n} keys");
                assert_eq!(bits(&half_a), bits(&half_b), "f16 sums, d {d}, {n} keys");
                assert_ne!(bits(&sums_a), bits(&outs), "the sums added nothing");
            }
        }
    }
}
