//! The real default model: SmolLM2-135M-Instruct Q4_1 GGUF (run `scripts/fetch-models`).
//!
//! Each model format loads once per test binary (shared `OnceLock`s).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use lmhost_candle::models::Logits;
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, GenerationConfig, Hideable, Message, PluginContext, Role,
    TextSpan, Turn,
};
use lmhost_plugin_kit::text::Hiding;

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-models from the repository root first",
        path.display()
    );
    path
}

fn open(options: Value) -> Arc<Candle> {
    let context =
        PluginContext::new("candle", &model_path().to_string_lossy()).with_options(options);
    Arc::new(Candle::new(context).unwrap())
}

/// Weights dequantized to f32: exact agreement between decode and full passes.
fn f32_model() -> Arc<Candle> {
    static M: OnceLock<Arc<Candle>> = OnceLock::new();
    M.get_or_init(|| open(json!({"weights": "f32"}))).clone()
}

/// The file with its Q4_1 matrices requantized to Q8_0 (written once per test binary): every
/// type one that candle repacks, so `as_stored` runs candle's own kernels on it (Q4_1 it runs
/// through ours).
fn requantized_path() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut file = std::fs::File::open(model_path()).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        let mut tensors = Vec::new();
        for name in content.tensor_infos.keys() {
            let t = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            let t = match t.dtype() {
                GgmlDType::Q4_1 => {
                    let dense = t.dequantize(&Device::Cpu).unwrap();
                    QTensor::quantize(&dense, GgmlDType::Q8_0).unwrap()
                }
                _ => t,
            };
            tensors.push((name.clone(), t));
        }
        let metadata: Vec<(&str, &gguf_file::Value)> = content
            .metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut out = std::fs::File::create(dir.path().join("smollm2-q8_0.gguf")).unwrap();
        gguf_file::write(&mut out, &metadata, &tensors).unwrap();
        dir
    });
    dir.path().join("smollm2-q8_0.gguf")
}

/// [`requantized_path`]'s weights as stored, with unpadded eager attention: op for op
/// candle-transformers' `quantized_llama`. (Padded keys change only f32 rounding, but its Q8_1
/// activation quantization turns such rounding into logit differences of up to about 0.5.)
fn stored_model() -> Arc<Candle> {
    static M: OnceLock<Arc<Candle>> = OnceLock::new();
    M.get_or_init(|| {
        let unpadded = lmhost_candle::attention::Eager { key_align: 1 };
        lmhost_candle::attention::register("eager_unpadded", Arc::new(unpadded));
        let options = json!({"weights": "as_stored", "attn_implementation": "eager_unpadded"});
        let path = requantized_path();
        let context = PluginContext::new("candle", &path.to_string_lossy()).with_options(options);
        Arc::new(Candle::new(context).unwrap())
    })
    .clone()
}

/// `options` with the prefix cache on, as explain and serve run them.
fn cached(options: Value) -> Arc<Candle> {
    let b = open(options);
    b.set_kv_cache(lmhost_plugin_api::KvCacheSettings {
        enabled: true,
        max_entries: 64,
        max_bytes: 0,
    })
    .unwrap();
    b
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

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn greedy_answer_names_paris() {
    let r = f32_model().generate(&question(), &greedy(24)).unwrap();
    println!("answer: {:?} ({:?})", r.text, r.finish_reason);
    assert!(r.text.contains("Paris"), "{:?}", r.text);
}

#[test]
fn logprobs_match_a_full_forward_and_score() {
    let b = f32_model();
    let r = b.generate(&question(), &greedy(12)).unwrap();
    let engine = b.engine().unwrap();
    let prompt = engine.front.prompt_ids(&question(), 0).unwrap();
    let mut all = prompt.clone();
    all.extend_from_slice(&r.token_ids);
    let rows = engine.logits_all(&all[..all.len() - 1]).unwrap();
    let full: Vec<f32> = r
        .token_ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            lmhost_plugin_kit::sampling::log_softmax(&rows[prompt.len() - 1 + i])[id as usize]
        })
        .collect();
    let diff = max_abs_diff(&r.logprobs, &full);
    println!("generate vs one full pass: max |Δlogprob| = {diff:e}");
    assert!(diff <= 1e-4, "{diff}");
    let s = b.score(&question(), &r.text).unwrap();
    assert_eq!(s.token_ids.as_slice(), &r.token_ids[..s.token_ids.len()]);
    let diff = max_abs_diff(&s.logprobs, &r.logprobs[..s.logprobs.len()]);
    println!("score vs generate: max |Δlogprob| = {diff:e}");
    assert!(diff <= 1e-4, "{diff}");
}

