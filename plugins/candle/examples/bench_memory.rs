//! Memory and speed of loading a 1B-shape Llama GGUF in Q4_K: what `weights = auto` costs under
//! the default memory budget and under one that keeps the weights as stored. Run by
//! `scripts/bench-memory`, which writes the file once and loads it in a fresh process per
//! setting (peak RSS is per process).
//!
//! `bench_memory write PATH`: writes the random-weight model (hidden 2048, 16 layers, FFN 8192,
//! 32 heads / 8 KV heads, vocab 32000, untied output; about 0.6 GB).
//! `bench_memory load PATH WEIGHTS BUDGET`: loads it with those options and prints one JSON
//! line: load time, resident memory after loading, peak resident memory (VmHWM) and greedy
//! decode tokens/s.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use lmhost_candle::memory::{fit, MemoryBudget, WeightBytes};
use lmhost_candle::models::BuildOptions;
use lmhost_candle::models::Logits;
use lmhost_candle::weights::WeightFormat;
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{Backend, PluginContext};
use lmhost_plugin_kit::sampling::argmax;

const HIDDEN: usize = 2048;
const LAYERS: usize = 16;
const FFN: usize = 8192;
const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const VOCAB: usize = 32000;
const PROMPT: usize = 16;
const DECODE: usize = 32;

/// xorshift64*: enough randomness for weights, and fast.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-scale, scale].
    fn uniform(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }
}

/// A `(rows, cols)` Q4_K matrix, uniform in ±2/√cols: blocks drawn at random from a pool of
/// 1024 quantized random blocks (quantizing a billion values would take minutes).
fn q4k(rows: usize, cols: usize, rng: &mut Rng) -> anyhow::Result<QTensor> {
    const POOL: usize = 1024;
    let scale = 2.0 / (cols as f32).sqrt();
    let values: Vec<f32> = (0..POOL * 256).map(|_| rng.uniform(scale)).collect();
    let pool = QTensor::quantize(
        &Tensor::from_vec(values, (POOL, 256), &Device::Cpu)?,
        GgmlDType::Q4K,
    )?;
    let pool = pool.data()?;
    let block = GgmlDType::Q4K.type_size();
    let blocks = rows * cols / 256;
    let mut data = Vec::with_capacity(blocks * block);
    for _ in 0..blocks {
        let i = rng.next() as usize % POOL;
        data.extend_from_slice(&pool[i * block..(i + 1) * block]);
    }
    let storage = candle_core::quantized::QStorage::from_data(
        std::borrow::Cow::Owned(data),
        &Device::Cpu,
        GgmlDType::Q4K,
    )?;
    Ok(QTensor::new(storage, (rows, cols))?)
}

fn norm(rng: &mut Rng) -> anyhow::Result<QTensor> {
    let values: Vec<f32> = (0..HIDDEN).map(|_| 1.0 + rng.uniform(0.1)).collect();
    let t = Tensor::from_vec(values, HIDDEN, &Device::Cpu)?;
    Ok(QTensor::quantize(&t, GgmlDType::F32)?)
}

