//! Prefill and decode speed of our backend per weight format and thread count, on SmolLM2 and
//! Gemma 3 270M, next to candle-transformers' quantized model of the same file and, when `.venv`
//! has llama-cpp-python (`scripts/setup-llama-cpp`), llama.cpp (`scripts/llama-cpp-speed.py`)
//! fed the same token ids, and for SmolLM2 the onnx backend on its ONNX export (`onnx_speed`,
//! when `scripts/setup-onnx` has run and the example is built beside this one) in f32.
//! Our prefill runs as a generation's prompt does (`Engine::prompting`: `auto` through the
//! stored blocks where the kernels have AVX2 or AVX-512; the `f32` row is what scoring runs). Every
//! row is measured once (after an untimed warm-up), all rows of a table in the same minutes,
//! so a busy machine slows them alike. Prints figures; asserts nothing.
//! candle-transformers 0.11.1's `quantized_gemma3` fails any multi-token pass after position 0
//! (its mask joins f32 to u32), so its chunked prefills show `-` with the error noted under
//! the table.
//!
//! `cargo run --release --example bench` (after `scripts/fetch-models`). Environment:
//! `BENCH_MODELS=smollm2,gemma3`, `BENCH_THREADS=all` (or a list: `1,all`), `BENCH_PREFILL=128`
//! (chunk sizes are 32, 128, 512 up to the prefill; 512 measures all three),
//! `BENCH_WEIGHTS=auto,f32,compact,mixed,as_stored` (also `q8_0`, `q4_0`), `BENCH_DEVICE=auto`
//! (our rows' option `device`; the references run on CPU). The defaults take a few minutes on
//! 2 cores.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use candle_transformers::models::{quantized_gemma3, quantized_llama};
use lmhost_candle::engine::Engine;
use lmhost_candle::kv::KvState;
use lmhost_candle::models::Logits;
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::{self, json, Value};
use lmhost_plugin_api::{Backend, PluginContext};
use lmhost_plugin_kit::sampling::argmax;

const ALL_CHUNKS: [usize; 3] = [32, 128, 512];
const DECODE: usize = 32;
/// Decoding starts after this many prompt tokens (fewer if the prefill is shorter).
const PROMPT: usize = 128;
const TEXT: &str = "The quick brown fox jumps over the lazy dog while the committee debates the \
                    budget for the new library, and nobody remembers who ordered pizza. ";

/// A model file and how candle-transformers loads it.
struct Model {
    name: &'static str,
    file: &'static str,
    reference: &'static str,
    /// Its ONNX export under models/, for the onnx backend's row.
    onnx: Option<&'static str>,
}

