//! Loading, shapes, generation mechanics and errors on tiny models the tests write themselves.

mod common;

use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use common::{backend, max_diff, write_gguf, write_safetensors};
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, ErrorKind, FinishReason, GenerationConfig, Message,
    PluginContext, PluginError, Role, Turn,
};

fn prompt() -> ConversationSnapshot {
    ConversationSnapshot::from_prompt("hello there, tiny model")
}

fn greedy(n: u32) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: n,
        ..GenerationConfig::default()
    }
}

fn load_error(model: &Path, options: lmhost_plugin_api::serde_json::Value) -> PluginError {
    let b = backend(model, options);
    b.generate(&prompt(), &greedy(2)).unwrap_err()
}

fn logits(b: &Candle, text: &str) -> Vec<Vec<f32>> {
    let engine = b.engine().unwrap();
    let ids = engine.front.encode(text, false).unwrap();
    engine.logits_all(&ids).unwrap()
}

#[test]
fn gguf_loads_and_generates_with_consistent_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    for weights in ["as_stored", "f32", "q8_0", "auto", "mixed"] {
        let b = backend(&path, json!({ "weights": weights }));
        let r = b.generate(&prompt(), &greedy(6)).unwrap();
        assert!(
            !r.token_ids.is_empty() && r.token_ids.len() <= 6,
            "{weights}"
        );
        assert_eq!(r.logprobs.len(), r.token_ids.len());
        assert!(r.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
        assert!(r.prompt_tokens > 10);
        if r.finish_reason == FinishReason::Length {
            assert_eq!(r.token_ids.len(), 6);
        }
        // The logprobs a forward pass over prompt + reply gives, position by position.
        let s = b.score(&prompt(), &r.text).unwrap();
        if s.token_ids.as_slice() == &r.token_ids[..s.token_ids.len().min(r.token_ids.len())] {
            for (a, g) in s.logprobs.iter().zip(r.logprobs.iter()) {
                // `auto` and `mixed` decode with 8-bit activations, score in f32: a few
                // activations round the other way (1.2e-2 in a logit measured; the blocks are
                // the same bits on every path, so another CPU moves only f32 sums).
                let tolerance = if matches!(weights, "auto" | "mixed") {
                    5e-2
                } else {
                    1e-4
                };
                assert!(
                    (a - g).abs() <= tolerance,
                    "{weights}: score {a} vs generate {g}"
                );
            }
        }
    }
}

#[test]
fn logits_have_one_row_per_position_and_the_vocab_width() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let rows = logits(&backend(&path, json!({})), "xyz uvw");
    assert_eq!(rows.len(), 7);
    assert!(rows.iter().all(|r| r.len() == common::vocab_size()));
}

#[test]
fn safetensors_dtypes_and_shards_agree() {
    let dir = tempfile::tempdir().unwrap();
    let f32_dir = write_safetensors(&dir.path().join("f32"), DType::F32, 1);
    let reference = logits(&backend(&f32_dir, json!({})), "some text");
    let sharded = write_safetensors(&dir.path().join("sharded"), DType::F32, 3);
    let diff = max_diff(
        &reference,
        &logits(&backend(&sharded, json!({})), "some text"),
    );
    assert!(diff == 0.0, "sharded differs by {diff}");
    for dtype in [DType::F16, DType::BF16] {
        let d = write_safetensors(&dir.path().join(format!("{dtype:?}")), dtype, 1);
        let diff = max_diff(&reference, &logits(&backend(&d, json!({})), "some text"));
        assert!(diff < 0.1, "{dtype:?} differs by {diff}");
    }
    let r = backend(&f32_dir, json!({}))
        .generate(&prompt(), &greedy(4))
        .unwrap();
    assert_eq!(r.logprobs.len(), r.token_ids.len());
}

#[test]
fn attention_implementations_agree_inside_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_safetensors(&dir.path().join("m"), DType::F32, 1);
    let text = "a longer prompt so that the chunked kernel works in several chunks of queries";
    let eager = logits(
        &backend(&path, json!({"attn_implementation": "eager"})),
        text,
    );
    let chunked = logits(
        &backend(&path, json!({"attn_implementation": "chunked"})),
        text,
    );
    let diff = max_diff(&eager, &chunked);
    assert!(diff < 1e-4, "chunked differs from eager by {diff}");
}

