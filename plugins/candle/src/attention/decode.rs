//! Attention of a decode pass: every sequence's single query row, each head against its own
//! keys, in one parallel loop over (row, key/value head) that reads keys and values where the
//! sequence's state holds them.
//!
//! A decode query is one row, so the generic path (a GEMM per sequence, over keys that
//! grouped-query attention first copies once per query head and pads) is op overhead and copies
//! more than arithmetic: in a packed pass of 8 rows on SmolLM2 those were about half the pass.
//! Here each (row, head) is a dot product per key, a softmax and a weighted sum of values, with
//! no copy, by the operations a prompt's rows use ([`super::ops`]), so a row decoded is a row
//! scored, bit for bit; the query heads of one key/value head go together, so each key is read
//! once for them all. f32 queries on CPU, against f32 or f16 keys and values (a state kept in
//! f16 is read where it lies, converted 8 values at a time); elsewhere [`rows`] answers `None`
//! and the caller takes the generic path. [`states`] is the same loop for a decode step over
//! buffers of its own (`models/step.rs`): queries from a slice, keys read from each state where
//! they lie.

use std::ops::Range;

use candle_core::{DType, Layout, Result, Tensor};
use half::f16;
use rayon::prelude::*;

use super::ops::Ops;
use super::RowKeys;
use crate::kv::{LayerData, Values};

/// Bytes in a cache line.
const LINE: usize = 64;

/// An element of keys and values as a state stores them, read as f32.
pub(super) trait Elem: Copy + Send + Sync {
    fn f32(self) -> f32;

    /// `x`'s 8 values as f32.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(x: &[Self; 8]) -> std::arch::x86_64::__m256;
}

impl Elem for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(x: &[f32; 8]) -> std::arch::x86_64::__m256 {
        // SAFETY: `x` is 8 readable f32s; the load is unaligned.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(x.as_ptr()) }
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(x: &[f16; 8]) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: `x` is 16 readable bytes (the load is unaligned); the caller's CPU has F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().cast())) }
    }
}

/// The data of a strided `(1, heads, len, head_dim)` tensor on CPU.
pub(super) struct Heads<'a, E> {
    data: &'a [E],
    start: usize,
    head_stride: usize,
    pos_stride: usize,
}

/// A sequence's keys and values, both f32 or both f16.
pub(super) enum Pair<'a> {
    F32(Heads<'a, f32>, Heads<'a, f32>),
    F16(Heads<'a, f16>, Heads<'a, f16>),
}

/// Where head 0's first value is, and the values from one head to the next and from one
/// position to the next.
pub(super) type Strides = (usize, usize, usize);

/// The strides of a `(1, heads, len, head_dim)` layout whose positions' values are
/// contiguous.
pub(super) fn strides(layout: &Layout) -> Option<Strides> {
    match layout.stride() {
        [_, head_stride, pos_stride, 1] => Some((layout.start_offset(), *head_stride, *pos_stride)),
        _ => None,
    }
}

impl<'a, E> Heads<'a, E> {
    fn new(data: &'a [E], (start, head_stride, pos_stride): Strides) -> Self {
        Heads {
            data,
            start,
            head_stride,
            pos_stride,
        }
    }
}

