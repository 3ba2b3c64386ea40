//! The onnx backend's prefill and decode speed on an export, measured as candle's model-speed
//! benchmark (`plugins/candle/examples/bench.rs`) measures its rows, which runs this and puts
//! the figures in its table (two plugin crates cannot be linked into one binary).
//!
//! `onnx_speed EXPORT_DIR --library LIB --ids 1,2,3 [--threads 2] [--prefill 128]
//! [--chunks 32,128] [--decode 32]` prints one JSON line: `{"prefill": [tok/s per chunk size],
//! "decode": tok/s}`. Prefill: the first `--prefill` ids from an empty state, one pass per chunk.
//! Decode: `--decode` greedy tokens after the first min(prefill, 128) ids, one pass per token.

use std::time::Instant;

use anyhow::Context;
use lmhost_onnx::engine::Engine;
use lmhost_onnx::past::Past;
use lmhost_onnx::Onnx;
use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{Backend, PluginContext};
use lmhost_plugin_kit::sampling::argmax;

/// The value after `--name`, or `default`.
fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

fn numbers(list: &str) -> anyhow::Result<Vec<usize>> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().with_context(|| format!("not a number: {s:?}")))
        .collect()
}

/// Runs `ids` in passes of `chunk` after `past`; the greedy next token and the state.
fn run(engine: &Engine, ids: &[u32], chunk: usize, mut past: Past) -> anyhow::Result<(u32, Past)> {
    let mut next = 0;
    for part in ids.chunks(chunk) {
        let (rows, state) = engine.pass(part, &past, part.len() - 1)?;
        next = argmax(rows.last().context("no logits")?);
        past = state;
    }
    Ok((next, past))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let export = args
        .get(1)
        .context("usage: onnx_speed EXPORT_DIR --library LIB --ids ...")?;
    let ids: Vec<u32> = numbers(&arg(&args, "--ids", ""))?
        .into_iter()
        .map(|i| i as u32)
        .collect();
    let prefill: usize = arg(&args, "--prefill", "128").parse()?;
    let chunks = numbers(&arg(&args, "--chunks", "32,128"))?;
    let decode: usize = arg(&args, "--decode", "32").parse()?;
    anyhow::ensure!(
        ids.len() >= prefill,
        "{} ids for a prefill of {prefill}",
        ids.len()
    );
    let options = json!({
        "ort_library": arg(&args, "--library", ""),
        "intra_threads": arg(&args, "--threads", "0").parse::<u64>()?,
    });
    let backend = Onnx::new(PluginContext::new("onnx", export).with_options(options))?;
    let engine = backend.engine()?;
    let mut rates = Vec::new();
    for &chunk in &chunks {
        let start = Instant::now();
        run(&engine, &ids[..prefill], chunk, engine.new_state())?;
        rates.push(Value::from(prefill as f64 / start.elapsed().as_secs_f64()));
    }
    let prompt = prefill.min(128);
    let (mut next, mut past) = run(&engine, &ids[..prompt], prompt, engine.new_state())?;
    let start = Instant::now();
    for _ in 0..decode {
        (next, past) = run(&engine, &[next], 1, past)?;
    }
    let decode_rate = decode as f64 / start.elapsed().as_secs_f64();
    println!("{}", json!({ "prefill": rates, "decode": decode_rate }));
    Ok(())
}