#[test]
fn seeded_sampling_repeats_and_stop_strings_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let b = backend(&path, json!({"weights": "f32"}));
    let sampled = |seed| GenerationConfig {
        max_new_tokens: 8,
        temperature: 1.0,
        top_k: 50,
        top_p: 0.95,
        seed,
        ..GenerationConfig::default()
    };
    let a = b.generate(&prompt(), &sampled(7)).unwrap();
    assert_eq!(
        a.token_ids,
        b.generate(&prompt(), &sampled(7)).unwrap().token_ids
    );
    let others: Vec<_> = (8..12)
        .map(|s| b.generate(&prompt(), &sampled(s)).unwrap().token_ids)
        .collect();
    assert!(
        others.iter().any(|o| *o != a.token_ids),
        "seeds should matter"
    );
    let full = b.generate(&prompt(), &greedy(8)).unwrap();
    let chars: Vec<char> = full.text.chars().collect();
    if chars.len() >= 3 {
        let stop: String = chars[1..3].iter().collect();
        let config = GenerationConfig {
            stop: vec![stop.clone().into()].into(),
            ..greedy(8)
        };
        let cut = b.generate(&prompt(), &config).unwrap();
        assert_eq!(cut.finish_reason, FinishReason::StopString);
        assert!(!cut.text.contains(&stop));
        assert!(full.text.starts_with(cut.text.as_str()));
    }
}

#[test]
fn embeddings_have_the_hidden_width() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let b = backend(&path, json!({}));
    let config = GenerationConfig {
        compute_embeddings: true,
        ..greedy(3)
    };
    let r = b.generate(&prompt(), &config).unwrap();
    let e = r.embedding.into_option().unwrap();
    let c = r.contextual_embedding.into_option().unwrap();
    assert_eq!((e.len(), c.len()), (common::HIDDEN, common::HIDDEN));
    assert_ne!(e, c);
}

#[test]
fn prompt_errors_name_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let err = backend(&path, json!({"max_context": 8}))
        .generate(&prompt(), &greedy(2))
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(
        err.message.contains(" 8 ") && err.message.contains("tokens"),
        "{err}"
    );
    let long = backend(&path, json!({})).generate(
        &ConversationSnapshot::from_prompt("x ".repeat(300)),
        &greedy(2),
    );
    let err = long.unwrap_err();
    assert!(err.message.contains("256"), "{err}");
}

#[test]
fn empty_prompt_is_invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_safetensors(&dir.path().join("m"), DType::F32, 1);
    let template = json!({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"});
    std::fs::write(model.join("tokenizer_config.json"), template.to_string()).unwrap();
    let turn = Turn {
        messages: vec![Message::text(Role::User, "")].into(),
    };
    let snapshot = ConversationSnapshot::new(vec![turn]).unwrap();
    let err = backend(&model, json!({}))
        .generate(&snapshot, &greedy(2))
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("empty"), "{err}");
}

#[test]
fn broken_files_are_unavailable_and_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_gguf(&dir.path().join("good.gguf"), "llama");
    let bytes = std::fs::read(&good).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated.gguf",
            bytes[..bytes.len() / 2].to_vec(),
            "truncated.gguf",
        ),
        ("header.gguf", bytes[..64].to_vec(), "GGUF"),
        ("garbage.gguf", b"not a gguf at all".to_vec(), "GGUF"),
        // The data section cut short: refused before a tensor is read into a buffer.
        (
            "short.gguf",
            bytes[..bytes.len() - 100].to_vec(),
            "past the end of the file",
        ),
        // A header that claims a billion tensors: refused before anything is allocated.
        (
            "billion.gguf",
            [&bytes[..8], &1_000_000_000u64.to_le_bytes(), &bytes[16..]].concat(),
            "declares 1000000000 tensors",
        ),
    ];
    for (name, data, expect) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        let err = load_error(&path, json!({}));
        assert_eq!(err.kind, ErrorKind::BackendUnavailable, "{name}: {err}");
        assert!(
            err.message.contains(name) && err.message.contains(expect),
            "{name}: {err}"
        );
    }
    let unknown = write_gguf(&dir.path().join("gpt9.gguf"), "gpt9");
    let err = load_error(&unknown, json!({}));
    assert!(
        err.message.contains("unknown architecture \"gpt9\""),
        "{err}"
    );
    let missing = load_error(&dir.path().join("nope.gguf"), json!({}));
    assert_eq!(missing.kind, ErrorKind::BackendUnavailable);
    assert!(missing.message.contains("nope.gguf"), "{missing}");
}

