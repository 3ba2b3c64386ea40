//! Prefill and decode speed on SmolLM2 per weight format and thread count, next to
//! candle-transformers' `quantized_llama` on the same prompt. Prints figures; asserts nothing.
//!
//! `cargo run --release --example bench` (after `scripts/fetch-models`).

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

const CHUNKS: [usize; 3] = [32, 128, 512];
const PREFILL: usize = 512;
const DECODE: usize = 32;

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
    for chunk in CHUNKS {
        let mut kv = model.new_state();
        let start = Instant::now();
        for part in ids[..PREFILL].chunks(chunk) {
            model.forward(part, &mut kv, Logits::Last, false)?;
        }
        prefill.push(PREFILL as f64 / start.elapsed().as_secs_f64());
    }
    let mut kv = model.new_state();
    let out = model.forward(&ids[..128], &mut kv, Logits::Last, false)?;
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
    for chunk in CHUNKS {
        let mut model = load()?;
        let start = Instant::now();
        for (i, part) in ids[..PREFILL].chunks(chunk).enumerate() {
            model.forward(&input(part)?, i * chunk)?;
        }
        prefill.push(PREFILL as f64 / start.elapsed().as_secs_f64());
    }
    let mut model = load()?;
    let logits = model.forward(&input(&ids[..128])?, 0)?;
    let mut next = argmax(&logits.squeeze(0)?.to_vec1::<f32>()?);
    let start = Instant::now();
    for i in 0..DECODE {
        let logits = model.forward(&input(&[next])?, 128 + i)?;
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
    anyhow::ensure!(ids.len() >= PREFILL, "prompt too short: {}", ids.len());
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("tokens/s, prefill of {PREFILL} tokens in chunks {CHUNKS:?}, decode of {DECODE} after 128; (ratio to quantized_llama)");
    for threads in [1, all] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()?;
        pool.install(|| -> anyhow::Result<()> {
            println!("threads = {threads}");
            let base = reference(&ids)?;
            row("quantized_llama (Q4_1)", &base, &base);
            for weights in ["as_stored", "f32", "q8_0", "q4_0", "auto"] {
                row(weights, &ours(weights, &ids)?, &base);
            }
            Ok(())
        })?;
    }
    Ok(())
}
