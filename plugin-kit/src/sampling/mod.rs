//! Choosing the next token: greedy, or sampled with temperature, top-k and top-p from a seeded
//! generator (the same seed gives the same tokens on every platform). Log-probabilities always
//! come from the raw logits, before any warping.

mod row;

use lmhost_plugin_api::GenerationConfig;

/// splitmix64: small, seedable and stable across versions, unlike a library RNG's stream.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// log-softmax of one row of logits, in f64 for the sum.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let (max, log_sum) = log_normalizer(logits);
    logits.iter().map(|&l| l - max - log_sum).collect()
}

/// log p(`index`) from a row of logits, as `log_softmax` gives it, without the row it builds
/// (Gemma 3's vocabulary is 262144 wide, and decode asks for one entry per token).
pub fn log_softmax_at(logits: &[f32], index: usize) -> Option<f32> {
    let l = *logits.get(index)?;
    let (max, log_sum) = log_normalizer(logits);
    Some(l - max - log_sum)
}

/// The row's largest logit and log Σ exp(l - max): f32 exponentials summed in f64.
fn log_normalizer(logits: &[f32]) -> (f32, f32) {
    let max = row::max(logits);
    (max, row::exp_sum(logits, max, 1.0, None).ln() as f32)
}

/// The index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    row::argmax(logits) as u32
}

/// Warping parameters.
#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
}

impl Sampler {
    /// The sampler a generation config asks for.
    pub fn of(config: &GenerationConfig) -> Sampler {
        Sampler {
            temperature: config.temperature,
            top_k: config.top_k as usize,
            top_p: config.top_p,
        }
    }

    /// The next token: greedy at temperature 0, else sampled from the warped distribution: the
    /// tokens taken best first (by logit, then id), cut to the `top_k` best and then to the
    /// fewest whose probability reaches `top_p`, and the uniform draw spent along that order.
    /// Only as much of the order is sorted as the walk reaches: a full sort of a vocabulary's
    /// row cost more than a decode step's arithmetic (`bench_sampling`).
    pub fn pick(&self, logits: &[f32], rng: &mut Rng) -> u32 {
        if self.temperature <= 0.0 || logits.is_empty() {
            return argmax(logits);
        }
        let max = row::max(logits);
        let mut weights = vec![0f32; logits.len()];
        let all = row::exp_sum(logits, max, self.temperature, Some(&mut weights));
        let weight = |id: u32| f64::from(weights[id as usize]);
        let mut ranked = Ranked::new(logits);
        let (limit, total) = match self.top_k {
            k if k > 0 && k < logits.len() => (k, ranked.best(k).map(weight).sum()),
            _ => (logits.len(), all),
        };
        let mut keep = limit;
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            for n in 0..limit {
                acc += weight(ranked.at(n)) / total;
                if acc >= f64::from(self.top_p) {
                    keep = n + 1;
                    break;
                }
            }
        }
        let kept_total: f64 = match keep == limit {
            true => total,
            false => ranked.best(keep).map(weight).sum(),
        };
        let mut target = rng.uniform() * kept_total;
        for n in 0..keep {
            let id = ranked.at(n);
            if target < weight(id) {
                return id;
            }
            target -= weight(id);
        }
        ranked.at(keep - 1)
    }
}

/// Token ids best first (by logit, then id), sorted only as far as asked for: each time the
/// walk passes the sorted part, the best of the rest are selected (linear time) and sorted.
/// Each id is held in a key that orders as its rank: the logit's bits made to order as the
/// floats do (`f32::total_cmp`), then the id's complement, so comparing keys reads no logit.
struct Ranked {
    keys: Vec<u64>,
    sorted: usize,
}

impl Ranked {
    /// Ids sorted at first: the head of a language model's distribution, most walks' end.
    const FIRST: usize = 256;

    fn new(logits: &[f32]) -> Self {
        let keys = logits
            .iter()
            .zip(0u32..)
            .map(|(l, id)| {
                let bits = l.to_bits();
                let ordered = if bits >> 31 == 1 {
                    !bits
                } else {
                    bits | 1 << 31
                };
                u64::from(ordered) << 32 | u64::from(!id)
            })
            .collect();
        Ranked { keys, sorted: 0 }
    }

    /// The id ranked `n` (from 0), sorting at least twice as far as before when `n` is past
    /// the sorted part.
    fn at(&mut self, n: usize) -> u32 {
        if n >= self.sorted {
            self.sort((n + 1).max(2 * self.sorted).max(Self::FIRST));
        }
        !(self.keys[n] as u32)
    }