/// A safetensors header that claims more than its file holds (a header of 2^60 bytes, a tensor
/// of 2^80 elements, data past the end) is refused naming the file, before anything of that
/// size is allocated.
#[test]
fn hostile_safetensors_headers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_safetensors(&dir.path().join("m"), DType::F32, 1);
    let file = model.join("model.safetensors");
    let header = |json: &str| {
        [
            &(json.len() as u64).to_le_bytes()[..],
            json.as_bytes(),
            &[0; 16],
        ]
        .concat()
    };
    let cases = [
        (
            [&(1u64 << 60).to_le_bytes()[..], b"{}"].concat(),
            "header too large",
        ),
        (
            header(
                r#"{"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,16]}}"#,
            ),
            "overflow computing buffer size",
        ),
        (
            header(r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,1000000000000]}}"#),
            "invalid shape, data type, or offset",
        ),
    ];
    for (bytes, expected) in cases {
        std::fs::write(&file, &bytes).unwrap();
        let err = load_error(&model, json!({}));
        assert_eq!(err.kind, ErrorKind::BackendUnavailable, "{err}");
        assert!(
            err.message.contains("model.safetensors") && err.message.contains(expected),
            "{err}"
        );
    }
}

#[test]
fn wrong_tensor_shape_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_safetensors(&dir.path().join("m"), DType::F32, 1);
    let mut config = common::hf_config();
    config["intermediate_size"] = json!(48);
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let err = load_error(&model, json!({}));
    assert_eq!(err.kind, ErrorKind::BackendUnavailable);
    assert!(
        err.message.contains("mlp.gate_proj.weight") && err.message.contains("[48, 32]"),
        "{err}"
    );
    std::fs::write(
        model.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{",
    )
    .unwrap();
    let err = load_error(&model, json!({}));
    assert!(err.message.contains("model.safetensors"), "{err}");
}

#[test]
fn option_errors_name_the_key() {
    let context =
        PluginContext::new("candle", "x").with_options(json!({"attn_implementation": "nope"}));
    let err = Candle::new(context).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Config);
    assert!(err.message.contains("`attn_implementation`"), "{err}");
    let specs = Candle::options();
    let keys: Vec<&str> = specs.iter().map(|s| s.key.as_str()).collect();
    for key in [
        "dtype",
        "device",
        "revision",
        "weights",
        "attn_implementation",
        "model_class",
        "threads",
        "max_context",
    ] {
        assert!(keys.contains(&key), "{key} missing from {keys:?}");
    }
}

#[test]
fn unreachable_hub_names_id_and_cache() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing/here");
    let err = load_error(&missing, json!({}));
    assert!(err.message.contains("nothing/here"), "{err}");
    // Runs against the real hub client; here the hub is out of reach (or the repo is absent).
    let err = load_error(
        Path::new("lmhost-test/no-such-model"),
        json!({"revision": "v0"}),
    );
    assert_eq!(err.kind, ErrorKind::BackendUnavailable);
    assert!(
        err.message.contains("lmhost-test/no-such-model") && err.message.contains("cache"),
        "{err}"
    );
}

/// A one-entry store: enough to check the prefix-cache hook (the real cache is issue 4's).
#[derive(Default)]
struct LastPrompt {
    entry: Option<(Vec<u32>, lmhost_candle::kv::KvState)>,
    lookups: usize,
}

impl lmhost_plugin_kit::prefix_cache::PrefixStore<lmhost_candle::kv::KvState> for LastPrompt {
    fn lookup(
        &mut self,
        tokens: &[u32],
        shared: usize,
    ) -> Option<(lmhost_candle::kv::KvState, usize)> {
        self.lookups += 1;
        let (stored, state) = self.entry.as_ref()?;
        let n = stored
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let n = n.min(tokens.len() - 1);
        let mut state = state.clone();
        state.crop(n).ok()?;
        (n > shared).then_some((state, n))
    }

