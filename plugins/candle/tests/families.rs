//! Every Llama-shaped family against llama.cpp on the same tiny random-weight GGUF file (f32
//! weights), and its Hugging Face checkpoint (same weights, Transformers' names and q/k order)
//! against the GGUF.
//!
//! llama.cpp runs through `scripts/llama-cpp-logits.py --f32-kv` in `.venv`
//! (`scripts/setup-llama-cpp`): with f32 weights and an f32 KV cache both sides compute in f32
//! and agree to at most 9e-6 here (measured; only summation order differs), so `LLAMA_CPP_TOL`
//! is 1e-4. (With llama.cpp's default f16 cache the same runs differ by up to 9e-3.) Switching a
//! feature off misses by far more: without the window or the RoPE scaling logits move by 2 and
//! more, which the tests check. Both sides of a GGUF-vs-checkpoint comparison are this crate's
//! f32 code on the same values (measured at most 3e-6: RoPE on pairs against halves, factors
//! stored against computed), so `SAME_TOL` is 1e-5.

mod common;

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use common::{
    backend, family_config, family_metadata, family_tensors, gguf_tensors, llama_cpp_with,
    max_diff, write_checkpoint, write_gguf_file, LlamaCppInput, HEADS, HIDDEN, LAYERS,
};
use lmhost_plugin_api::serde_json::{json, Value as Json};

/// Ours against llama.cpp with an f32 KV cache on one f32 GGUF (see the module doc).
const LLAMA_CPP_TOL: f32 = 1e-4;
/// Ours on a GGUF against ours on the checkpoint with the same values.
const SAME_TOL: f32 = 1e-5;

/// A prompt of ordinary byte tokens, long enough for RoPE scaling and windows to show.
fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 256).collect()
}

/// Our logits for every position of `ids`, f32 weights.
fn ours(model: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let b = backend(model, json!({"weights": "f32"}));
    b.engine().unwrap().logits_all(ids).unwrap()
}

/// llama.cpp's logits (f32 KV cache) for every position of `ids` on the GGUF at `model`.
fn llama_cpp(model: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    llama_cpp_with(model, LlamaCppInput::Ids(ids), &["--f32-kv"]).1
}

/// The tiny `arch` model's tensors with its layer norms near 1, as trained models have them (the
/// shared tiny weights put them near 0, which makes attention nearly uniform and so hides what
/// RoPE does).
fn tensors(arch: &str, layers: usize) -> Vec<(String, Tensor)> {
    family_tensors(arch, layers)
        .into_iter()
        .map(|(name, t)| match name.ends_with("layernorm.weight") {
            true => (name, t.affine(1.0, 1.0).unwrap()),
            false => (name, t),
        })
        .collect()
}

/// Writes `tensors` as an f32 GGUF of `arch` with `metadata`, plus `extra` tensors by GGUF name.
fn write_f32_gguf(
    path: &Path,
    arch: &str,
    metadata: &[(String, Value)],
    tensors: &[(String, Tensor)],
    extra: Vec<(String, QTensor)>,
) -> PathBuf {
    let mut qtensors = gguf_tensors(arch, tensors, GgmlDType::F32);
    qtensors.extend(extra);
    write_gguf_file(path, metadata, &qtensors)
}

/// The tiny `arch` model (`LAYERS` blocks) as an f32 GGUF and as a checkpoint directory.
fn both_formats(dir: &Path, arch: &str) -> (PathBuf, PathBuf) {
    let tensors = tensors(arch, LAYERS);
    let metadata = family_metadata(arch, LAYERS);
    let gguf = write_f32_gguf(
        &dir.join(format!("{arch}.gguf")),
        arch,
        &metadata,
        &tensors,
        vec![],
    );
    let hf = write_checkpoint(&dir.join(arch), &family_config(arch, LAYERS), &tensors);
    (gguf, hf)
}

/// A family's GGUF against llama.cpp and its checkpoint against the GGUF.
fn check_family(arch: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (gguf, hf) = both_formats(dir.path(), arch);
    let ids = prompt(40);
    let reference = llama_cpp(&gguf, &ids);
    let from_gguf = ours(&gguf, &ids);
    let vs_llama_cpp = max_diff(&from_gguf, &reference);
    let vs_checkpoint = max_diff(&from_gguf, &ours(&hf, &ids));
    eprintln!(
        "{arch}: max |Δlogit| vs llama.cpp {vs_llama_cpp:e}, GGUF vs safetensors {vs_checkpoint:e}"
    );
    assert!(
        vs_llama_cpp <= LLAMA_CPP_TOL,
        "{arch}: {vs_llama_cpp} vs llama.cpp"
    );
    assert!(
        vs_checkpoint <= SAME_TOL,
        "{arch}: GGUF vs safetensors {vs_checkpoint}"
    );
}