    /// The `k` best ids in order (all of them when `k` is past the row).
    fn best(&mut self, k: usize) -> impl Iterator<Item = u32> + '_ {
        let k = self.sort(k);
        self.keys[..k].iter().map(|&key| !(key as u32))
    }

    /// Sorts the `k` best keys (at most all), returning how many are sorted now.
    fn sort(&mut self, k: usize) -> usize {
        let k = k.min(self.keys.len());
        if k > self.sorted {
            let rest = &mut self.keys[self.sorted..];
            let wanted = k - self.sorted;
            if wanted < rest.len() {
                rest.select_nth_unstable_by(wanted - 1, |a, b| b.cmp(a));
            }
            rest[..wanted].sort_unstable_by(|a, b| b.cmp(a));
            self.sorted = k;
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalizes() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let total: f32 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!((lp[2] - lp[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn greedy_top_k_and_seeds() {
        let logits = [0.0, 5.0, 4.9, -1.0];
        let greedy = Sampler {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        };
        assert_eq!(greedy.pick(&logits, &mut Rng::new(1)), 1);
        let top2 = Sampler {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
        };
        let picks: Vec<u32> = (0..200)
            .map(|s| top2.pick(&logits, &mut Rng::new(s)))
            .collect();
        assert!(picks.iter().all(|&p| p == 1 || p == 2));
        assert!(picks.contains(&1) && picks.contains(&2));
        let again: Vec<u32> = (0..200)
            .map(|s| top2.pick(&logits, &mut Rng::new(s)))
            .collect();
        assert_eq!(picks, again);
        let nucleus = Sampler {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.01,
        };
        assert!((0..50).all(|s| nucleus.pick(&logits, &mut Rng::new(s)) == 1));
    }

    /// The walk over a partly sorted order picks what the same arithmetic over the fully
    /// sorted order picks: walks that end in the first sorted ids, and walks past them (a
    /// flat row at a high temperature), with and without top-k and top-p.
    #[test]
    fn sorting_only_what_the_walk_reaches_picks_as_a_full_sort() {
        let logits: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919 % 5003) as f32 / 5003.0).powi(8) * 12.0)
            .collect();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        let full = |s: &Sampler, seeds: std::ops::Range<u64>| -> Vec<u32> {
            let mut weights = vec![0f32; logits.len()];
            let max = row::max(&logits);
            let all = row::exp_sum(&logits, max, s.temperature, Some(&mut weights));
            let w = |id: u32| f64::from(weights[id as usize]);
            let limit = if s.top_k > 0 { s.top_k } else { order.len() };
            let total = match s.top_k > 0 {
                true => order[..limit].iter().map(|&i| w(i)).sum(),
                false => all,
            };
            let mut keep = limit;
            let mut acc = 0.0;
            for (n, &id) in order[..limit].iter().enumerate() {
                acc += w(id) / total;
                if s.top_p < 1.0 && acc >= f64::from(s.top_p) {
                    keep = n + 1;
                    break;
                }
            }
            let kept: f64 = match keep == limit {
                true => total,
                false => order[..keep].iter().map(|&i| w(i)).sum(),
            };
            let walk = |seed: u64| {
                let mut target = Rng::new(seed).uniform() * kept;
                for &id in &order[..keep] {
                    if target < w(id) {
                        return id;
                    }
                    target -= w(id);
                }
                order[keep - 1]
            };
            seeds.map(walk).collect()
        };
        for (temperature, top_k, top_p) in [
            (1.0, 0, 1.0),
            (3.0, 0, 1.0),
            (0.7, 40, 1.0),
            (1.0, 0, 0.9),
            (5.0, 0, 0.95),
            (1.5, 600, 0.5),
        ] {
            let s = Sampler {
                temperature,
                top_k,
                top_p,
            };
            let picks: Vec<u32> = (0..300)
                .map(|seed| s.pick(&logits, &mut Rng::new(seed)))
                .collect();
            assert_eq!(picks, full(&s, 0..300), "{s:?}");
            if temperature >= 3.0 {
                // These walks went past the first sorted ids.
                let deep = picks
                    .iter()
                    .filter(|p| !order[..Ranked::FIRST].contains(p))
                    .count();
                assert!(deep > 30, "{deep} of 300 past the first {}", Ranked::FIRST);
            }
        }
    }

    /// Sampled tokens come at their softmax probabilities (at the temperature).
    #[test]
    fn sampled_frequencies_follow_the_softmax() {
        let logits = [0.0, 1.0, 2.0, 3.0, f32::NEG_INFINITY];
        let s = Sampler {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
        };
        let mut rng = Rng::new(7);
        let mut counts = [0usize; 5];
        let draws = 40_000;
        for _ in 0..draws {
            counts[s.pick(&logits, &mut rng) as usize] += 1;
        }
        let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / 0.8).exp()).collect();
        let total: f64 = e.iter().sum();
        for (count, e) in counts.iter().zip(&e) {
            let p = e / total;
            assert!(
                (*count as f64 / draws as f64 - p).abs() < 0.01,
                "{counts:?}"
            );
        }
        assert_eq!(counts[4], 0);
    }
}
