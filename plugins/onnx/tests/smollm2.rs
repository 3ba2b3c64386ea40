//! The onnx backend on SmolLM2-135M-Instruct exported to ONNX (`scripts/setup-onnx` writes it
//! from the packaged GGUF, dequantized to f32). Two plugin crates cannot be linked into one test
//! binary, so candle's logits come from its `logits` example, and the rest of the agreement
//! with candle is tested through the plugin libraries (`host/tests/onnx.rs`).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use lmhost_onnx::Onnx;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, ErrorKind, GenerationConfig, KvCacheSettings, Message,
    PluginContext, Role, Turn,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn require(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run scripts/setup-onnx from the repository root first",
        path.display()
    );
    path
}

fn export_dir() -> PathBuf {
    require(repo().join("models/smollm2-onnx"))
}

fn library() -> String {
    require(repo().join("models/onnxruntime/libonnxruntime.so.1.32.0"))
        .to_string_lossy()
        .into_owned()
}

fn open_onnx(model: &std::path::Path) -> Result<Onnx, lmhost_plugin_api::PluginError> {
    let context = PluginContext::new("onnx", &model.to_string_lossy())
        .with_options(json!({ "ort_library": library() }));
    Onnx::new(context)
}

fn onnx() -> Arc<Onnx> {
    static M: OnceLock<Arc<Onnx>> = OnceLock::new();
    M.get_or_init(|| Arc::new(open_onnx(&export_dir()).unwrap()))
        .clone()
}

/// One turn of `(role, text)` messages.
fn chat(messages: &[(&str, &str)]) -> ConversationSnapshot {
    let messages = messages
        .iter()
        .map(|&(role, text)| {
            let role = match role {
                "system" => Role::System,
                "user" => Role::User,
                _ => Role::Assistant,
            };
            Message::text(role, text)
        })
        .collect::<Vec<_>>();
    ConversationSnapshot::new(vec![Turn {
        messages: messages.into(),
    }])
    .unwrap()
}

fn question() -> ConversationSnapshot {
    ConversationSnapshot::from_prompt("What is the capital of France?")
}

fn greedy(n: u32) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: n,
        ..GenerationConfig::default()
    }
}

