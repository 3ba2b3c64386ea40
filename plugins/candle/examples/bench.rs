//! Prefill and decode speed on SmolLM2 per weight format and thread count, next to
//! candle-transformers' `quantized_llama` on the same prompt. Prints figures; asserts nothing.
//!
//! `cargo run --release --example bench` (after `scripts/fetch-models`). On a busy machine
//! `BENCH_PREFILL=128 BENCH_THREADS=all` shortens it (chunks larger than the prefill are skipped).

use std::path::PathBuf;
use std::time::Instant;

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use lmhost_candle::models::Logits;
use lmhost_candle::sampling::argmax;
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{Backend, PluginContext};

const ALL_CHUNKS: [usize; 3] = [32, 128, 512];
const DECODE: usize = 32;

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

fn prefill_len() -> usize {
    env_or("BENCH_PREFILL", "512")
        .parse()
        .unwrap_or(512)
        .max(32)
}

fn chunks() -> Vec<usize> {
    ALL_CHUNKS
        .iter()
        .copied()
        .filter(|&c| c <= prefill_len())
        .collect()
}

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Tokens/s of prefilling `PREFILL` tokens in chunks, and of decoding `DECODE` tokens after.
struct Figures {
    prefill: Vec<f64>,
    decode: f64,
}

fn ours(weights: &str, ids: &[u32]) -> anyhow::Result<Figures> {
    let context = PluginContext::new("candle", &model_path().to_string_lossy())
        .with_options(json!({ "weights": weights }));
    let backend = Candle::new(context)?;
    let engine = backend.engine()?;
    let model = &engine.loaded.model;
    let mut prefill = Vec::new();
    for chunk in chunks() {
        let mut kv = model.new_state();
        let start = Instant::now();
        for part in ids[..prefill_len()].chunks(chunk) {
            model.forward(part, &mut kv, Logits::Last, false)?;
        }
        prefill.push(prefill_len() as f64 / start.elapsed().as_secs_f64());
    }
    let mut kv = model.new_state();
    let out = model.forward(&ids[..prefill_len().min(128)], &mut kv, Logits::Last, false)?;
    let mut next = argmax(&out.logits.unwrap().to_vec2::<f32>()?[0]);
    let start = Instant::now();
    for _ in 0..DECODE {
        let out = model.forward(&[next], &mut kv, Logits::Last, false)?;
        next = argmax(&out.logits.unwrap().to_vec2::<f32>()?[0]);
    }
    Ok(Figures {
        prefill,
        decode: DECODE as f64 / start.elapsed().as_secs_f64(),
    })
}

fn reference(ids: &[u32]) -> anyhow::Result<Figures> {
    let load = || -> anyhow::Result<ModelWeights> {
        let mut file = std::fs::File::open(model_path())?;
        let content = gguf_file::Content::read(&mut file)?;
        Ok(ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?)
    };
    let input = |ids: &[u32]| Tensor::new(ids, &Device::Cpu).and_then(|t| t.unsqueeze(0));
    let mut prefill = Vec::new();
    for chunk in chunks() {
        let mut model = load()?;
        let start = Instant::now();
        for (i, part) in ids[..prefill_len()].chunks(chunk).enumerate() {
            model.forward(&input(part)?, i * chunk)?;
        }
        prefill.push(prefill_len() as f64 / start.elapsed().as_secs_f64());
    }
    let mut model = load()?;
    let logits = model.forward(&input(&ids[..prefill_len().min(128)])?, 0)?;
    let mut next = argmax(&logits.squeeze(0)?.to_vec1::<f32>()?);
    let start = Instant::now();
    for i in 0..DECODE {
        let logits = model.forward(&input(&[next])?, prefill_len().min(128) + i)?;
        next = argmax(&logits.squeeze(0)?.to_vec1::<f32>()?);
    }
    Ok(Figures {
        prefill,
        decode: DECODE as f64 / start.elapsed().as_secs_f64(),
    })
}

fn row(name: &str, f: &Figures, base: &Figures) {
    let p: Vec<String> = f
        .prefill
        .iter()
        .zip(&base.prefill)
        .map(|(x, b)| format!("{x:7.1} ({:4.1}x)", x / b))
        .collect();
    println!(
        "  {name:<22} prefill {}   decode {:6.1} ({:4.1}x)",
        p.join(" "),
        f.decode,
        f.decode / base.decode
    );
}

fn main() -> anyhow::Result<()> {
    let text = "The quick brown fox jumps over the lazy dog while the committee debates \
                the budget for the new library, and nobody remembers who ordered pizza. ";
    let context = PluginContext::new("candle", &model_path().to_string_lossy());
    let tokenizer_host = Candle::new(context)?;
    let ids = tokenizer_host.engine()?.encode(&text.repeat(60), false)?;
    anyhow::ensure!(
        ids.len() >= prefill_len(),
        "prompt too short: {}",
        ids.len()
    );
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "tokens/s, prefill of {} tokens in chunks {:?}, decode of {DECODE} after {}; (ratio to quantized_llama)",
        prefill_len(),
        chunks(),
        prefill_len().min(128)
    );
    let threads: Vec<usize> = env_or("BENCH_THREADS", "1,all")
        .split(',')
        .map(|t| {
            if t == "all" {
                all
            } else {
                t.parse().unwrap_or(1)
            }
        })
        .collect();
    for threads in threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        pool.install(|| -> anyhow::Result<()> {
            println!("threads = {threads}");
            let base = reference(&ids)?;
            row("quantized_llama (Q4_1)", &base, &base);
            let weights = env_or("BENCH_WEIGHTS", "as_stored,compact,f32,q8_0,q4_0,mixed");
            for weights in weights.split(',') {
                row(weights, &ours(weights, &ids)?, &base);
            }
            Ok(())
        })?;
    }
    Ok(())
}