#[test]
fn qwen2_matches_llama_cpp_and_its_checkpoint() {
    check_family("qwen2");
}

#[test]
fn qwen3_matches_llama_cpp_and_its_checkpoint() {
    check_family("qwen3");
}

#[test]
fn phi3_matches_llama_cpp_and_its_checkpoint() {
    check_family("phi3");
}

#[test]
fn llama_matches_llama_cpp_and_its_checkpoint() {
    check_family("llama");
}

/// Llama 3.x scaling as llama.cpp's converter writes it (`LlamaModel.generate_extra_tensors`):
/// one divisor per rotated pair, from config.json's `rope_scaling`.
fn llama3_factors(scaling: &Json, head_dim: usize) -> Vec<f32> {
    let get = |k: &str| scaling[k].as_f64().unwrap();
    let (factor, low, high) = (
        get("factor"),
        get("low_freq_factor"),
        get("high_freq_factor"),
    );
    let old = get("original_max_position_embeddings");
    (0..head_dim)
        .step_by(2)
        .map(|i| {
            let freq = 1.0 / 10_000f64.powf(i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor as f32
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// Llama 3.x RoPE scaling: the GGUF's `rope_freqs` against llama.cpp, config.json's
/// `rope_scaling` against the GGUF. The band is set so the four pairs of the 8-wide head are
/// kept, smoothed, scaled and scaled.
#[test]
fn llama3_rope_scaling_matches_llama_cpp_and_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = HIDDEN / HEADS;
    let scaling = json!({
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    });
    let factors = llama3_factors(&scaling, d);
    let rope_freqs = Tensor::new(factors.as_slice(), &Device::Cpu).unwrap();
    let extra = vec![(
        "rope_freqs.weight".to_string(),
        QTensor::quantize(&rope_freqs, GgmlDType::F32).unwrap(),
    )];
    let tensors = tensors("llama", LAYERS);
    let metadata = family_metadata("llama", LAYERS);
    let gguf = write_f32_gguf(
        &dir.path().join("llama3.gguf"),
        "llama",
        &metadata,
        &tensors,
        extra,
    );
    let mut config = family_config("llama", LAYERS);
    config["rope_scaling"] = scaling;
    let hf = write_checkpoint(&dir.path().join("llama3"), &config, &tensors);
    let plain = write_f32_gguf(
        &dir.path().join("plain.gguf"),
        "llama",
        &metadata,
        &tensors,
        vec![],
    );

    let ids = prompt(64);
    let reference = llama_cpp(&gguf, &ids);
    let from_gguf = ours(&gguf, &ids);
    let vs_llama_cpp = max_diff(&from_gguf, &reference);
    let vs_checkpoint = max_diff(&from_gguf, &ours(&hf, &ids));
    let unscaled = max_diff(&ours(&plain, &ids), &reference);
    eprintln!(
        "llama3: max |Δlogit| vs llama.cpp {vs_llama_cpp:e}, GGUF vs safetensors \
         {vs_checkpoint:e}, unscaled vs llama.cpp {unscaled:e}"
    );
    assert!(vs_llama_cpp <= LLAMA_CPP_TOL, "{vs_llama_cpp} vs llama.cpp");
    assert!(
        vs_checkpoint <= SAME_TOL,
        "GGUF vs safetensors {vs_checkpoint}"
    );
    assert!(
        unscaled > 10.0 * LLAMA_CPP_TOL,
        "scaling changed little: {unscaled}"
    );
}

/// A sliding window shorter than the prompt. llama.cpp has no `mistral` architecture and ignores
/// a window on `llama` (Mistral GGUFs are `llama` files), but RoPE attention depends only on
/// relative positions: in a one-layer model, position p under a window of W is what llama.cpp
/// computes for the last of the W tokens ending at p, run alone.
#[test]
fn mistral_sliding_window_matches_llama_cpp_on_each_window() {
    const WINDOW: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let tensors = tensors("llama", 1);
    let with_window = |arch: &str| {
        let mut metadata = family_metadata(arch, 1);
        metadata.push((
            format!("{arch}.attention.sliding_window"),
            Value::U32(WINDOW as u32),
        ));
        let path = dir.path().join(format!("{arch}.gguf"));
        write_f32_gguf(&path, arch, &metadata, &tensors, vec![])
    };
    let (llama, mistral) = (with_window("llama"), with_window("mistral"));
    let ids = prompt(24);
    let windowed = ours(&llama, &ids);
    let full = llama_cpp(&llama, &ids);
    let mut worst = max_diff(&windowed[..WINDOW], &full[..WINDOW]);
    for p in [WINDOW, 13, ids.len() - 1] {
        let alone = llama_cpp(&llama, &ids[p + 1 - WINDOW..=p]);
        worst = worst.max(max_diff(&windowed[p..=p], &alone[WINDOW - 1..]));
    }
    let unwindowed = max_diff(&windowed[WINDOW..], &full[WINDOW..]);
    eprintln!(
        "mistral window: max |Δlogit| vs llama.cpp {worst:e}, without the window {unwindowed:e}"
    );
    assert!(worst <= LLAMA_CPP_TOL, "{worst} vs llama.cpp");
    assert!(
        unwindowed > 10.0 * LLAMA_CPP_TOL,
        "the window changed little: {unwindowed}"
    );
    assert_eq!(
        ours(&mistral, &ids),
        windowed,
        "arch `mistral` reads its window too"
    );

    // config.json's `sliding_window` with Transformers' names and q/k order.
    let mut config = family_config("mistral", 1);
    config["sliding_window"] = json!(WINDOW);
    let hf = write_checkpoint(&dir.path().join("mistral"), &config, &tensors);
    let vs_checkpoint = max_diff(&windowed, &ours(&hf, &ids));
    assert!(
        vs_checkpoint <= SAME_TOL,
        "GGUF vs safetensors {vs_checkpoint}"
    );
}

/// The packed pass (a resumed state, a prefix shared inside the pass, one from scratch) on the
/// families with their own blocks.
#[test]
fn packed_passes_match_single_sequences_on_qwen3_and_phi3() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3", "phi3"] {
        let (gguf, _) = both_formats(dir.path(), arch);
        let b = backend(&gguf, json!({"weights": "f32"}));
        common::check_packed_pass(b.engine().unwrap().model.as_ref());
    }
}

/// What is not implemented is refused, naming the key or tensor.
#[test]
fn unimplemented_rope_variants_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let load_error = |path: &Path| {
        let b = backend(path, json!({}));
        match b.engine() {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => e.message.to_string(),
        }
    };
    let tensors = tensors("phi3", LAYERS);
    let metadata = family_metadata("phi3", LAYERS);
    let long = Tensor::ones(HIDDEN / HEADS / 2, candle_core::DType::F32, &Device::Cpu).unwrap();
    let long_rope = write_f32_gguf(
        &dir.path().join("long.gguf"),
        "phi3",
        &metadata,
        &tensors,
        vec![(
            "rope_factors_long.weight".into(),
            QTensor::quantize(&long, GgmlDType::F32).unwrap(),
        )],
    );
    let err = load_error(&long_rope);
    assert!(err.contains("rope_factors_long"), "{err}");

    let mut yarn = metadata.clone();
    yarn.push((
        "phi3.rope.scaling.type".into(),
        Value::String("yarn".into()),
    ));
    let path = write_f32_gguf(
        &dir.path().join("yarn.gguf"),
        "phi3",
        &yarn,
        &tensors,
        vec![],
    );
    let err = load_error(&path);
    assert!(
        err.contains("phi3.rope.scaling.type") && err.contains("yarn"),
        "{err}"
    );

    let mut partial = metadata.clone();
    partial.push(("phi3.rope.dimension_count".into(), Value::U32(6)));
    let path = write_f32_gguf(
        &dir.path().join("partial.gguf"),
        "phi3",
        &partial,
        &tensors,
        vec![],
    );
    let err = load_error(&path);
    assert!(err.contains("phi3.rope.dimension_count"), "{err}");

    let mut config = family_config("phi3", LAYERS);
    config["rope_scaling"] =
        json!({"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]});
    let path = write_checkpoint(&dir.path().join("phi3"), &config, &tensors);
    let err = load_error(&path);
    assert!(
        err.contains("\"longrope\"") && err.contains("llama3"),
        "{err}"
    );
}