/// candle's `logits` example, built beside this test by `cargo build --workspace --all-targets`.
fn candle_logits(ids: &[u32]) -> Vec<Vec<f32>> {
    let target = std::env::current_exe().unwrap();
    let program = target
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/logits");
    assert!(
        program.is_file(),
        "{} is missing: build with `cargo build --workspace --all-targets`",
        program.display()
    );
    let gguf = require(repo().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    let out = std::process::Command::new(program)
        .arg(gguf)
        .arg(list.join(","))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lmhost_plugin_api::serde_json::from_slice(&out.stdout).unwrap()
}

/// Two runtimes over the same f32 weights: every logit of every position within 1e-3 of
/// candle's.
#[test]
fn logits_match_candles_f32_path() {
    let engine = onnx().engine().unwrap();
    let snapshot = chat(&[
        ("system", "Answer briefly."),
        (
            "user",
            "The museum opens at 9 am on Saturdays. When does it open?",
        ),
    ]);
    let ids = onnx().tokenize(&snapshot, true).unwrap().token_ids.to_vec();
    let ours = engine.logits_all(&ids).unwrap();
    let theirs = candle_logits(&ids);
    assert_eq!((ours.len(), ours[0].len()), (theirs.len(), theirs[0].len()));
    let diff = ours
        .iter()
        .flatten()
        .zip(theirs.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!(
        "max |onnx - candle| over {} positions x {} logits: {diff:e}",
        ids.len(),
        ours[0].len()
    );
    assert!(diff < 1e-3, "{diff}");
}

#[test]
fn greedy_answer_names_paris_and_its_logprobs_match_a_score() {
    let onnx = onnx();
    let r = onnx.generate(&question(), &greedy(24)).unwrap();
    assert!(r.text.contains("Paris"), "{:?}", r.text);
    let scored = onnx.score(&question(), &r.text).unwrap();
    assert_eq!(
        scored.token_ids.len(),
        r.token_ids.len() - 1,
        "all but the end-of-turn"
    );
    for (a, b) in scored.logprobs.iter().zip(r.logprobs.iter()) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

/// Chunked passes from a past state give the logits of one pass over everything.
#[test]
fn a_long_prompt_in_chunks_scores_as_one_pass() {
    let engine = onnx().engine().unwrap();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let ids = engine.front.encode(&text, false).unwrap();
    assert!(
        ids.len() > 512,
        "{} tokens: more than two chunks",
        ids.len()
    );
    let whole = engine.logits_all(&ids).unwrap();
    let snapshot = ConversationSnapshot::raw(text.clone());
    let reply = " The end.";
    let scored = onnx().score(&snapshot, reply).unwrap();
    let reply_ids = engine.front.tokenizer.encode_continuation(reply).unwrap();
    let last = &whole[ids.len() - 1];
    let first = lmhost_plugin_kit::text::logprob_of(last, reply_ids[0]);
    assert!(
        (scored.logprobs[0] - first).abs() < 1e-4,
        "{} vs {first}",
        scored.logprobs[0]
    );
}

#[test]
fn sampling_is_seeded() {
    let config = GenerationConfig {
        temperature: 0.9,
        seed: 7,
        ..greedy(12)
    };
    let a = onnx().generate(&question(), &config).unwrap();
    let b = onnx().generate(&question(), &config).unwrap();
    assert_eq!(a.token_ids, b.token_ids);
    assert!(a.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
}

/// Prompts sharing prefixes score the same one at a time, batched (cache off: one pass along
/// the batch axis, padded) and with the prefix cache on, and the cache is used (a backend of
/// its own: the cache is per backend).
#[test]
fn the_prefix_cache_reuses_positions_without_changing_logprobs() {
    let backend = open_onnx(&export_dir()).unwrap();
    let context = "The museum opens at 9 am on Saturdays. The café opens at 8.";
    let prompts: Vec<ConversationSnapshot> = [
        vec![("system", context), ("user", "When does the museum open?")],
        vec![("system", context), ("user", "When does the café open?")],
        vec![("system", context)],
        vec![("user", "When does the museum open?")],
    ]
    .iter()
    .map(|m| chat(m))
    .collect();
    let reply = "At 9 am.";
    let alone: Vec<_> = prompts
        .iter()
        .map(|p| backend.score(p, reply).unwrap())
        .collect();
    let off = backend.score_batch(&prompts, reply).unwrap();
    // Padded rows run through onnxruntime's kernels in other shapes, which sum in another
    // order, by as much as a cached past does (below): the same bound, for the same reason.
    for (a, b) in alone.iter().zip(&off) {
        assert_eq!(a.token_ids, b.token_ids);
        for (x, y) in a.logprobs.iter().zip(b.logprobs.iter()) {
            assert!((x - y).abs() < 1e-4, "alone {x} vs batched {y}");
        }
    }
    backend
        .set_kv_cache(KvCacheSettings {
            enabled: true,
            max_entries: 64,
            max_bytes: 0,
        })
        .unwrap();
    let on = backend.score_batch(&prompts, reply).unwrap();
    let again = backend.score_batch(&prompts, reply).unwrap();
    // A cached past runs through other onnxruntime kernels than one whole pass, summing in
    // another order: 1.3e-5 apart on an AVX2-only CPU (AMD EPYC), under 1e-5 with AVX-512.
    // A wrong reuse (positions, a stale past) moves logprobs by far more.
    for (a, b) in off.iter().zip(on.iter().chain(&again)) {
        assert_eq!(a.token_ids, b.token_ids);
        for (x, y) in a.logprobs.iter().zip(b.logprobs.iter()) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }
    assert!(
        on[1].cached_prompt_tokens > 0,
        "the second prompt shares the first's system turn"
    );
    assert!(again
        .iter()
        .all(|r| r.cached_prompt_tokens + 1 == r.prompt_tokens));
    let stats = backend.stats();
    assert!(
        stats.kv_cache_hits >= 5 && stats.kv_cache_bytes > 0,
        "{stats:?}"
    );
}

#[test]
fn bad_models_are_refused_naming_the_file_and_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let err = |path: &std::path::Path| open_onnx(path).unwrap().engine().err().unwrap();
    let missing = err(&dir.path().join("nothing-here"));
    assert_eq!(missing.kind, ErrorKind::BackendUnavailable);
    assert!(
        missing.message.contains("does not exist"),
        "{}",
        missing.message
    );

    for name in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(export_dir().join(name), dir.path().join(name)).unwrap();
    }
    let no_graph = err(dir.path());
    assert!(
        no_graph.message.contains("model.onnx is missing"),
        "{}",
        no_graph.message
    );

    std::fs::write(dir.path().join("model.onnx"), "not a protobuf").unwrap();
    let not_onnx = err(dir.path());
    assert!(
        not_onnx.message.contains("model.onnx") && not_onnx.message.contains("cannot load it"),
        "{}",
        not_onnx.message
    );

    // A graph without KV inputs (fixtures/no-kv.onnx: input_ids -> logits, nothing else).
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/no-kv.onnx");
    std::fs::copy(fixture, dir.path().join("model.onnx")).unwrap();
    let no_kv = err(dir.path());
    assert!(
        no_kv.message.contains("attention_mask") && no_kv.message.contains("past_key_values.0.key"),
        "{}",
        no_kv.message
    );

    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let no_tokenizer = err(dir.path());
    assert!(
        no_tokenizer.message.contains("tokenizer.json is missing"),
        "{}",
        no_tokenizer.message
    );
}