const MODELS: [Model; 2] = [
    Model {
        name: "smollm2",
        file: "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        reference: "quantized_llama",
        onnx: Some("smollm2-onnx"),
    },
    Model {
        name: "gemma3",
        file: "gemma3-270m/gemma-3-270m-q4_k_m.gguf",
        reference: "quantized_gemma3",
        onnx: None,
    },
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn env_list(key: &str, default: &str) -> Vec<String> {
    let value = std::env::var(key).unwrap_or_else(|_| default.to_string());
    value.split(',').map(str::to_string).collect()
}

/// What every row of a run measures.
struct Setup {
    prefill: usize,
    chunks: Vec<usize>,
    threads: usize,
    device: String,
}

impl Setup {
    fn prompt(&self) -> usize {
        self.prefill.min(PROMPT)
    }
}

/// Tokens/s of prefilling `Setup::prefill` tokens per chunk size, and of decoding `DECODE`
/// tokens after `Setup::prompt`; `None` where the run failed (the error goes under the table).
struct Figures {
    prefill: Vec<Option<f64>>,
    decode: Option<f64>,
}

impl Figures {
    fn none(setup: &Setup) -> Self {
        Figures {
            prefill: vec![None; setup.chunks.len()],
            decode: None,
        }
    }
}

/// A model under test: forward passes that extend its state and return the greedy next token.
trait Runner {
    fn reset(&mut self);
    fn step(&mut self, ids: &[u32]) -> anyhow::Result<u32>;
}

struct Ours {
    engine: Arc<Engine>,
    kv: KvState,
}

impl Runner for Ours {
    fn reset(&mut self) {
        self.kv = self.engine.model.new_state();
    }
    fn step(&mut self, ids: &[u32]) -> anyhow::Result<u32> {
        let model = &self.engine.model;
        let pass = || model.forward(ids, &mut self.kv, Logits::Last, false);
        // One id is a decode step, run as the engine's sampling loop runs it; more, a
        // generation's prompt.
        let out = if ids.len() == 1 {
            lmhost_candle::weights::generating(pass)?
        } else {
            self.engine.prompting(pass)?
        };
        let logits = out.logits.context("no logits")?;
        Ok(argmax(&logits.to_vec2::<f32>()?[0]))
    }
}

/// candle-transformers' forward pass: ids at a position in, last logits out; a pass at position
/// 0 drops the cache.
type Forward = Box<dyn FnMut(&Tensor, usize) -> candle_core::Result<Tensor>>;

/// candle-transformers' model of the file.
struct Reference {
    forward: Forward,
    at: usize,
}

impl Reference {
    fn load(model: &Model, path: &Path) -> anyhow::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        let content = gguf_file::Content::read(&mut file)?;
        let forward: Forward = match model.reference {
            "quantized_llama" => {
                let mut m =
                    quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?;
                Box::new(move |x, at| m.forward(x, at))
            }
            _ => {
                let mut m =
                    quantized_gemma3::ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?;
                Box::new(move |x, at| m.forward(x, at))
            }
        };
        Ok(Reference { forward, at: 0 })
    }
}

impl Runner for Reference {
    fn reset(&mut self) {
        self.at = 0;
    }
    fn step(&mut self, ids: &[u32]) -> anyhow::Result<u32> {
        let input = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
        let logits = (self.forward)(&input, self.at)?;
        self.at += ids.len();
        Ok(argmax(&logits.squeeze(0)?.to_vec1::<f32>()?))
    }
}

/// The first line of `e`: candle appends a backtrace when RUST_BACKTRACE is set.
fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Runs the measurements on `runner`, noting what fails in `notes`.
fn measure(
    runner: &mut dyn Runner,
    ids: &[u32],
    setup: &Setup,
    notes: &mut Vec<String>,
) -> Figures {
    let mut note = |what: &str, e: anyhow::Error| notes.push(format!("{what}: {}", first_line(&e)));
    // Untimed: a short prompt and a few decode steps first, as a server's first request warms
    // it. Without it, in two runs, the first row measured decoded 25-30% slower than the same
    // weights measured again later in the run.
    runner.reset();
    let warm = runner
        .step(&ids[..setup.prompt().min(32)])
        .and_then(|mut next| {
            for _ in 0..4 {
                next = runner.step(&[next])?;
            }
            anyhow::Ok(())
        });
    if let Err(e) = warm {
        note("warm-up", e);
    }
    let mut prefill = Vec::new();
    // The greedy token after the last prefill when that prefill was the decode's prompt: the
    // decode goes on from there, sparing a slow row a second prompt pass.
    let mut prompted = None;
    for &chunk in &setup.chunks {
        runner.reset();
        let start = Instant::now();
        let run = ids[..setup.prefill]
            .chunks(chunk)
            .try_fold(0, |_, part| runner.step(part));
        prefill.push(
            run.as_ref()
                .ok()
                .map(|_| setup.prefill as f64 / start.elapsed().as_secs_f64()),
        );
        prompted = run
            .map_err(|e| note(&format!("prefill in chunks of {chunk}"), e))
            .ok()
            .filter(|_| setup.prefill == setup.prompt());
    }
    let decode = (|| {
        let mut next = match prompted {
            Some(next) => next,
            None => {
                runner.reset();
                runner.step(&ids[..setup.prompt()])?
            }
        };
        let start = Instant::now();
        for _ in 0..DECODE {
            next = runner.step(&[next])?;
        }
        anyhow::Ok(DECODE as f64 / start.elapsed().as_secs_f64())
    })();
    let decode = decode.map_err(|e| note("decode", e)).ok();
    Figures { prefill, decode }
}