    fn store(&mut self, tokens: &[u32], state: lmhost_candle::kv::KvState) {
        assert_eq!(
            tokens.len(),
            state.len(),
            "stored state must cover exactly its tokens"
        );
        self.entry = Some((tokens.to_vec(), state));
    }
}

#[test]
fn prefix_hook_reuses_states_without_changing_results() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let b = backend(&path, json!({"weights": "f32"}));
    let engine = b.engine().unwrap();
    let a = ConversationSnapshot::from_prompt("shared words then branch A");
    let other = ConversationSnapshot::from_prompt("shared words then the other branch");
    let mut store = LastPrompt::default();
    let plain_a = engine
        .generate(&a, &greedy(5), None, &mut |_| true)
        .unwrap();
    let plain_other = engine.score(&other, "a reply", None).unwrap();
    let first = engine
        .generate(&a, &greedy(5), Some(&mut store), &mut |_| true)
        .unwrap();
    assert_eq!(first.cached_prompt_tokens, 0);
    // B branches off A's stored state; then A again must be unaffected by B's decoding.
    let branched = engine.score(&other, "a reply", Some(&mut store)).unwrap();
    assert!(
        branched.cached_prompt_tokens > 5,
        "{}",
        branched.cached_prompt_tokens
    );
    let again = engine
        .generate(&a, &greedy(5), Some(&mut store), &mut |_| true)
        .unwrap();
    assert!(again.cached_prompt_tokens > 5);
    assert_eq!(store.lookups, 3);
    for (x, y) in [(&plain_a, &first), (&plain_a, &again)] {
        assert_eq!(x.token_ids, y.token_ids);
        let d = max_diff(&[x.logprobs.to_vec()], &[y.logprobs.to_vec()]);
        assert!(d <= 1e-5, "cached generate differs by {d}");
    }
    let d = max_diff(
        &[plain_other.logprobs.to_vec()],
        &[branched.logprobs.to_vec()],
    );
    assert!(d <= 1e-5, "cached score differs by {d}");
}

#[test]
fn qwen2_loads_its_qkv_biases_and_they_matter() {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let model = write_safetensors(&dir.path().join("q"), DType::F32, 1);
    let reference = logits(&backend(&model, json!({})), "bias check");
    let mut config = common::hf_config();
    config["model_type"] = json!("qwen2");
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let err = load_error(&model, json!({}));
    assert!(err.message.contains("self_attn.q_proj.bias"), "{err}");
    let mut tensors: HashMap<String, candle_core::Tensor> =
        common::hf_tensors().into_iter().collect();
    let d = common::HIDDEN / common::HEADS;
    for l in 0..common::LAYERS {
        for (proj, heads) in [
            ("q", common::HEADS),
            ("k", common::KV_HEADS),
            ("v", common::KV_HEADS),
        ] {
            let name = format!("model.layers.{l}.self_attn.{proj}_proj.bias");
            tensors.insert(name, common::weights(&[heads * d], 40 + l as u64, 0.5));
        }
    }
    candle_core::safetensors::save(&tensors, model.join("model.safetensors")).unwrap();
    let biased = logits(&backend(&model, json!({})), "bias check");
    assert!(max_diff(&reference, &biased) > 1e-3, "biases had no effect");
}

/// A packed pass gives each sequence the logits it gets alone: sequences with a cached state,
/// one that takes its prefix from an earlier sequence of the pass, and one from scratch.
#[test]
fn a_packed_pass_matches_each_sequence_run_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let b = backend(&path, json!({"weights": "f32"}));
    common::check_packed_pass(b.engine().unwrap().model.as_ref());
}

/// Eager attention that panics while `PANIC` is set.
struct Panicky;

static PANIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static PANIC_DECODING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The flags are global: the tests that set them run one at a time.
static PANICKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl lmhost_candle::attention::Attention for Panicky {
    fn forward(
        &self,
        q: &candle_core::Tensor,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
        p: &lmhost_candle::attention::AttnParams,
    ) -> candle_core::Result<candle_core::Tensor> {
        assert!(
            !PANIC.load(std::sync::atomic::Ordering::SeqCst),
            "attention asked to panic"
        );
        let decoding = q.dim(2)? == 1;
        assert!(
            !(decoding && PANIC_DECODING.load(std::sync::atomic::Ordering::SeqCst)),
            "attention asked to panic in a decode step"
        );
        lmhost_candle::attention::Eager::default().forward(q, k, v, p)
    }
}