/// Keys and values kept in f16 (`kv_cache_dtype = "float16"`): a greedy answer's logprobs
/// (up to where a near tie may part the two answers) and a score of the f32 answer within
/// f16's rounding of f32's, and a prompt's state in half the bytes. With f32 weights, so that
/// every difference is the keys' and values' own: through 8-bit activations a difference of
/// 1e-3 can round an activation the other way (the default `auto` weights moved this
/// answer's logprobs by up to 0.26). The step in place reads f16 where it lies, bit for bit
/// as the op-by-op pass does: `tests/decode_in_place.rs`.
#[test]
fn f16_keys_and_values_stay_near_f32_in_half_the_memory() {
    let (f32s, f16s) = (
        open(json!({"weights": "f32"})),
        open(json!({"weights": "f32", "kv_cache_dtype": "float16"})),
    );
    let (a, b) = (
        f32s.generate(&question(), &greedy(12)).unwrap(),
        f16s.generate(&question(), &greedy(12)).unwrap(),
    );
    let same = a
        .token_ids
        .iter()
        .zip(b.token_ids.iter())
        .take_while(|(x, y)| x == y)
        .count();
    assert!(same >= 4, "{:?} against {:?}", a.text, b.text);
    let generated = max_abs_diff(&a.logprobs[..same], &b.logprobs[..same]);
    let (sa, sb) = (
        f32s.score(&question(), &a.text).unwrap(),
        f16s.score(&question(), &a.text).unwrap(),
    );
    let scored = max_abs_diff(&sa.logprobs, &sb.logprobs);
    println!("f16 against f32 keys and values: max |Δlogprob| {generated:e} generating, {scored:e} scoring");
    // f16 keeps 11 significant bits: differences of about 1e-3 here, none at all would mean
    // the option changed nothing.
    for diff in [generated, scored] {
        assert!(diff > 0.0 && diff < 0.02, "{diff}");
    }
    let bytes = |b: &Candle| {
        let engine = b.engine().unwrap();
        let ids = engine.front.prompt_ids(&question(), 0).unwrap();
        let mut kv = engine.model.new_state();
        engine
            .model
            .forward(&ids, &mut kv, Logits::Last, false)
            .unwrap();
        kv.bytes()
    };
    assert_eq!(2 * bytes(&f16s), bytes(&f32s));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let b = f32_model();
    let config = |seed| GenerationConfig {
        max_new_tokens: 10,
        temperature: 0.9,
        top_k: 40,
        top_p: 0.9,
        seed,
        ..GenerationConfig::default()
    };
    let a = b.generate(&question(), &config(42)).unwrap();
    let again = b.generate(&question(), &config(42)).unwrap();
    assert_eq!(a.token_ids, again.token_ids);
    assert_eq!(a.text, again.text);
}

#[test]
fn four_threads_generate_at_once() {
    let b = f32_model();
    let expected = b.generate(&question(), &greedy(6)).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || b.generate(&question(), &greedy(6)).unwrap())
        })
        .collect();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.token_ids, expected.token_ids);
    }
}

fn prompt_ids(b: &Candle) -> Vec<u32> {
    b.engine()
        .unwrap()
        .front
        .prompt_ids(&question(), 0)
        .unwrap()
}

