//! What continuous batching buys on SmolLM2, without a server in the way:
//! 1. one packed pass of N decode rows (each sequence after its own prompt, the passes in a
//!    rayon pool as the backend runs them) timed against N = 1: decode is memory-bound, so a
//!    pass of 8 rows should cost far less than 8 single-row passes, and the "vs N x 1" column
//!    says how far; and what a pass allocates (every thread's heap allocations, counted by
//!    this program's allocator);
//! 2. N threads generating at once through the backend (as `serve`'s workers do): aggregate
//!    tokens/s against one thread's, and the mean rows per decode pass the batcher formed.
//!
//! Prints figures; asserts nothing. `cargo run --release --example bench_batch` (after
//! `scripts/fetch-models`). Environment: `BENCH_WEIGHTS=auto` and `BENCH_KV=auto` (the
//! backend's `weights` and `kv_cache_dtype` options), `BENCH_ROWS=1,2,4,8,16`,
//! `BENCH_CONTEXT=160` (prompt tokens before decoding, up to 3000), `BENCH_STEPS=24` (passes
//! per size), `BENCH_THREADS=1,8` (concurrent generations of `BENCH_TOKENS=48` tokens each).

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use lmhost_candle::batch::decode_pass;
use lmhost_candle::kv::KvState;
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, GenerationConfig, KvCacheSettings, PluginContext,
};

const MODEL: &str = "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const TEXT: &str = "The quick brown fox jumps over the lazy dog while the committee debates the \
                    budget for the new library, and nobody remembers who ordered pizza. ";

/// The system allocator, counting allocations (reallocations too) and the bytes asked for.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed on to `System` unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: the caller's promises, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations and bytes so far.
fn allocated() -> (u64, u64) {
    (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

fn main() -> anyhow::Result<()> {
    lmhost_candle::tune_thread_env();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = root.join(MODEL);
    anyhow::ensure!(
        path.is_file(),
        "{} is missing: run scripts/fetch-models",
        path.display()
    );
    let weights_opt = env_or("BENCH_WEIGHTS", "auto");
    let kv_opt = env_or("BENCH_KV", "auto");
    let context: usize = env_or("BENCH_CONTEXT", "160").parse()?;
    let steps: usize = env_or("BENCH_STEPS", "24").parse()?;
    let sizes: Vec<usize> = env_or("BENCH_ROWS", "1,2,4,8,16")
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let plugin = PluginContext::new("candle", &path.to_string_lossy())
        .with_options(json!({ "weights": weights_opt, "kv_cache_dtype": kv_opt }));
    let backend = Candle::new(plugin)?;
    let engine = backend.engine()?;
    let model = &engine.model;
    let ids = engine.front.encode(&TEXT.repeat(120), true)?;
    let prompt = ids.get(..context).context("prompt too short")?;
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    let mut base = None;
    println!("1. packed decode passes, SmolLM2 weights={weights_opt} kv_cache_dtype={kv_opt}, {context} prompt tokens each, {steps} passes per size");
    println!("| rows | ms per pass | ms per row | vs N x 1 | allocations per pass | KiB allocated per pass |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for &n in &sizes {
        // Each row its own sequence, offset by one token so the states differ.
        let mut states: Vec<KvState> = (0..n)
            .map(|i| {
                let mut kv = model.new_state();
                model.forward(
                    &prompt[i % 8..],
                    &mut kv,
                    lmhost_candle::models::Logits::Last,
                    false,
                )?;
                Ok(kv)
            })
            .collect::<anyhow::Result<_>>()?;
        let tokens: Vec<u32> = (0..n).map(|i| ids[context + i]).collect();
        // In a pool of its own, as the backend runs every pass.
        let pass = |states: &mut [KvState]| -> anyhow::Result<()> {
            pool.install(|| {
                decode_pass(
                    &**model,
                    states.iter_mut().zip(&tokens).map(|(kv, t)| (kv, *t)),
                )
            })?;
            Ok(())
        };
        pass(&mut states)?;
        let (count, bytes) = allocated();
        let t = Instant::now();
        for _ in 0..steps {
            pass(&mut states)?;
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let (count, bytes) = {
            let (now_count, now_bytes) = allocated();
            (now_count - count, now_bytes - bytes)
        };
        let one = *base.get_or_insert(ms);
        println!(
            "| {n} | {ms:.2} | {:.2} | {:.2}x | {} | {:.0} |",
            ms / n as f64,
            ms / (one * n as f64),
            count / steps as u64,
            bytes as f64 / 1024.0 / steps as f64
        );
    }
    let threads: Vec<usize> = env_or("BENCH_THREADS", "1,8")
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let tokens: u32 = env_or("BENCH_TOKENS", "48").parse()?;
    concurrent(&backend, &threads, tokens)
}

/// Section 2: `n` threads each generating `tokens` greedy tokens for a question of its own,
/// with the prefix cache on as `serve` has it (the chat template's system prompt is shared).
fn concurrent(backend: &Candle, threads: &[usize], tokens: u32) -> anyhow::Result<()> {
    backend.set_kv_cache(KvCacheSettings {
        enabled: true,
        max_entries: 256,
        max_bytes: 2 << 30,
    })?;
    let config = GenerationConfig {
        max_new_tokens: tokens,
        ..GenerationConfig::default()
    };
    let ask = |i: usize| {
        let prompt = format!("Thread {i} asks: write a few sentences about topic number {i}.");
        ConversationSnapshot::from_prompt(prompt)
    };
    backend.generate(&ask(0), &config)?; // warm-up
    println!();
    println!("2. concurrent generations of up to {tokens} tokens through the backend");
    println!("| threads | tokens | tok/s | vs 1 thread | rows per pass |");
    println!("| --- | --- | --- | --- | --- |");
    let mut base = None;
    for &n in threads {
        let (passes_before, steps_before) = backend.decode_passes();
        let t = Instant::now();
        let (config, ask) = (&config, &ask);
        let generated = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| s.spawn(move || backend.generate(&ask(i + 1), config)))
                .collect();
            handles.into_iter().try_fold(0, |sum, h| {
                let record = h
                    .join()
                    .map_err(|_| anyhow::anyhow!("a generation panicked"))??;
                anyhow::Ok(sum + record.token_ids.len())
            })
        })?;
        let rate = generated as f64 / t.elapsed().as_secs_f64();
        let (passes, steps) = backend.decode_passes();
        let rows = (steps - steps_before) as f64 / (passes - passes_before).max(1) as f64;
        let one = *base.get_or_insert(rate);
        println!(
            "| {n} | {generated} | {rate:.1} | {:.2}x | {rows:.2} |",
            rate / one
        );
    }
    Ok(())
}