/// A tiny model in `dir` whose attention is [`Panicky`].
fn panicky_backend(dir: &Path) -> Candle {
    let path = write_gguf(&dir.join("tiny.gguf"), "llama");
    lmhost_candle::attention::register("panicky", std::sync::Arc::new(Panicky));
    backend(&path, json!({ "attn_implementation": "panicky" }))
}

/// A call that panics while holding the prefix cache's lock (the plugin boundary turns the
/// panic into an error) leaves the backend serving: the next calls answer as before, with the
/// cache emptied and used again.
#[test]
fn a_panic_holding_the_cache_lock_does_not_disable_the_backend() {
    let _one_at_a_time = PANICKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let b = panicky_backend(dir.path());
    b.set_kv_cache(lmhost_plugin_api::KvCacheSettings {
        enabled: true,
        max_entries: 16,
        max_bytes: 0,
    })
    .unwrap();
    let before = b.generate(&prompt(), &greedy(4)).unwrap();
    PANIC.store(true, std::sync::atomic::Ordering::SeqCst);
    let long = ConversationSnapshot::from_prompt("hello there, tiny model, and more words");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.generate(&long, &greedy(4))
    }));
    PANIC.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(panicked.is_err(), "the call panicked inside the cache lock");
    let after = b.generate(&prompt(), &greedy(4)).unwrap();
    assert_eq!(after.token_ids, before.token_ids);
    assert_eq!(after.cached_prompt_tokens, 0, "the cache was emptied");
    let again = b.generate(&prompt(), &greedy(4)).unwrap();
    assert!(again.cached_prompt_tokens > 0, "and is used again");
}

/// A decode pass that panics fails its generation with an error, and the next generations
/// still batch their steps (no caller is left waiting for a pass that died).
#[test]
fn a_panicking_decode_pass_fails_its_generation_and_batching_goes_on() {
    let _one_at_a_time = PANICKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let b = panicky_backend(dir.path());
    let before = b.generate(&prompt(), &greedy(4)).unwrap();
    PANIC_DECODING.store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = b.generate(&prompt(), &greedy(4));
    PANIC_DECODING.store(false, std::sync::atomic::Ordering::SeqCst);
    let err = failed.expect_err("the decode pass panicked");
    assert!(
        err.message.contains("decode pass panicked"),
        "{}",
        err.message
    );
    let after = b.generate(&prompt(), &greedy(4)).unwrap();
    assert_eq!(after.token_ids, before.token_ids);
}

