//! The per-key operations of attention, shared by a prompt's rows ([`super::fused`]) and a
//! decode pass's ([`super::decode`]): each query head's scores against a run of keys, a
//! softmax over them, and the weighted sum of their values.
//!
//! Every path computes a (query, key) score as the same chain of operations, and each output
//! as the same sum over the keys in position order, whatever the grouping of queries and keys
//! and whichever vector build runs: so a row comes out bit for bit the same whether it is
//! decoded alone, scored in a pass of many, or after a prefix from the cache.

use super::decode::Elem;

/// Lanes of the scalar path's partial sums, so that it vectorizes (two SSE registers).
const LANES: usize = 8;

/// The per-key operations on the fastest path this CPU has, chosen once per call so that every
/// row of the call is computed alike. Each query's score against a key and each output's sum
/// over the keys come out the same however the queries and keys are grouped, and on either
/// vector build.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Ops {
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
    pub(super) fn new(d: usize) -> Self {
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
    pub(super) fn scores<'q, 'w, E: Elem>(
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
                        *w = dot(query, key) * scale;
                    }
                }
            }
        }
    }

    pub(super) fn softmax(self, scores: &mut [f32]) {
        if scores.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if !matches!(self, Ops::Scalar) {
            // SAFETY: `Ops::new` found AVX2 and FMA.
            unsafe { softmax8(scores) };
            return;
        }
        softmax(scores);
    }

    /// [`Ops::exp_sum`] for weights that are rounded to bf16 next: within 6e-6 of `e^(s -
    /// max)` (bf16 keeps 2⁻⁹ of it), in two thirds of the instructions. Every score must be at
    /// most `max`.
    pub(super) fn coarse_exp_sum(self, scores: &mut [f32], max: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if !matches!(self, Ops::Scalar) {
            // SAFETY: `Ops::new` found AVX2 and FMA.
            return unsafe { coarse_exp_sum8(scores, max) };
        }
        exp_sum(scores, max)
    }

    /// The largest of `scores` and `floor` (a NaN score is passed over, as `f32::max` does).
    pub(super) fn largest(self, scores: &[f32], floor: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if !matches!(self, Ops::Scalar) {
            // SAFETY: `Ops::new` found AVX2.
            return unsafe { largest8(scores, floor) };
        }
        scores.iter().copied().fold(floor, f32::max)
    }

    /// Each score `s` into `e^(s - max)`, in place; returns their sum, added as
    /// [`Ops::softmax`] adds them.
    pub(super) fn exp_sum(self, scores: &mut [f32], max: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if !matches!(self, Ops::Scalar) {
            // SAFETY: `Ops::new` found AVX2 and FMA.
            return unsafe { exp_sum8(scores, max) };
        }
        exp_sum(scores, max)
    }

    /// Each output `+= Σ weights[j] · values[j]`, one key after another, for consecutive
    /// values of `d` each.
    pub(super) fn accumulate<'w, 'o, E: Elem>(
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
/// 8-wide chunks, its lanes then added by one tree of horizontal adds (`sums4`), and each
/// output adds the keys' terms in order, so neither build nor grouping changes a value. (The
/// scalar [`dot`], for CPUs without AVX2, adds its lanes in another order.)
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
            /// + (x6 + x7))`, as every build reduces a score's lanes.
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

/// Scores into probabilities, in place.
fn softmax(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_sum(scores, max);
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

/// Each score `s` into `e^(s - max)`, in place; returns their sum.
fn exp_sum(scores: &mut [f32], max: f32) -> f32 {
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    sum
}

/// `a · b` in [`LANES`] partial sums added as a tree.
fn dot<E: Elem>(a: &[f32], b: &[E]) -> f32 {
    let mut acc = [0f32; LANES];
    let (a_body, a_tail) = a.as_chunks::<LANES>();
    let (b_body, b_tail) = b.as_chunks::<LANES>();
    for (x, y) in a_body.iter().zip(b_body) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l].f32();
        }
    }
    let tail: f32 = a_tail.iter().zip(b_tail).map(|(x, y)| x * y.f32()).sum();
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0] + tail
}

#[cfg(target_arch = "x86_64")]
mod softmax8 {
    use std::arch::x86_64::*;

