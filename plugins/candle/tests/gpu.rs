//! The backend on a CUDA GPU against itself on CPU: compiled by every build with the `cuda`
//! feature (CI's among them), run by `scripts/test-gpu` where a GPU is (ignored elsewhere).
//!
//! f32 on the GPU differs from f32 on the CPU only in summation order (cuBLAS's tiles against
//! our kernels'), so logits agree within 1e-3 on these models. bf16 keeps 8 bits of mantissa:
//! there only the greedy token is compared, where the CPU's margin over the runner-up is wide
//! enough that rounding cannot decide it.
#![cfg(feature = "cuda")]

mod common;

use std::path::{Path, PathBuf};

use common::{backend, family_metadata, family_tensors, gguf_tensors, max_diff, Greedy, LAYERS};
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{Backend, ConversationSnapshot, GenerationConfig, KvCacheSettings};

/// f32 logits on CUDA against CPU.
const F32_TOL: f32 = 1e-3;
/// The CPU's top-two margin above which bf16 on the GPU must pick the same greedy token.
const BF16_MARGIN: f32 = 1.0;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M), as `scripts/fetch-models` installs them.
fn real_models() -> Vec<PathBuf> {
    [
        "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "models/gemma3-270m/gemma-3-270m-q4_k_m.gguf",
    ]
    .iter()
    .map(|p| {
        let path = repo().join(p);
        assert!(
            path.is_file(),
            "{} missing: run scripts/fetch-models",
            path.display()
        );
        path
    })
    .collect()
}

/// The tiny random models of each family, written as f32 GGUFs into `dir`.
fn tiny_models(dir: &Path) -> Vec<PathBuf> {
    ["llama", "qwen2", "qwen3", "phi3"]
        .iter()
        .map(|arch| {
            let tensors = gguf_tensors(
                arch,
                &family_tensors(arch, LAYERS),
                candle_core::quantized::GgmlDType::F32,
            );
            let path = dir.join(format!("{arch}.gguf"));
            common::write_gguf_file(&path, &family_metadata(arch, LAYERS), &tensors)
        })
        .collect()
}

fn on(model: &Path, device: &str, mut options: Value) -> Candle {
    options["device"] = json!(device);
    backend(model, options)
}

/// A prompt of ordinary tokens, the same for every model (ids below each vocabulary's size).
fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 250 + 1).collect()
}

fn logits(b: &Candle, ids: &[u32]) -> Vec<Vec<f32>> {
    b.engine().unwrap().logits_all(ids).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/test-gpu"]
fn f32_logits_on_cuda_match_the_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let f32 = json!({"weights": "f32", "dtype": "float32"});
    for model in real_models().into_iter().chain(tiny_models(dir.path())) {
        let ids = prompt(96);
        let cpu = logits(&on(&model, "cpu", f32.clone()), &ids);
        let gpu = logits(&on(&model, "cuda", f32.clone()), &ids);
        let diff = max_diff(&gpu, &cpu);
        eprintln!("{}: f32 max |Δlogit| CUDA vs CPU {diff:e}", model.display());
        assert!(diff <= F32_TOL, "{}: {diff}", model.display());
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/test-gpu"]
fn bf16_and_stored_weights_on_cuda_pick_the_cpus_greedy_tokens() {
    for model in real_models() {
        let ids = prompt(96);
        let cpu = logits(&on(&model, "cpu", json!({"weights": "f32"})), &ids);
        for options in [
            json!({"weights": "f32", "dtype": "bfloat16"}),
            json!({"weights": "as_stored", "dtype": "float32"}),
        ] {
            let gpu = logits(&on(&model, "cuda", options.clone()), &ids);
            eprintln!(
                "{} {options}: max |Δlogit| {:e}",
                model.display(),
                max_diff(&gpu, &cpu)
            );
            Greedy::of(&gpu, &cpu, BF16_MARGIN).check(&format!("{} {options}", model.display()));
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/test-gpu"]
fn greedy_replies_on_cuda_are_the_cpus() {
    let config = GenerationConfig {
        max_new_tokens: 24,
        ..GenerationConfig::default()
    };
    let question = ConversationSnapshot::from_prompt("What is the capital of France?");
    for model in real_models() {
        let f32 = json!({"weights": "f32", "dtype": "float32"});
        let cpu = on(&model, "cpu", f32.clone())
            .generate(&question, &config)
            .unwrap();
        let gpu = on(&model, "cuda", f32)
            .generate(&question, &config)
            .unwrap();
        assert_eq!(gpu.text, cpu.text, "{}", model.display());
        let diff = max_diff(&[gpu.logprobs.to_vec()], &[cpu.logprobs.to_vec()]);
        assert!(diff <= F32_TOL, "{}: logprobs {diff}", model.display());
    }
}

/// The prefix cache keeps its states on the GPU and serves them: with it on, prompts that
/// share prefixes reuse them and score as they do with it off.
#[test]
#[ignore = "needs a CUDA GPU: scripts/test-gpu"]
fn the_prefix_cache_on_cuda_reuses_states_and_changes_no_score() {
    let model = &real_models()[0];
    let b = on(model, "cuda", json!({"weights": "f32", "dtype": "float32"}));
    let context = "The museum opens at 9 am on Saturdays. The bridge is closed. ";
    let prompts: Vec<ConversationSnapshot> = (0..8)
        .map(|i| ConversationSnapshot::from_prompt(format!("{context}Question {i}: when?")))
        .collect();
    let score = |b: &Candle| -> Vec<Vec<f32>> {
        prompts
            .iter()
            .map(|p| b.score(p, " At 9 am.").unwrap().logprobs.to_vec())
            .collect()
    };
    let off = score(&b);
    b.set_kv_cache(KvCacheSettings {
        enabled: true,
        max_entries: 64,
        max_bytes: 0,
    })
    .unwrap();
    let on_cache = score(&b);
    let stats = b.stats();
    assert!(
        stats.kv_cache_hits > 0 && stats.kv_cache_reused_tokens > 0,
        "{stats:?}"
    );
    let diff = max_diff(&on_cache, &off);
    assert!(diff <= F32_TOL, "cache on vs off: {diff}");
}

/// `dtype = "bfloat16"` is refused by name on a GPU older than Ampere, and `auto` picks f16
/// there; on Ampere and later both compute in bf16.
#[test]
#[ignore = "needs a CUDA GPU: scripts/test-gpu"]
fn bf16_is_refused_by_name_only_before_ampere() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let device = candle_core::Device::new_cuda(0).unwrap();
    let cap = lmhost_candle::accelerator::compute_capability(&device).unwrap();
    let context = lmhost_plugin_api::PluginContext::new("candle", &model.to_string_lossy())
        .with_options(json!({"device": "cuda", "dtype": "bfloat16"}));
    let opened = Candle::new(context).and_then(|b| b.engine().map(drop));
    eprintln!("compute capability {}.{}", cap.0, cap.1);
    match cap >= lmhost_candle::accelerator::BF16_SINCE {
        true => opened.unwrap(),
        false => {
            let err = opened.unwrap_err();
            assert!(err.message.contains("`dtype`"), "{err}");
        }
    }
}