fn python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// Whether `.venv`'s Python imports llama_cpp.
fn have_llama_cpp() -> bool {
    Command::new(python())
        .args(["-c", "import llama_cpp, numpy"])
        .output()
        .is_ok_and(|out| out.status.success())
}

fn list<T: ToString>(xs: &[T]) -> String {
    let xs: Vec<String> = xs.iter().map(T::to_string).collect();
    xs.join(",")
}

/// Runs a speed script or program that takes the bench's arguments and prints its figures.
fn external(mut command: Command, ids: &[u32], setup: &Setup) -> anyhow::Result<Figures> {
    let name = command.get_program().to_string_lossy().into_owned();
    let out = command
        .args(["--ids", &list(&ids[..setup.prefill])])
        .args(["--threads", &setup.threads.to_string()])
        .args(["--prefill", &setup.prefill.to_string()])
        .args(["--chunks", &list(&setup.chunks)])
        .args(["--decode", &DECODE.to_string()])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let why = stderr.lines().last().unwrap_or_default();
    anyhow::ensure!(out.status.success(), "{name}: {}: {why}", out.status);
    let figures: Value = serde_json::from_slice(&out.stdout)?;
    let prefill = figures["prefill"]
        .as_array()
        .context("no prefill figures")?;
    Ok(Figures {
        prefill: prefill.iter().map(Value::as_f64).collect(),
        decode: figures["decode"].as_f64(),
    })
}

/// The onnx backend's speed program on `export`, when both are there: the example built beside
/// this one, the export and the ONNX Runtime library `scripts/setup-onnx` installs.
fn onnx_speed(export: &str) -> Option<Command> {
    let program = std::env::current_exe().ok()?.with_file_name("onnx_speed");
    let export = root().join("models").join(export);
    let library = root().join("models/onnxruntime/libonnxruntime.so.1.32.0");
    if !(program.is_file() && export.is_dir() && library.is_file()) {
        println!("onnx skipped: needs scripts/setup-onnx and `cargo build --release --workspace --all-targets`");
        return None;
    }
    let mut command = Command::new(program);
    command.arg(export).arg("--library").arg(library);
    Some(command)
}

/// `x` as tok/s, then its ratio to each base row.
fn cell(x: Option<f64>, bases: &[Option<f64>]) -> String {
    let ratios: String = bases
        .iter()
        .map(|b| match (x, b) {
            (Some(x), Some(b)) => format!(" {:5.2}", x / b),
            _ => "     -".to_string(),
        })
        .collect();
    match x {
        Some(x) => format!("{x:7.1}{ratios}"),
        None => format!("      -{ratios}"),
    }
}

/// One table: a row per runner, each cell tok/s and its ratios to llama.cpp and the reference.
fn table(title: &str, setup: &Setup, rows: &[(String, Figures)], bases: &[&str]) {
    let width = 7 + 6 * bases.len();
    println!(
        "\n{title}, {} threads: tok/s, x {}",
        setup.threads,
        bases.join(", x ")
    );
    let mut header = format!("  {:<24}", "");
    for chunk in &setup.chunks {
        header += &format!(" | {:<width$}", format!("prefill/{chunk}"));
    }
    println!("{header} | decode");
    let base_rows: Vec<&Figures> = bases
        .iter()
        .filter_map(|b| rows.iter().find(|(name, _)| name == b).map(|(_, f)| f))
        .collect();
    for (name, figures) in rows {
        let mut line = format!("  {name:<24}");
        for (i, &x) in figures.prefill.iter().enumerate() {
            let b: Vec<_> = base_rows.iter().map(|f| f.prefill[i]).collect();
            line += &format!(" | {}", cell(x, &b));
        }
        let b: Vec<_> = base_rows.iter().map(|f| f.decode).collect();
        println!("{line} | {}", cell(figures.decode, &b));
    }
}