/// Generations decoding together share passes even though each samples its token between
/// them: a queued step waits (up to `LINGER`) for the other generations' steps instead of
/// leading a pass of its own, so passes do not split into those who sampled first and the
/// rest. Four generations that each take a millisecond between steps.
#[test]
fn decode_steps_wait_for_every_generation_decoding_now() {
    use lmhost_candle::batch::{Batcher, LINGER};
    assert!(LINGER > std::time::Duration::from_millis(1));
    let dir = tempfile::tempdir().unwrap();
    let b = backend(
        &write_gguf(&dir.path().join("tiny.gguf"), "llama"),
        json!({}),
    );
    let engine = b.engine().unwrap();
    let model = &*engine.model;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let batcher = Batcher::default();
    let (generations, steps) = (4, 12);
    let barrier = std::sync::Barrier::new(generations);
    std::thread::scope(|s| {
        for g in 0..generations {
            let (batcher, pool, barrier) = (&batcher, &pool, &barrier);
            s.spawn(move || {
                let _decoding = batcher.join();
                barrier.wait();
                let mut kv = model.new_state();
                for step in 0..steps {
                    let token = (g * steps + step) as u32 % 32;
                    kv = batcher.step(pool, model, token, kv).unwrap().0;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            });
        }
    });
    let (passes, stepped) = batcher.counts();
    assert_eq!(stepped, (generations * steps) as u64);
    // Without waiting, a pass leaves as soon as the first sampler queues: about two rows each.
    let rows = stepped as f64 / passes as f64;
    assert!(
        rows >= 3.0,
        "{rows:.2} rows a pass for {generations} generations"
    );
}

/// A sequence's logits in a packed decode pass through the quantized kernels are bit for bit
/// its logits in a pass of its own, whatever else the pass carries and however many rows, so
/// batching never changes a greedy reply: Q8_0 matrices, and Q4_1 ones (interleaved on
/// AVX-512). (With `f32` weights candle's GEMM rounds differently with the row count.)
#[test]
fn a_packed_decode_row_equals_the_same_row_alone() {
    use lmhost_candle::batch::decode_pass;
    use lmhost_candle::kernels::ROWS;
    use lmhost_candle::models::Logits;
    let dir = tempfile::tempdir().unwrap();
    let q8_0 = write_gguf(&dir.path().join("q8_0.gguf"), "llama");
    let q4_1 = common::write_gguf_file(
        &dir.path().join("q4_1.gguf"),
        &common::gguf_metadata("llama"),
        &common::gguf_tensors("llama", &common::hf_tensors(), GgmlDType::Q4_1),
    );
    for (file, weights) in [(&q8_0, "auto"), (&q8_0, "compact"), (&q4_1, "auto")] {
        let b = backend(file, json!({ "weights": weights }));
        let engine = b.engine().unwrap();
        let model = &*engine.model;
        let prompts: Vec<Vec<u32>> = (0..5)
            .map(|i| (0..3 + 2 * i).map(|t| (t * 7 + i) as u32 % 40).collect())
            .collect();
        let states: Vec<_> = prompts
            .iter()
            .map(|p| {
                let mut kv = model.new_state();
                model.forward(p, &mut kv, Logits::Last, false).unwrap();
                kv
            })
            .collect();
        let step = |rows: &[usize]| -> Vec<Vec<f32>> {
            let mut kvs: Vec<_> = rows.iter().map(|&r| states[r].clone()).collect();
            let tokens = rows.iter().map(|&r| r as u32 + 3);
            let logits = decode_pass(model, kvs.iter_mut().zip(tokens)).unwrap();
            logits
                .into_iter()
                .map(|l| l.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap())
                .collect()
        };
        let alone: Vec<Vec<f32>> = (0..5).map(|r| step(&[r]).remove(0)).collect();
        // More rows than a kernel call carries run as passes side by side, on pool threads
        // that were not generating.
        let rows: Vec<usize> = (0..ROWS + 3).map(|i| (i * 3) % 5).collect();
        for rows in [&[0, 1, 2, 3, 4][..], &rows] {
            for (&r, row) in rows.iter().zip(step(rows)) {
                assert_eq!(row, alone[r], "{weights}: row {r} of {}", rows.len());
            }
        }
    }
}

/// A generation's decode state is sized for its prompt and reply: the first decode step copies
/// the prompt once into room for `max_new_tokens`, not for twice the prompt, and the reply's
/// positions then land in place.
#[test]
fn a_generation_holds_room_for_its_reply_not_twice_its_prompt() {
    use lmhost_candle::batch::decode_pass;
    let dir = tempfile::tempdir().unwrap();
    let b = backend(
        &write_gguf(&dir.path().join("tiny.gguf"), "llama"),
        json!({}),
    );
    let engine = b.engine().unwrap();
    let snapshot = ConversationSnapshot::from_prompt("x ".repeat(60));
    let started = engine
        .start_batch(&[snapshot], None)
        .unwrap()
        .pop()
        .unwrap();
    let mut steps = Vec::new();
    let record = engine
        .finish(started, &greedy(4), &mut |_| true, &mut |token, mut kv| {
            let logits = decode_pass(&*engine.model, [(&mut kv, token)]).unwrap();
            let row = logits[0].as_ref().unwrap().flatten_all().unwrap();
            steps.push((kv.len(), kv.capacity()));
            Ok((kv, row.to_vec1::<f32>().unwrap()))
        })
        .unwrap();
    let prompt = record.prompt_tokens as usize;
    assert!(prompt > 40, "{prompt} prompt tokens");
    assert_eq!(steps.len(), 3, "{steps:?}");
    for (i, &(len, capacity)) in steps.iter().enumerate() {
        assert_eq!(len, prompt + i + 1);
        assert_eq!(capacity, prompt + 1 + 4, "step {i}: {steps:?}");
    }
}

/// A generation's prompt picks its first token through the output layer's decode copy, as
/// every later token's, while scoring the same row stays on the prefill copy: with `auto`
/// the two rows differ by what Q8_0 explains, with `f32` (one copy) by f32 rounding only
/// (candle's GEMM rounds differently with the row count).
#[test]
fn a_sampled_prompt_row_takes_the_decode_output_layer() {
    use lmhost_candle::models::Logits;
    let dir = tempfile::tempdir().unwrap();
    let prompt: Vec<u32> = (0..9).map(|t| (t * 5 + 2) % 40).collect();
    for (weights, copies) in [("auto", 2), ("f32", 1)] {
        let b = backend(
            &write_gguf(&dir.path().join("tiny.gguf"), "llama"),
            json!({ "weights": weights }),
        );
        let model = &*b.engine().unwrap().model;
        let row = |logits: Logits| -> Vec<f32> {
            let out = model.forward(&prompt, &mut model.new_state(), logits, false);
            let rows = out.unwrap().logits.unwrap().to_vec2::<f32>().unwrap();
            rows.last().unwrap().clone()
        };
        let (sampled, scored) = (row(Logits::Last), row(Logits::All));
        let diff = sampled
            .iter()
            .zip(&scored)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("{weights}: sampled vs scored last row, max |Δlogit| = {diff:e}");
        if copies == 2 {
            assert!(diff > 1e-3 && diff < 0.05, "{weights}: {diff}");
        } else {
            assert!(diff <= 1e-5, "{weights}: {diff}");
        }
    }
}

/// With `auto` where the kernels have AVX2 or AVX-512 ([`stored_prompts`]), a generation's
/// prompt runs through the decode copies (here the stored Q8_0 blocks `compact` runs, bit for
/// bit), on the scalar path through the f32 copy scoring uses. Either way a score never starts from a
/// state such a prompt cached: after a generation of the same prompt it equals the score with
/// the cache off, bit for bit, and where the prompts ran apart it reused nothing of theirs.
///
/// [`stored_prompts`]: lmhost_candle::weights::stored_prompts
#[test]
fn prompts_through_the_decode_copies_are_cached_apart_from_scores() {
    use candle_core::Device;
    use lmhost_candle::models::Logits;
    use lmhost_candle::weights::{stored_prompts, WeightFormat};
    use lmhost_plugin_api::KvCacheSettings;
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let apart = stored_prompts(WeightFormat::Auto, true, DType::F32, &Device::Cpu);
    println!("prompts through the decode copies: {apart}");
    let prompt_row = |weights: &str, as_prompt: bool| -> Vec<f32> {
        let b = backend(&path, json!({ "weights": weights }));
        let engine = b.engine().unwrap();
        let ids: Vec<u32> = (0..12).map(|t| (t * 5 + 2) % 40).collect();
        let mut kv = engine.model.new_state();
        let mut pass = || engine.model.forward(&ids, &mut kv, Logits::All, false);
        let out = if as_prompt {
            engine.prompting(pass)
        } else {
            pass()
        };
        out.unwrap().logits.unwrap().to_vec2::<f32>().unwrap()[0].clone()
    };
    let prompted = prompt_row("auto", true);
    let expected = prompt_row(if apart { "compact" } else { "auto" }, false);
    assert_eq!(prompted, expected);
    assert_ne!(prompt_row("auto", false), prompt_row("compact", false));

    let b = backend(&path, json!({ "weights": "auto" }));
    let reply = b.generate(&prompt(), &greedy(4)).unwrap().text;
    let uncached = b.score(&prompt(), &reply).unwrap();
    let settings = |enabled| KvCacheSettings {
        enabled,
        max_entries: 64,
        max_bytes: 0,
    };
    b.set_kv_cache(settings(true)).unwrap();
    let first = b.generate(&prompt(), &greedy(4)).unwrap();
    let scored = b.score(&prompt(), &reply).unwrap();
    assert_eq!(scored.logprobs, uncached.logprobs);
    assert_eq!(scored.cached_prompt_tokens == 0, apart);
    let again = b.generate(&prompt(), &greedy(4)).unwrap();
    assert!(again.cached_prompt_tokens > 0);
    assert_eq!(again.token_ids, first.token_ids);
}