#[test]
fn logits_match_candle_transformers_quantized_llama() {
    let b = stored_model();
    let ids = prompt_ids(&b);
    let ours = b.engine().unwrap().logits_all(&ids).unwrap();
    let ours_last = ours.last().unwrap();
    let mut file = std::fs::File::open(requantized_path()).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut reference = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut file,
        &Device::Cpu,
    )
    .unwrap();
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let theirs = reference
        .forward(&input, 0)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let diff = max_abs_diff(ours_last, &theirs);
    println!("as_stored vs quantized_llama: max |Δlogit| = {diff:e}");
    assert!(diff <= 1e-4, "{diff}");
    let f32_last = f32_model()
        .engine()
        .unwrap()
        .logits_all(&ids)
        .unwrap()
        .pop()
        .unwrap();
    for weights in ["q8_0", "q4_0"] {
        let engine = open(json!({ "weights": weights })).engine().unwrap();
        let last = engine.logits_all(&ids).unwrap().pop().unwrap();
        let diff = max_abs_diff(&f32_last, &last);
        println!("f32 vs {weights} (requantized at load): max |Δlogit| = {diff:e}");
        assert!(
            diff.is_finite() && diff > 0.0,
            "{weights} should differ from f32"
        );
    }
}

/// llama.cpp permutes q/k rows for interleaved RoPE; undo it for a halves-RoPE model.
fn unpermute(w: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = w.dims2().unwrap();
    let d = rows / heads;
    w.reshape((heads, d / 2, 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

#[test]
fn logits_match_an_independent_f32_llama() {
    use candle_transformers::models::llama as reference;
    let mut file = std::fs::File::open(model_path()).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut tensors = std::collections::HashMap::new();
    let names: Vec<String> = content.tensor_infos.keys().cloned().collect();
    for name in names {
        let t = content
            .tensor(&mut file, &name, &Device::Cpu)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap();
        let t = if name.ends_with("attn_q.weight") {
            unpermute(&t, 9)
        } else if name.ends_with("attn_k.weight") {
            unpermute(&t, 3)
        } else {
            t
        };
        tensors.insert(hf_name(&name), t);
    }
    let config: reference::LlamaConfig = serde_json::from_value(json!({
        "hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": true
    }))
    .unwrap();
    let config = config.into_config(false);
    let vb = candle_nn::VarBuilder::from_tensors(tensors, candle_core::DType::F32, &Device::Cpu);
    let model = reference::Llama::load(vb, &config).unwrap();
    let mut cache =
        reference::Cache::new(false, candle_core::DType::F32, &config, &Device::Cpu).unwrap();
    let b = f32_model();
    let ids = prompt_ids(&b);
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let theirs = model
        .forward(&input, 0, &mut cache)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let ours = b.engine().unwrap().logits_all(&ids).unwrap().pop().unwrap();
    let diff = max_abs_diff(&ours, &theirs);
    println!(
        "f32 vs candle-transformers llama (dequantized, un-permuted): max |Δlogit| = {diff:e}"
    );
    // Both f32 over the same dequantized weights, the same ops in another grouping: 7.9e-5
    // measured. Another CPU changes only candle's GEMM summation order (1e-6 on these logits).
    assert!(diff <= 1e-3, "{diff}");
}

fn hf_name(gguf: &str) -> String {
    let renames = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
        ("attn_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
        ("blk.", "model.layers."),
    ];
    renames
        .iter()
        .fold(gguf.to_string(), |n, (from, to)| n.replace(from, to))
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

/// `embed` reads the text itself (mean-pooled final hidden states): the same text gives the same
/// vector, different texts different ones, and a paraphrase lies closer than an unrelated one.
#[test]
fn embeddings_come_from_the_input_and_a_paraphrase_is_closer() {
    let texts = [
        "The cat sat on the mat.",
        "A cat was sitting on the rug.",
        "Quarterly tax filings are due at the end of April.",
        "The cat sat on the mat.",
    ]
    .map(String::from);
    let e = f32_model().embed(&texts).unwrap();
    assert_eq!(e.len(), 4);
    assert_eq!(e[0].embedding, e[3].embedding);
    assert_eq!(e[0].embedding.len(), 576, "SmolLM2's hidden size");
    assert!(e[0].prompt_tokens >= 7, "{}", e[0].prompt_tokens);
    let (paraphrase, unrelated) = (
        cosine(&e[0].embedding, &e[1].embedding),
        cosine(&e[0].embedding, &e[2].embedding),
    );
    println!("cosine: paraphrase {paraphrase}, unrelated {unrelated}");
    assert!(paraphrase < 0.9999, "different texts, different vectors");
    assert!(paraphrase > unrelated, "{paraphrase} vs {unrelated}");
}

/// Concurrent generations share decode passes (continuous batching) and each gets the reply it
/// gets alone, with the prefix cache on (its lock is taken outside the compute pool: inside,
/// a pool thread waiting in a parallel op could run another call that blocks on it for good).
#[test]
fn concurrent_generations_share_decode_passes_and_match_one_at_a_time() {
    let b = cached(json!({}));
    let prompts = [
        "What is the capital of France?",
        "Name three colours.",
        "What is 2 + 2?",
        "Say hello in Spanish.",
    ];
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let r = b.generate(&ConversationSnapshot::from_prompt(*p), &greedy(10));
            r.unwrap().token_ids.to_vec()
        })
        .collect();
    let (passes_before, steps_before) = b.decode_passes();
    assert_eq!(
        passes_before, steps_before,
        "one at a time, one step per pass"
    );
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                let b = &b;
                s.spawn(move || {
                    let r = b.generate(&ConversationSnapshot::from_prompt(*p), &greedy(10));
                    r.unwrap().token_ids.to_vec()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    let (passes, steps) = b.decode_passes();
    let (passes, steps) = (passes - passes_before, steps - steps_before);
    println!("{steps} decode steps in {passes} passes");
    assert!(
        passes < steps,
        "{steps} steps in {passes} passes: none shared"
    );
}

/// `generate_batch` (what explain's generation-based values call) decodes the batch's replies
/// together in packed passes, more prompts than one pass carries included, and each reply is
/// the one its prompt gets alone.
#[test]
fn generate_batch_decodes_together_and_matches_one_at_a_time() {
    let b = cached(json!({}));
    let facts = [
        "The museum opens at 10 am.",
        "It is closed on Mondays.",
        "Tickets cost 5 euros.",
        "The cafe serves tea.",
    ];
    // Coalitions of the facts, as explain sends them: prompts sharing prefixes.
    let prompts: Vec<ConversationSnapshot> = (0..9u32)
        .map(|mask| {
            let kept: Vec<&str> = (0..facts.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| facts[i])
                .collect();
            let text = format!("{} When does the museum open?", kept.join(" "));
            ConversationSnapshot::from_prompt(text.trim_start())
        })
        .collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| b.generate(p, &greedy(8)).unwrap().token_ids.to_vec())
        .collect();
    let (passes_before, steps_before) = b.decode_passes();
    let started = std::time::Instant::now();
    let batch = b.generate_batch(&prompts, &greedy(8)).unwrap();
    println!("batch in {:?}", started.elapsed());
    let together: Vec<Vec<u32>> = batch.iter().map(|r| r.token_ids.to_vec()).collect();
    assert_eq!(together, alone);
    let (passes, steps) = b.decode_passes();
    let (passes, steps) = (passes - passes_before, steps - steps_before);
    println!("{steps} decode steps in {passes} passes");
    assert!(
        2 * passes < steps,
        "{steps} steps in {passes} passes: fewer than two rows a pass"
    );
}

/// Three context sentences in one user message, then a question about the first in another;
/// the spans of the sentences.
fn hiding_case() -> (ConversationSnapshot, Hideable) {
    let sentences = [
        "The capital of Freedonia is Sylvania.",
        "The sky is blue.",
        "Dogs bark at night.",
    ];
    let context = sentences.join(" ");
    let spans: Vec<TextSpan> = sentences
        .iter()
        .map(|s| {
            let start = context.find(s).unwrap() as u32;
            TextSpan {
                message: 0,
                start,
                end: start + s.len() as u32,
            }
        })
        .collect();
    let messages = vec![
        Message::text(Role::User, context),
        Message::text(Role::User, "What is the capital of Freedonia?"),
    ];
    let turns = vec![Turn {
        messages: messages.into(),
    }];
    let parts = Hideable {
        spans: spans.into(),
        ..Hideable::default()
    };
    (ConversationSnapshot::new(turns).unwrap(), parts)
}

/// A span becomes the tokens that spell it, and the rows computed again begin with the text of
/// the message they start from.
#[test]
fn hidden_spans_become_the_tokens_that_spell_them() {
    let (snapshot, parts) = hiding_case();
    let engine = f32_model().engine().unwrap();
    let hidden = [vec![1], vec![0, 2], vec![]];
    let hiding = |from_message| Hiding {
        parts: &parts,
        hidden: &hidden,
        from_message,
    };
    let plan = engine
        .front
        .hidden_scoring(&snapshot, "Sylvania", &hiding(1))
        .unwrap();
    let text = |ids: &[u32]| engine.front.decode(ids, false).unwrap();
    let spelled = |ranges: &[std::ops::Range<usize>]| -> Vec<String> {
        ranges
            .iter()
            .map(|r| text(&plan.prompt[r.clone()]).trim().to_string())
            .collect()
    };
    assert_eq!(spelled(&plan.hidden[0]), ["The sky is blue."]);
    assert_eq!(
        spelled(&plan.hidden[1]),
        [
            "The capital of Freedonia is Sylvania.",
            "Dogs bark at night."
        ]
    );
    assert!(plan.hidden[2].is_empty());
    assert!(text(&plan.prompt[..plan.from]).contains("Dogs bark at night."));
    assert!(text(&plan.prompt[plan.from..]).starts_with("What is the capital"));
    assert_eq!(plan.prompt, engine.front.prompt_ids(&snapshot, 0).unwrap());
    let whole = engine
        .front
        .hidden_scoring(&snapshot, "Sylvania", &hiding(0))
        .unwrap();
    assert!(text(&whole.prompt[whole.from..]).starts_with("The capital of Freedonia"));
    assert_eq!(whole.hidden, plan.hidden);
}

/// `sdpa`, counting the sequences each `forward_shared` call gets.
struct Counted;

/// The most sequences one `forward_shared` call got.
static SHARED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl lmhost_candle::attention::Attention for Counted {
    fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        p: &lmhost_candle::attention::AttnParams<'_>,
    ) -> candle_core::Result<Tensor> {
        lmhost_candle::attention::Sdpa.forward(q, k, v, p)
    }

    fn forward_shared(
        &self,
        prefix: (&Tensor, &Tensor),
        items: &[lmhost_candle::attention::Shared<'_>],
    ) -> candle_core::Result<Vec<Tensor>> {
        SHARED.fetch_max(items.len(), std::sync::atomic::Ordering::SeqCst);
        lmhost_candle::attention::Sdpa.forward_shared(prefix, items)
    }
}

/// `score_hidden`: hiding nothing is `score`; the cache on or off and one entry or a batch give
/// the same logprobs, bit for bit (so hidden keys apply to the rows from the last message on
/// only); only those rows are computed once the prompt is cached, the entries of a batch
/// attending to the cached prompt together, where the cache holds it; and hiding the sentence
/// that holds the answer costs the answer far more than hiding an unrelated one.
#[test]
fn score_hidden_hides_spans_from_the_last_message_on_and_reuses_the_rest() {
    let (snapshot, parts) = hiding_case();
    lmhost_candle::attention::register("sdpa_counted", Arc::new(Counted));
    let (off, on) = (
        open(json!({"weights": "f32"})),
        cached(json!({"weights": "f32", "attn_implementation": "sdpa_counted"})),
    );
    let reply = "The capital of Freedonia is Sylvania.";
    let hidden = [vec![], vec![0], vec![1], vec![0, 1, 2]];
    let plain = off.score(&snapshot, reply).unwrap();
    let cold = off
        .score_hidden(&snapshot, reply, &parts, &hidden, 1)
        .unwrap();
    let warm = on
        .score_hidden(&snapshot, reply, &parts, &hidden, 1)
        .unwrap();
    let alone = on
        .score_hidden(&snapshot, reply, &parts, &hidden[1..2], 1)
        .unwrap();
    assert_eq!(cold.len(), 4);
    assert!(max_abs_diff(&cold[0].logprobs, &plain.logprobs) <= 1e-5);
    // Bit for bit on any x86 CPU of this kind: `sdpa` computes each row alone, and the f32
    // GEMM (gemm's AVX2 kernels, which it takes with or without AVX-512) sums a row alike in
    // every pass of `MIN_ROWS` rows or more.
    for (c, w) in cold.iter().zip(&warm) {
        assert_eq!(c.token_ids, w.token_ids);
        assert_eq!(c.logprobs, w.logprobs);
    }
    assert_eq!(alone[0].logprobs, warm[1].logprobs);
    assert_eq!(SHARED.load(std::sync::atomic::Ordering::SeqCst), 4);
    let computed = |r: &lmhost_plugin_api::ScoreRecord| r.prompt_tokens - r.cached_prompt_tokens;
    assert_eq!(computed(&cold[1]), cold[1].prompt_tokens, "cache off");
    assert!(
        computed(&alone[0]) <= 20,
        "{} of {} prompt tokens computed",
        computed(&alone[0]),
        alone[0].prompt_tokens
    );
    let total: Vec<f64> = warm.iter().map(|r| r.total_logprob()).collect();
    println!(
        "answer logprob: all {:.3}, hide the fact {:.3}, hide the sky {:.3}, hide all {:.3}",
        total[0], total[1], total[2], total[3]
    );
    let (fact, sky) = (total[0] - total[1], total[0] - total[2]);
    assert!(
        fact > 1.0 && fact > 4.0 * sky.abs(),
        "fact {fact}, sky {sky}"
    );
}

/// Under `weights = "bf16"` the coalitions of `score_hidden` attend to the cached context in
/// bf16 products (`sdpa_bf16`): their logprobs move from the cache-off pass's (the whole
/// prompt's rows in f32 attention) by that rounding (0.04 measured; under `sdpa` they would not
/// move at all, as bf16 linear layers compute each row alike in any pass), within the 0.1 that
/// `bf16` is held to; the answer's dependence on the fact survives. The instruction rounds and
/// sums alike on every CPU that has it, so the gap does too.
#[test]
fn under_bf16_weights_a_cached_context_is_attended_in_bf16_products() {
    if !lmhost_candle::kernels::bf16::available() {
        // Refused without AVX-512 BF16: `tensor_types.rs` checks the error.
        return;
    }
    let (snapshot, parts) = hiding_case();
    let (off, on) = (
        open(json!({"weights": "bf16"})),
        cached(json!({"weights": "bf16"})),
    );
    let reply = "The capital of Freedonia is Sylvania.";
    let hidden = [vec![], vec![0], vec![1]];
    let cold = off
        .score_hidden(&snapshot, reply, &parts, &hidden, 1)
        .unwrap();
    let warm = on
        .score_hidden(&snapshot, reply, &parts, &hidden, 1)
        .unwrap();
    let gap = cold
        .iter()
        .zip(&warm)
        .map(|(c, w)| max_abs_diff(&c.logprobs, &w.logprobs))
        .fold(0f32, f32::max);
    println!("cached context in bf16 attention: logprobs within {gap:.4} of the whole pass's");
    assert!(gap > 0.0 && gap < 0.1, "{gap}");
    let total: Vec<f64> = warm.iter().map(|r| r.total_logprob()).collect();
    assert!(total[0] - total[1] > 1.0, "{total:?}");
}