impl<'a> Pair<'a> {
    /// Keys and values laid out as their strides say, if they are of one type.
    pub(super) fn of(
        (k, ks): (Values<'a>, Strides),
        (v, vs): (Values<'a>, Strides),
    ) -> Option<Self> {
        match (k, v) {
            (Values::F32(k), Values::F32(v)) => {
                Some(Pair::F32(Heads::new(k, ks), Heads::new(v, vs)))
            }
            (Values::F16(k), Values::F16(v)) => {
                Some(Pair::F16(Heads::new(k, ks), Heads::new(v, vs)))
            }
            _ => None,
        }
    }

    /// A state's layer as a decode step reads it in place (`d` values a position).
    fn read(data: LayerData<'a>, d: usize) -> Option<Self> {
        let at = (data.start, data.head_stride, d);
        Pair::of((data.k, at), (data.v, at))
    }

    /// Asks the cache for head `h`'s keys and values at positions `keys`.
    fn prefetch(&self, h: usize, keys: Range<usize>, d: usize) {
        match self {
            Pair::F32(k, v) => [k, v].map(|x| x.prefetch(h, keys.clone(), d)),
            Pair::F16(k, v) => [k, v].map(|x| x.prefetch(h, keys.clone(), d)),
        };
    }
}

impl<'a, E: Elem> Heads<'a, E> {
    /// Asks the cache for head `h`'s values at positions `keys`: a hint, never a read.
    #[inline]
    fn prefetch(&self, h: usize, keys: Range<usize>, d: usize) {
        #[cfg(target_arch = "x86_64")]
        for j in keys {
            let row = self.start + h * self.head_stride + j * self.pos_stride;
            let step = LINE / size_of::<E>();
            for at in (row..row + d).step_by(step) {
                let p = self.data.as_ptr().wrapping_add(at);
                // SAFETY: a prefetch reads nothing; SSE is part of x86_64.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast())
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (h, keys, d);
    }

    /// Head `h`'s values at position `j`.
    #[inline(always)]
    fn at(&self, h: usize, j: usize, d: usize) -> &'a [E] {
        let s = self.start + h * self.head_stride + j * self.pos_stride;
        &self.data[s..s + d]
    }

    /// Head `h`'s values at positions `keys`, one after another, where positions lie `d`
    /// values apart (as a state holds them).
    pub(super) fn run(&self, h: usize, keys: Range<usize>, d: usize) -> Option<&'a [E]> {
        let s = self.start + h * self.head_stride + keys.start * self.pos_stride;
        (self.pos_stride == d).then(|| self.data.get(s..s + keys.len() * d))?
    }
}

/// Softmax(q kᵀ · scale + mask) v for each row of `q` `(1, heads, rows, head_dim)` against
/// `rows[i]`, whose keys must end at the query's position; `None` where this path does not
/// apply (queries not f32 on CPU, keys and values not both f32 or both f16, or not laid out
/// as a state holds them).
pub fn rows(q: &Tensor, rows: &[RowKeys<'_>]) -> Result<Option<Tensor>> {
    let (_, heads, n, d) = q.dims4()?;
    let hides = rows.iter().any(|r| r.params.hidden.is_some());
    if q.dtype() != DType::F32 || !q.device().is_cpu() || n != rows.len() || hides {
        return Ok(None);
    }
    let Some(n_rep) = rows.first().map(|r| r.params.n_rep) else {
        return Ok(None);
    };
    for r in rows {
        let (_, kv_heads, len, _) = r.k.dims4()?;
        if len != r.params.offset + 1 || r.params.n_rep != n_rep || kv_heads * n_rep != heads {
            return Ok(None);
        }
    }
    // Row-major `(rows, heads, head_dim)`, so that a task's heads sit together.
    let queries = q.transpose(1, 2)?.flatten_all()?.to_vec1::<f32>()?;
    let guards: Vec<_> = rows
        .iter()
        .map(|r| (r.k.storage_and_layout(), r.v.storage_and_layout()))
        .collect();
    let mut states = Vec::with_capacity(n);
    for ((k, kl), (v, vl)) in &guards {
        let laid = |values, layout| Some((Values::of(values)?, strides(layout)?));
        match laid(k, kl)
            .zip(laid(v, vl))
            .and_then(|(k, v)| Pair::of(k, v))
        {
            Some(pair) => states.push(pair),
            None => return Ok(None),
        }
    }
    let mut out = vec![0f32; n * heads * d];
    let shape = Shape { heads, n_rep, d };
    let query = |r: usize| {
        let p = &rows[r].params;
        (p.offset, p.sliding_window, p.scale as f32)
    };
    attend_all(&queries, &mut out, shape, query, |r, f| f(&states[r]));
    Tensor::from_vec(out, (1, n, heads, d), q.device())?
        .transpose(1, 2)
        .map(Some)
}

/// The heads of a decode pass's queries.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub heads: usize,
    /// Query heads per key/value head.
    pub n_rep: usize,
    pub d: usize,
}

/// Attention of a decode pass read where the states hold their keys: row `r` of `queries`
/// (`(rows, heads, d)` row-major, rotated) is the one query of `states(r)` at `positions[r]`,
/// where its layer `layer` ends (its keys appended), seen through `window`; each head's
/// output goes to `out`, shaped as `queries`. Allocates nothing. `None` where a state's layer
/// is not f32 on CPU or does not end at the row's position.
pub fn states<'s>(
    queries: &[f32],
    out: &mut [f32],
    shape: Shape,
    (layer, window, scale): (usize, Option<usize>, f32),
    positions: &[usize],
    states: &(dyn Fn(usize) -> &'s crate::kv::KvState + Sync),
) -> Option<()> {
    let ends = |r: usize, &at: &usize| {
        let fits = |data: LayerData<'_>| data.len == at + 1 && Pair::read(data, shape.d).is_some();
        states(r).read(layer, fits)
    };
    if !positions
        .iter()
        .enumerate()
        .all(|(r, at)| ends(r, at) == Some(true))
    {
        return None;
    }
    let query = |r: usize| (positions[r], window, scale);
    attend_all(queries, out, shape, query, |r, f| {
        states(r).read(layer, |data| Pair::read(data, shape.d).map(|pair| f(&pair)));
    });
    Some(())
}

/// Each (row, head) of `queries` against the keys `kv(r, f)` hands `f`, at the positions
/// `query(r)`'s offset and window admit.
fn attend_all(
    queries: &[f32],
    out: &mut [f32],
    Shape { heads, n_rep, d }: Shape,
    query: impl Fn(usize) -> (usize, Option<usize>, f32) + Sync,
    kv: impl Fn(usize, &mut dyn FnMut(&Pair<'_>)) + Sync,
) {
    let n = queries.len() / (heads * d).max(1);
    // One task per (row, key/value head): its query heads read the same keys while they are
    // still in cache. Too few of those to share the pool evenly (a lone decode row has as many
    // as key/value heads: 3 on SmolLM2, 1 on Gemma 3 270M), one task per query head.
    let per = if n * (heads / n_rep) >= 4 * rayon::current_num_threads() {
        n_rep
    } else {
        1
    };
    let tasks = n * heads / per.max(1);
    // Chosen once a call, so that every row of the pass is computed alike.
    let ops = Ops::new(d);
    // Task `i`'s row, key/value head and the positions it reads (the window's last keys, up
    // to the query's own).
    let task = |i: usize| {
        let (r, g) = (i * per / heads, i * per % heads / n_rep);
        let (offset, window, scale) = query(r);
        let first = window.map_or(0, |w| (offset + 1).saturating_sub(w));
        (r, g, first..offset + 1, scale)
    };
    out.par_chunks_mut(per * d)
        .zip(queries.par_chunks(per * d))
        .enumerate()
        .for_each(|(i, (out, queries))| {
            // The task after this one is most likely this thread's next (rayon splits the
            // range in halves): its keys and values start on their way to the cache now.
            if i + 1 < tasks {
                let (r, g, keys, _) = task(i + 1);
                kv(r, &mut |pair| pair.prefetch(g, keys.clone(), d));
            }
            let (r, g, keys, scale) = task(i);
            let head = (g, keys, scale, d, ops);
            kv(r, &mut |pair| match pair {
                Pair::F32(k, v) => task_heads(queries, (k, v), head.clone(), out),
                Pair::F16(k, v) => task_heads(queries, (k, v), head.clone(), out),
            });
        });
}

/// A task's query heads (`queries`, `d` values a head) against key/value head `g` at positions
/// `keys`, scaled by `scale`, into `out` by `ops`: each key and value is read once for all of
/// them.
fn task_heads<E: Elem>(
    queries: &[f32],
    (k, v): (&Heads<'_, E>, &Heads<'_, E>),
    (g, keys, scale, d, ops): (usize, Range<usize>, f32, usize, Ops),
    out: &mut [f32],
) {
    let n = keys.len();
    out.fill(0.0);
    if n == 0 {
        return;
    }
    SCORES.with_borrow_mut(|scores| {
        scores.clear();
        scores.resize(n * out.len() / d, 0.0);
        match (k.run(g, keys.clone(), d), v.run(g, keys.clone(), d)) {
            (Some(ks), Some(vs)) => {
                ops.scores(queries.chunks_exact(d), ks, scale, scores.chunks_mut(n));
                scores.chunks_mut(n).for_each(|w| ops.softmax(w));
                ops.accumulate(scores.chunks(n), vs, out.chunks_exact_mut(d));
            }
            // Positions further apart than a head's values: key by key, the same sums.
            _ => {
                for (at, j) in keys.clone().enumerate() {
                    let weights = scores.chunks_mut(n).map(|w| &mut w[at..at + 1]);
                    ops.scores(queries.chunks_exact(d), k.at(g, j, d), scale, weights);
                }
                scores.chunks_mut(n).for_each(|w| ops.softmax(w));
                for (at, j) in keys.enumerate() {
                    let weights = scores.chunks(n).map(|w| &w[at..at + 1]);
                    ops.accumulate(weights, v.at(g, j, d), out.chunks_exact_mut(d));
                }
            }
        }
    });
}

thread_local! {
    /// A task's scores against its keys, reused by every task this thread runs: a decode
    /// step allocates nothing.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
