//! The onnx backend against candle on the same model: SmolLM2-135M-Instruct, exported to ONNX
//! by `scripts/setup-onnx` from the packaged GGUF (dequantized to f32), and the GGUF itself on
//! candle's f32 path. Both run as plugin libraries from `target/`, as users load them.

use std::path::{Path, PathBuf};

use lmhost::config::Config;
use lmhost::{Backend, Host};
use lmhost_plugin_api::{ConversationSnapshot, GenerationConfig};
use serde_json::Value;

mod common;

use common::{explain_json, require, values};

/// Config files for both backends in `dir`: (onnx, candle).
fn configs(dir: &Path) -> (PathBuf, PathBuf) {
    let export = require("models/smollm2-onnx", "setup-onnx");
    let library = require("models/onnxruntime/libonnxruntime.so.1.32.0", "setup-onnx");
    let gguf = require(
        "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "fetch-models",
    );
    let onnx = dir.join("onnx.toml");
    std::fs::write(
        &onnx,
        format!(
            "[backend]\nkind = \"onnx\"\nmodel_id = {:?}\n[backend.options]\nort_library = {:?}\n",
            export.display().to_string(),
            library.display().to_string()
        ),
    )
    .unwrap();
    let candle = dir.join("candle.toml");
    std::fs::write(
        &candle,
        format!(
            "[backend]\nkind = \"candle\"\nmodel_id = {:?}\n[backend.options]\nweights = \"f32\"\n",
            gguf.display().to_string()
        ),
    )
    .unwrap();
    (onnx, candle)
}

/// A backend loaded from its plugin library, next to the test binary's `lmhost`.
fn open(config: &Path) -> Backend {
    let mut config = Config::load(config).unwrap();
    let target = Path::new(env!("CARGO_BIN_EXE_lmhost")).parent().unwrap();
    config.plugin_dirs.push(target.to_path_buf());
    Host::new().open(&config).unwrap()
}

/// The same prompt ids (the export's tokenizer.json and template against the GGUF's own), the
/// same greedy reply up to a tie, and teacher-forced logprobs within 1e-3 at every position of a
/// long reply. Both run f32, ONNX Runtime's MLAS and candle's GEMM each picking kernels for the
/// CPU at hand: their logprobs differ by summation order (4e-5 measured on AVX-512), so where
/// two tokens tie within that, which one greedy picks is the CPU's rounding, not an error.
#[test]
fn onnx_and_candle_agree_on_tokens_and_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let (onnx, candle) = configs(dir.path());
    let (onnx, candle) = (open(&onnx), open(&candle));
    let prompts = [
        ConversationSnapshot::from_prompt("What is the capital of France?"),
        ConversationSnapshot::from_prompt("Digits 12345, ünïcödé 你好 🙂 and\ttabs."),
        ConversationSnapshot::raw("Once upon a time, for 1,000,000.50$,"),
    ];
    for prompt in &prompts {
        let a = onnx.tokenize(prompt, true).unwrap();
        let b = candle.tokenize(prompt, true).unwrap();
        assert_eq!(a.token_ids, b.token_ids, "{prompt:?}");
    }
    let greedy = GenerationConfig {
        max_new_tokens: 24,
        ..GenerationConfig::default()
    };
    let a = onnx.generate(&prompts[0], &greedy).unwrap();
    let b = candle.generate(&prompts[0], &greedy).unwrap();
    if let Some(i) = a
        .token_ids
        .iter()
        .zip(b.token_ids.iter())
        .position(|(x, y)| x != y)
    {
        // Where the replies part, candle must rate onnx's token as it rates its own, within the
        // engines' difference: a tie that rounding broke.
        let forced = candle.score(&prompts[0], &a.text).unwrap();
        assert_eq!(forced.token_ids[..=i], a.token_ids[..=i]);
        let gap = b.logprobs[i] - forced.logprobs[i];
        assert!(
            gap.abs() <= 2e-3,
            "the greedy replies part at token {i} by {gap} nats, more than a tie: {:?} / {:?}",
            a.text,
            b.text
        );
    } else {
        assert_eq!(
            a.token_ids.len(),
            b.token_ids.len(),
            "{:?} / {:?}",
            a.text,
            b.text
        );
    }
    let reply = "Paris is the capital and largest city of France. It sits on the Seine, and \
                 about two million people live there; the wider region holds twelve million.";
    let (x, y) = (
        onnx.score(&prompts[0], reply).unwrap(),
        candle.score(&prompts[0], reply).unwrap(),
    );
    assert_eq!(x.token_ids, y.token_ids);
    assert!(x.logprobs.len() > 30);
    let diff = x
        .logprobs
        .iter()
        .zip(y.logprobs.iter())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "max |onnx - candle| logprob over {} positions: {diff:e}",
        x.logprobs.len()
    );
    assert!(diff < 1e-3, "{diff}");
}

fn explain(config: &Path, reply: Option<&str>, out: &Path) -> Value {
    let mut args: Vec<std::ffi::OsString> = vec!["--config".into(), config.into()];
    args.extend(reply.map(|r| format!("--reply={r}").into()));
    let rest = [
        "--conversation",
        "examples/conversation.json",
        "--roles",
        "user",
    ];
    args.extend(
        rest.into_iter()
            .chain(["--estimator", "exact"])
            .map(Into::into),
    );
    explain_json(out, &args)
}

/// `lmhost explain` (exact Shapley over the example's five user messages, 32 coalitions, the
/// prefix cache on) gives values within 1e-2 on both backends, and the same order of every pair
/// further apart than that, explaining the same answer: the one candle generated (whether the
/// two generate the same reply is the test above).
#[test]
fn explain_agrees_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let (onnx, candle) = configs(dir.path());
    let b = explain(&candle, None, &dir.path().join("candle.json"));
    let reply = b["reply"].as_str().unwrap();
    let a = explain(&onnx, Some(reply), &dir.path().join("onnx.json"));
    assert_eq!(a["reply"], b["reply"]);
    let (va, vb) = (values(&a), values(&b));
    for (x, y) in va.iter().zip(&vb) {
        assert!((x - y).abs() < 1e-2, "{va:?} / {vb:?}");
    }
    common::assert_same_order(&va, &vb, 1e-2);
    assert!(
        a["tokens"]["prompt_tokens_reused"].as_u64().unwrap() > 0,
        "{}",
        a["tokens"]
    );
}
