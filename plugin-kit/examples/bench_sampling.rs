//! What choosing a token costs on a row as wide as SmolLM2's vocabulary (49152): the
//! log-probability every generated token reports, greedy choice, and seeded sampling with
//! temperature, top-k and top-p. The row is shaped like a language model's (a few likely
//! tokens, a long tail), since how far a sampled walk goes depends on it.
//!
//! Prints figures; asserts nothing. `cargo run --release --example bench_sampling -p
//! lmhost-plugin-kit`.

use std::hint::black_box;
use std::time::Instant;

use lmhost_plugin_kit::sampling::{argmax, log_softmax_at, Rng, Sampler};

const VOCAB: u64 = 49152;

/// Microseconds per call of `f`, over `calls` calls.
fn micros(calls: u32, mut f: impl FnMut(u32)) -> f64 {
    let t = Instant::now();
    for i in 0..calls {
        f(i);
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(calls)
}

fn main() {
    // Zipf-like: the token ranked r gets 12 - 2 ln(1 + r), ranks scattered over the ids.
    let row: Vec<f32> = (0..VOCAB)
        .map(|id| {
            let rank = (id * 2_654_435_761) % VOCAB;
            12.0 - 2.0 * ((1 + rank) as f32).ln() + (id as f32 * 0.37).sin()
        })
        .collect();
    println!("| what (a row of {VOCAB}) | µs per token |");
    println!("| --- | --- |");
    let us = micros(2000, |i| {
        black_box(log_softmax_at(black_box(&row), i as usize));
    });
    println!("| log-probability of a token | {us:.1} |");
    let us = micros(2000, |_| {
        black_box(argmax(black_box(&row)));
    });
    println!("| greedy (argmax) | {us:.1} |");
    for (temperature, top_k, top_p) in [(0.7, 0, 1.0), (1.0, 0, 0.9), (0.7, 40, 0.95)] {
        let sampler = Sampler {
            temperature,
            top_k,
            top_p,
        };
        let mut rng = Rng::new(1);
        let us = micros(500, |_| {
            black_box(sampler.pick(black_box(&row), &mut rng));
        });
        println!("| sampled: temperature {temperature}, top_k {top_k}, top_p {top_p} | {us:.1} |");
    }
}