fn write(path: &Path) -> anyhow::Result<()> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let d = HIDDEN / HEADS;
    let mut tensors = vec![
        (
            "token_embd.weight".to_string(),
            q4k(VOCAB, HIDDEN, &mut rng)?,
        ),
        ("output.weight".to_string(), q4k(VOCAB, HIDDEN, &mut rng)?),
        ("output_norm.weight".to_string(), norm(&mut rng)?),
    ];
    for l in 0..LAYERS {
        let shapes = [
            ("attn_q", HEADS * d, HIDDEN),
            ("attn_k", KV_HEADS * d, HIDDEN),
            ("attn_v", KV_HEADS * d, HIDDEN),
            ("attn_output", HIDDEN, HEADS * d),
            ("ffn_gate", FFN, HIDDEN),
            ("ffn_up", FFN, HIDDEN),
            ("ffn_down", HIDDEN, FFN),
        ];
        for (name, rows, cols) in shapes {
            tensors.push((format!("blk.{l}.{name}.weight"), q4k(rows, cols, &mut rng)?));
        }
        tensors.push((format!("blk.{l}.attn_norm.weight"), norm(&mut rng)?));
        tensors.push((format!("blk.{l}.ffn_norm.weight"), norm(&mut rng)?));
    }
    // A byte-level vocabulary padded with plain tokens to 32000.
    let mut tokens: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    tokens.extend(["<s>", "</s>"].map(String::from));
    tokens.extend((tokens.len()..VOCAB).map(|i| format!("t{i}")));
    let types: Vec<Value> = (0..VOCAB)
        .map(|i| {
            Value::I32(if i < 256 {
                6
            } else if i < 258 {
                3
            } else {
                1
            })
        })
        .collect();
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    let metadata = vec![
        ("general.architecture", s("llama")),
        ("llama.block_count", u(LAYERS)),
        ("llama.embedding_length", u(HIDDEN)),
        ("llama.feed_forward_length", u(FFN)),
        ("llama.attention.head_count", u(HEADS)),
        ("llama.attention.head_count_kv", u(KV_HEADS)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.context_length", u(2048)),
        ("tokenizer.ggml.model", s("llama")),
        (
            "tokenizer.ggml.tokens",
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            Value::Array(vec![Value::F32(0.0); VOCAB]),
        ),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.bos_token_id", u(256)),
        ("tokenizer.ggml.eos_token_id", u(257)),
    ];
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let partial = path.with_extension("partial");
    let mut file = std::fs::File::create(&partial)?;
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    std::fs::rename(&partial, path)?;
    Ok(())
}

/// A `/proc/self/status` field in bytes (Linux).
fn status_bytes(key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB"))
        .with_context(|| format!("no {key} in /proc/self/status"))?;
    Ok(kb.trim().parse::<u64>()? * 1024)
}

/// The format the plugin picks for `weights` under `budget` on CPU (the same function it calls).
fn chosen_format(path: &Path, weights: &str, budget: &str) -> anyhow::Result<&'static str> {
    let mut file = std::fs::File::open(path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut bytes = WeightBytes::default();
    for info in content.tensor_infos.values() {
        bytes.add(info.ggml_dtype, info.shape.elem_count());
    }
    let build = BuildOptions {
        dtype: DType::F32,
        device: Device::Cpu,
        format: WeightFormat::parse(weights).context("unknown weights")?,
        attention: lmhost_candle::attention::resolve("eager").map_err(anyhow::Error::msg)?,
        max_context: 1,
        memory_budget: MemoryBudget::parse(budget)
            .context("unknown budget")?
            .bytes_on(&Device::Cpu),
        kv_dtype: DType::F32,
    };
    let format = fit(&build, &bytes).map_err(anyhow::Error::msg)?;
    Ok(match format {
        WeightFormat::Auto => "f32",
        format => format.name(),
    })
}

fn load(path: &Path, weights: &str, budget: &str) -> anyhow::Result<()> {
    let format = chosen_format(path, weights, budget)?;
    let start = Instant::now();
    let context = PluginContext::new("candle", &path.to_string_lossy())
        .with_options(json!({ "weights": weights, "memory_budget": budget }));
    let backend = Candle::new(context)?;
    let engine = backend.engine()?;
    let load_s = start.elapsed().as_secs_f64();
    let rss_loaded = status_bytes("VmRSS:")?;
    let model = &engine.model;
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| 300 + i * 97).collect();
    let mut kv = model.new_state();
    let out = model.forward(&prompt, &mut kv, Logits::Last, false)?;
    let logits = out.logits.context("no logits")?;
    let mut next = argmax(&logits.to_vec2::<f32>()?[0]);
    let start = Instant::now();
    for _ in 0..DECODE {
        let out = model.forward(&[next], &mut kv, Logits::Last, false)?;
        let logits = out.logits.context("no logits")?;
        next = argmax(&logits.to_vec2::<f32>()?[0]);
    }
    let decode = DECODE as f64 / start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "weights": weights,
            "memory_budget": budget,
            "format": format,
            "file_bytes": std::fs::metadata(path)?.len(),
            "load_s": load_s,
            "rss_after_load_bytes": rss_loaded,
            "peak_rss_bytes": status_bytes("VmHWM:")?,
            "decode_tok_s": decode,
        })
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["write", path] => write(Path::new(path)),
        ["load", path, weights, budget] => load(Path::new(path), weights, budget),
        _ => {
            anyhow::bail!("usage: bench_memory write PATH | bench_memory load PATH WEIGHTS BUDGET")
        }
    }
}
