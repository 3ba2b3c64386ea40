//! Choosing the next token: greedy, or sampled with temperature, top-k and top-p from a seeded
//! generator (the same seed gives the same tokens on every platform). Log-probabilities always
//! come from the raw logits, before any warping.

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

/// The row's largest logit and log Σ exp(l - max): f32 exponentials (faster than f64's)
/// summed in f64.
fn log_normalizer(logits: &[f32]) -> (f32, f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    (max, sum.ln() as f32)
}

/// The index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Warping parameters.
#[derive(Debug, Clone, Copy)]
pub struct Sampler {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
}

impl Sampler {
    /// The next token: greedy at temperature 0, else sampled from the warped distribution.
    pub fn pick(&self, logits: &[f32], rng: &mut Rng) -> u32 {
        if self.temperature <= 0.0 {
            return argmax(logits);
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.top_k > 0 {
            order.truncate(self.top_k);
        }
        let max = logits[order[0]];
        let weights: Vec<f64> = order
            .iter()
            .map(|&i| f64::from((logits[i] - max) / self.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        // Nucleus: the smallest prefix whose probability reaches top_p.
        let mut keep = weights.len();
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            for (n, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= f64::from(self.top_p) {
                    keep = n + 1;
                    break;
                }
            }
        }
        let kept_total: f64 = weights[..keep].iter().sum();
        let mut target = rng.uniform() * kept_total;
        for (n, w) in weights[..keep].iter().enumerate() {
            if target < *w {
                return order[n] as u32;
            }
            target -= w;
        }
        order[keep - 1] as u32
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
}