    use crate::models::glu::exp8;

    /// Scores into probabilities, in place, 8 at a time: the same steps as the scalar
    /// [`super::softmax`] (max, `exp(s - max)`, their sum, each divided by it), the
    /// exponentials [`crate::models::glu`]'s (within 2 ulp of libm's).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax8(scores: &mut [f32]) {
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let total = exp_sum8(scores, max);
        let (body, tail) = scores.as_chunks_mut::<8>();
        let by = _mm256_set1_ps(total);
        for s in body.iter_mut() {
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), _mm256_div_ps(load(s), by)) };
        }
        for s in tail.iter_mut() {
            *s /= total;
        }
    }

    /// The largest of `scores` and `floor`, 8 lanes at a time: `vmaxps` keeps its second
    /// operand where the first is NaN, as `f32::max` passes over a NaN.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn largest8(scores: &[f32], floor: f32) -> f32 {
        let (body, tail) = scores.as_chunks::<8>();
        let mut top = _mm256_set1_ps(floor);
        for s in body {
            top = _mm256_max_ps(load(s), top);
        }
        let half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        let pair = _mm_max_ps(half, _mm_movehl_ps(half, half));
        let one = _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)));
        tail.iter().copied().fold(one, f32::max)
    }

    /// Each score `s` into `e^(s - max)`, in place, 8 at a time; returns their sum: each lane's
    /// running sum, the lanes added as a tree, then the tail's in order.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_sum8(scores: &mut [f32], max: f32) -> f32 {
        let (body, tail) = scores.as_chunks_mut::<8>();
        let mut sums = _mm256_setzero_ps();
        for s in body.iter_mut() {
            let e = exp8(_mm256_sub_ps(load(s), _mm256_set1_ps(max)));
            sums = _mm256_add_ps(sums, e);
            // SAFETY: `s` is 8 writable f32s; the store is unaligned.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), e) };
        }
        let mut total = sum(sums);
        for s in tail.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        total
    }

    /// [`exp_sum8`] with `e^x = 2^n · 2^f` (`x log₂e = n + f`, `|f| ≤ ½`), `2^f` by its
    /// Taylor polynomial of degree 5 (relative error under 2.4e-6; `x log₂e` rounds by at
    /// most 2⁻²⁴ of it, 5e-6 of the result at `x = -87`, where weights are 1e-38); inputs
    /// are at most 0 and clamped below where `2^n` is a normal float.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn coarse_exp_sum8(scores: &mut [f32], max: f32) -> f32 {
        let (body, tail) = scores.as_chunks_mut::<8>();
        let mut sums = _mm256_setzero_ps();
        for s in body.iter_mut() {
            let e = exp2(_mm256_sub_ps(load(s), _mm256_set1_ps(max)));
            sums = _mm256_add_ps(sums, e);
            // SAFETY: `s` is 8 writable f32s; the store is unaligned.
            unsafe { _mm256_storeu_ps(s.as_mut_ptr(), e) };
        }
        let mut total = sum(sums);
        for s in tail.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        total
    }

    /// `e^x` for `x ≤ 0`, as [`coarse_exp_sum8`] computes it.
    #[target_feature(enable = "avx2,fma")]
    fn exp2(x: __m256) -> __m256 {
        const LN2: f32 = std::f32::consts::LN_2;
        let t = _mm256_mul_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
        let f = _mm256_sub_ps(t, n);
        let mut p = _mm256_set1_ps(LN2.powi(5) / 120.0);
        for c in [
            LN2.powi(4) / 24.0,
            LN2.powi(3) / 6.0,
            LN2 * LN2 / 2.0,
            LN2,
            1.0,
        ] {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
        }
        let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(p, _mm256_castsi256_ps(two_n))
    }

    #[target_feature(enable = "avx2,fma")]
    fn load(x: &[f32; 8]) -> __m256 {
        // SAFETY: `x` is 8 readable f32s; the load is unaligned.
        unsafe { _mm256_loadu_ps(x.as_ptr()) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn sum(x: __m256) -> f32 {
        let half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
    }
}

#[cfg(target_arch = "x86_64")]
use softmax8::{coarse_exp_sum8, exp_sum8, largest8, softmax8};

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

    /// The exponentials of `sdpa_bf16`'s weights stay within the precision the doc of
    /// [`super::Ops::coarse_exp_sum`] states, over every input it can be given (at most 0,
    /// down to where weights underflow), and their sum is the sum of what they wrote.
    #[test]
    fn coarse_exponentials_keep_their_stated_precision() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let xs: Vec<f32> = (0..=87_000).map(|i| -(i as f32) * 1e-3).collect();
        let mut es = xs.clone();
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        let sum = unsafe { super::coarse_exp_sum8(&mut es, 0.0) };
        let worst = xs
            .iter()
            .zip(&es)
            .map(|(&x, &e)| ((e as f64 - (x as f64).exp()) / (x as f64).exp()).abs())
            .fold(0.0, f64::max);
        assert!(worst < 6e-6, "relative error {worst}");
        let added: f64 = es.iter().map(|&e| e as f64).sum();
        assert!(
            ((sum as f64 - added) / added).abs() < 1e-5,
            "{sum} against {added}"
        );
        let mut shifted = [0.5f32, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5];
        // SAFETY: as above.
        unsafe { super::coarse_exp_sum8(&mut shifted, 8.5) };
        assert_eq!(shifted[8], 1.0, "the largest score weighs 1");
        assert!((shifted[0] as f64 - (-8f64).exp()).abs() < 6e-6 * (-8f64).exp());
    }

    /// The AVX-512 build's scores and sums are the AVX2 build's, bit for bit, at head widths
    /// that fill its tiles or leave tails, for as many keys as a step takes or a piece leaves.
    #[test]
    fn both_builds_compute_alike() {
        // Only a CPU with both builds' features can compare them; CI's machines have them.
        let both = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl");
        if !both {
            return;
        }
        for d in [8, 24, 64, 128] {
            for n in [1, 3, 7, 8, 9, 64, 67] {
                let keys = values(n * d, 0.3);
                let half: Vec<f16> = keys.iter().map(|&x| f16::from_f32(x)).collect();
                let queries: Vec<Vec<f32>> = (0..3).map(|h| values(d, 1.0 + h as f32)).collect();
                let weights: Vec<Vec<f32>> = (0..3).map(|h| values(n, 2.0 + h as f32)).collect();
                let outs: Vec<Vec<f32>> = (0..3).map(|h| values(d, 3.0 + h as f32)).collect();
                let [mut scores_a, mut scores_b, mut f16_a, mut f16_b] =
                    [0, 1, 2, 3].map(|_| vec![vec![0f32; n]; 3]);
                let [mut sums_a, mut sums_b] = [0, 1].map(|_| outs.clone());
                let [mut half_a, mut half_b] = [0, 1].map(|_| outs.clone());
                // SAFETY: the CPU has both builds' features (checked above); `d` is a
                // multiple of 8 and the slices hold `n` keys of `d` values.
                unsafe {
                    avx2::scores(three(&queries, &mut scores_a), &keys, 0.125);
                    avx512::scores(three(&queries, &mut scores_b), &keys, 0.125);
                    avx2::scores(three(&queries, &mut f16_a), &half, 0.125);
                    avx512::scores(three(&queries, &mut f16_b), &half, 0.125);
                    avx2::accumulate(three(&weights, &mut sums_a), &keys);
                    avx512::accumulate(three(&weights, &mut sums_b), &keys);
                    avx2::accumulate(three(&weights, &mut half_a), &half);
                    avx512::accumulate(three(&weights, &mut half_b), &half);
                }
                let bits = |x: &[Vec<f32>]| -> Vec<u32> {
                    x.concat().iter().map(|v| v.to_bits()).collect()
                };
                assert_eq!(bits(&scores_a), bits(&scores_b), "scores, d {d}, {n} keys");
                assert_eq!(bits(&f16_a), bits(&f16_b), "f16 scores, d {d}, {n} keys");
                assert_eq!(bits(&sums_a), bits(&sums_b), "sums, d {d}, {n} keys");
                assert_eq!(bits(&half_a), bits(&half_b), "f16 sums, d {d}, {n} keys");
                assert_ne!(bits(&sums_a), bits(&outs), "the sums added nothing");
            }
        }
    }
}
