//! Shared-prefix attention (`attention::fused`) as explain's `hide` coalitions run it: items
//! of 14 query rows each (a question's tail and a reply) after one cached prefix of 2k and 6k
//! positions, a sentence of it hidden from each, on SmolLM2's heads (9 query heads over 3
//! key/value heads of 64). Prints the time of one layer's call, the GFLOP/s of its products
//! (q·k and the weighted sum of v: 4·d flops per row, query head and visible key) and their
//! share of the CPU's peak for that arithmetic at the clock given as `GHZ` (3.7 by default):
//! `sdpa`'s f32 products against two 256-bit FMAs a cycle a core, and `sdpa_bf16`'s (where the
//! CPU has AVX-512 BF16) against one 512-bit `vdpbf16ps`, twice the multiply-adds; for keys
//! kept in f32 and in f16.
//!
//! Prints figures; asserts nothing. `cargo run --release --example bench_attention -p
//! lmhost-candle` (threads: `RAYON_NUM_THREADS`).

use std::ops::Range;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use lmhost_candle::attention::{Attention, AttnParams, Hidden, Sdpa, SdpaBf16, Shared};

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const D: usize = 64;
const ROWS: usize = 14;
const ITEMS: usize = 16;

fn main() -> anyhow::Result<()> {
    let ghz: f64 = std::env::var("GHZ")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(3.7);
    let threads = rayon::current_num_threads();
    // Flops a cycle a core at each arithmetic's peak.
    let mut kinds: Vec<(&str, &dyn Attention, f64)> = vec![("f32", &Sdpa, 32.0)];
    if lmhost_candle::kernels::bf16::available() {
        kinds.push(("bf16", &SdpaBf16, 64.0));
    }
    println!(
        "{ITEMS} items of {ROWS} rows after a shared prefix, {HEADS} query heads over \
         {KV_HEADS} of {D}; {threads} threads at {ghz} GHz"
    );
    println!(
        "{:>7} {:>5} {:>9} {:>10} {:>9} {:>7}",
        "prefix", "kv", "products", "ms/call", "GFLOP/s", "of peak"
    );
    for prefix in [2048, 6144] {
        for dtype in [DType::F32, DType::F16] {
            for &(name, attention, per_cycle) in &kinds {
                let (elapsed, flops) = run(attention, prefix, dtype)?;
                let rate = flops / elapsed.as_secs_f64() / 1e9;
                let peak = threads as f64 * ghz * per_cycle;
                println!(
                    "{prefix:>7} {:>5} {name:>9} {:>10.2} {rate:>9.1} {:>6.0}%",
                    format!("{dtype:?}").to_lowercase(),
                    elapsed.as_secs_f64() * 1e3,
                    100.0 * rate / peak
                );
            }
        }
    }
    Ok(())
}

/// The median time of one call of `attention` over `ITEMS` items after `prefix` positions kept
/// as `dtype`, and the flops of its products.
fn run(attention: &dyn Attention, prefix: usize, dtype: DType) -> anyhow::Result<(Duration, f64)> {
    let cpu = &Device::Cpu;
    let kv = |seed: u64| -> anyhow::Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, (1, KV_HEADS, prefix, D), cpu)?
            .affine(1.0, seed as f64 * 1e-3)?
            .to_dtype(dtype)?)
    };
    let (pk, pv) = (kv(1)?, kv(2)?);
    // Item `i` hides the i-th of the prefix's 16-position sentences.
    let hidden: Vec<Range<usize>> = (0..ITEMS).map(|i| i * 16..i * 16 + 16).collect();
    let inputs = (0..ITEMS)
        .map(|_| {
            let q = Tensor::randn(0f32, 1.0, (1, HEADS, ROWS, D), cpu)?;
            let own = |_| Tensor::randn(0f32, 1.0, (1, KV_HEADS, ROWS, D), cpu)?.to_dtype(dtype);
            Ok((q, own(0)?, own(1)?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let items: Vec<Shared<'_>> = inputs
        .iter()
        .zip(&hidden)
        .map(|((q, k, v), sentence)| Shared {
            q,
            k,
            v,
            params: AttnParams {
                scale: 1.0 / (D as f64).sqrt(),
                n_rep: HEADS / KV_HEADS,
                offset: prefix,
                sliding_window: None,
                hidden: Some(Hidden {
                    from: 0,
                    keys: std::slice::from_ref(sentence),
                }),
                blocks: &[],
            },
        })
        .collect();
    let mut times: Vec<Duration> = (0..7)
        .map(|_| {
            let start = Instant::now();
            attention.forward_shared((&pk, &pv), &items)?;
            Ok(start.elapsed())
        })
        .collect::<anyhow::Result<_>>()?;
    times.sort();
    // Each row sees the prefix less its hidden sentence, and its own rows up to itself.
    let keys: usize = (0..ROWS).map(|r| prefix - 16 + r + 1).sum();
    let flops = (ITEMS * HEADS * keys * 4 * D) as f64;
    Ok((times[times.len() / 2], flops))
}