fn bench_model(model: &Model, setup: &Setup, llama: bool) -> anyhow::Result<()> {
    let path = root().join("models").join(model.file);
    let fetch = "run scripts/fetch-models";
    anyhow::ensure!(path.is_file(), "{} is missing: {fetch}", path.display());
    let load = |weights: &str| -> anyhow::Result<Arc<Engine>> {
        let context = PluginContext::new("candle", &path.to_string_lossy())
            .with_options(json!({ "weights": weights, "device": setup.device }));
        Ok(Candle::new(context)?.engine()?)
    };
    // BOS as the model's metadata says, like llama.cpp's tokenizer.
    let ids = load("as_stored")?.front.encode(&TEXT.repeat(60), true)?;
    anyhow::ensure!(
        ids.len() >= setup.prefill,
        "prompt too short: {}",
        ids.len()
    );
    let mut notes = Vec::new();
    let mut rows = Vec::new();
    let mut bases = Vec::new();
    if llama {
        let mut command = Command::new(python());
        command
            .arg(root().join("scripts/llama-cpp-speed.py"))
            .arg(&path);
        let figures = external(command, &ids, setup).unwrap_or_else(|e| {
            notes.push(format!("llama.cpp: {}", first_line(&e)));
            Figures::none(setup)
        });
        rows.push(("llama.cpp".to_string(), figures));
        bases.push("llama.cpp");
    }
    if let Some(command) = model.onnx.and_then(onnx_speed) {
        let figures = external(command, &ids, setup).unwrap_or_else(|e| {
            notes.push(format!("onnx: {}", first_line(&e)));
            Figures::none(setup)
        });
        rows.push(("onnx (f32)".to_string(), figures));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(setup.threads)
        .build()?;
    pool.install(|| -> anyhow::Result<()> {
        let mut row_notes = Vec::new();
        let figures = match Reference::load(model, &path) {
            Ok(mut reference) => measure(&mut reference, &ids, setup, &mut row_notes),
            Err(e) => {
                row_notes.push(format!("does not load {}: {}", model.file, first_line(&e)));
                Figures::none(setup)
            }
        };
        notes.extend(
            row_notes
                .iter()
                .map(|n| format!("{}: {n}", model.reference)),
        );
        rows.push((model.reference.to_string(), figures));
        bases.push(model.reference);
        for weights in env_list("BENCH_WEIGHTS", "auto,f32,compact,mixed,as_stored") {
            let engine = load(&weights)?;
            let mut ours = Ours {
                kv: engine.model.new_state(),
                engine,
            };
            let mut row_notes = Vec::new();
            let figures = measure(&mut ours, &ids, setup, &mut row_notes);
            notes.extend(row_notes.iter().map(|n| format!("{weights}: {n}")));
            rows.push((weights, figures));
        }
        Ok(())
    })?;
    let title = format!("{} ({})", model.name, model.file);
    table(&title, setup, &rows, &bases);
    for note in notes {
        println!("  note: {note}");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    lmhost_candle::tune_thread_env();
    let prefill: usize = env_list("BENCH_PREFILL", "128")[0]
        .parse()
        .context("BENCH_PREFILL")?;
    let prefill = prefill.max(ALL_CHUNKS[0]);
    let chunks: Vec<usize> = ALL_CHUNKS.into_iter().filter(|&c| c <= prefill).collect();
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let llama = have_llama_cpp();
    println!(
        "tokens/s: prefill of {prefill} tokens in chunks {chunks:?}, decode of {DECODE} after {}",
        prefill.min(PROMPT)
    );
    if !llama {
        println!(
            "llama.cpp skipped: {} cannot import llama_cpp (scripts/setup-llama-cpp installs it)",
            python().display()
        );
    }
    for name in env_list("BENCH_MODELS", "smollm2,gemma3") {
        let model = MODELS
            .iter()
            .find(|m| m.name == name)
            .with_context(|| format!("BENCH_MODELS: no model {name:?}"))?;
        for threads in env_list("BENCH_THREADS", "all") {
            let threads = match threads.as_str() {
                "all" => all,
                t => t.parse().context("BENCH_THREADS")?,
            };
            let setup = Setup {
                prefill,
                chunks: chunks.clone(),
                threads,
                device: env_list("BENCH_DEVICE", "auto")[0].clone(),
            };
            bench_model(model, &setup, llama)?;
        }
    }
    Ok(())
}
