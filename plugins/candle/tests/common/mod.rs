//! Tiny random-weight models the tests write themselves: a GGUF file (quantized, byte-level
//! tokenizer in metadata) and a Hugging Face checkpoint directory (safetensors + tokenizer.json).
#![allow(dead_code)]

pub mod vlm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use lmhost_candle::models::{CausalLm, Logits, Seq};
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::{json, Value as Json};
use lmhost_plugin_api::{Backend, PluginContext};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

pub const HIDDEN: usize = 32;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const FFN: usize = 64;
pub const LAYERS: usize = 2;
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The 256 byte-level symbols, then the special tokens.
pub fn vocab_tokens() -> Vec<String> {
    let mut chars: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    chars.sort();
    let mut tokens: Vec<String> = chars.into_iter().map(String::from).collect();
    tokens.extend(SPECIALS.iter().map(|s| s.to_string()));
    // The one merge of the GGUF tokenizer ("a b") needs its result in the vocabulary.
    tokens.push("ab".to_string());
    tokens
}

pub fn vocab_size() -> usize {
    vocab_tokens().len()
}

/// Deterministic pseudo-random weights in [-scale, scale].
pub fn weights(shape: &[usize], seed: u64, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| {
            let x = ((i as u64)
                .wrapping_mul(2654435761)
                .wrapping_add(seed * 97_531))
                % 10_007;
            (x as f32 / 10_007.0 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
}

/// Every tensor of the tiny model by Hugging Face name.
pub fn hf_tensors() -> Vec<(String, Tensor)> {
    family_tensors("llama", LAYERS)
}

/// The tiny `arch` model's head size: Qwen3's and Gemma 3's are their own setting, wider than
/// hidden / heads here as in the real models, so that a loader taking hidden / heads fails.
pub fn head_dim(arch: &str) -> usize {
    match arch {
        "qwen3" | "gemma3" => 2 * HIDDEN / HEADS,
        _ => HIDDEN / HEADS,
    }
}

/// Every tensor of a tiny `arch` model by Hugging Face name: Llama's, plus q/k/v biases (qwen2),
/// per-head q/k norms (qwen3; gemma3 with norms before and after the MLP too), or fused
/// `qkv_proj` and `gate_up_proj` and an untied `lm_head` (phi3).
pub fn family_tensors(arch: &str, layers: usize) -> Vec<(String, Tensor)> {
    let d = head_dim(arch);
    let mut t = vec![
        (
            "model.embed_tokens.weight".to_string(),
            weights(&[vocab_size(), HIDDEN], 1, 0.5),
        ),
        (
            "model.norm.weight".to_string(),
            weights(&[HIDDEN], 2, 0.2).affine(1.0, 1.0).unwrap(),
        ),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let s = 10 * (l as u64 + 1);
        let mut add = |name: &str, shape: &[usize], seed: u64, scale: f32| {
            t.push((format!("{p}.{name}"), weights(shape, s + seed, scale)));
        };
        let (q, kv) = (HEADS * d, KV_HEADS * d);
        if arch == "phi3" {
            add("self_attn.qkv_proj.weight", &[q + 2 * kv, HIDDEN], 1, 0.3);
        } else {
            add("self_attn.q_proj.weight", &[q, HIDDEN], 1, 0.3);
            add("self_attn.k_proj.weight", &[kv, HIDDEN], 2, 0.3);
            add("self_attn.v_proj.weight", &[kv, HIDDEN], 3, 0.3);
        }
        add("self_attn.o_proj.weight", &[HIDDEN, q], 4, 0.3);
        if arch == "phi3" {
            add("mlp.gate_up_proj.weight", &[2 * FFN, HIDDEN], 5, 0.3);
        } else {
            add("mlp.gate_proj.weight", &[FFN, HIDDEN], 5, 0.3);
            add("mlp.up_proj.weight", &[FFN, HIDDEN], 6, 0.3);
        }
        add("mlp.down_proj.weight", &[HIDDEN, FFN], 7, 0.3);
        add("input_layernorm.weight", &[HIDDEN], 8, 0.1);
        add("post_attention_layernorm.weight", &[HIDDEN], 9, 0.1);
        if arch == "qwen2" {
            add("self_attn.q_proj.bias", &[q], 11, 0.5);
            add("self_attn.k_proj.bias", &[kv], 12, 0.5);
            add("self_attn.v_proj.bias", &[kv], 13, 0.5);
        }
        if arch == "gemma3" {
            add("pre_feedforward_layernorm.weight", &[HIDDEN], 16, 0.1);
            add("post_feedforward_layernorm.weight", &[HIDDEN], 17, 0.1);
        }
        if matches!(arch, "qwen3" | "gemma3") {
            for (name, seed) in [
                ("self_attn.q_norm.weight", 14),
                ("self_attn.k_norm.weight", 15),
            ] {
                let w = weights(&[d], s + seed, 0.3).affine(1.0, 1.0).unwrap();
                t.push((format!("{p}.{name}"), w));
            }
        }
    }
    if arch == "phi3" {
        t.push((
            "lm_head.weight".to_string(),
            weights(&[vocab_size(), HIDDEN], 3, 0.5),
        ));
    }
    t
}

/// config.json of the tiny `arch` model (`hf_config` with the family's fields).
pub fn family_config(arch: &str, layers: usize) -> Json {
    let mut c = hf_config();
    c["model_type"] = json!(arch);
    c["num_hidden_layers"] = json!(layers);
    c["head_dim"] = json!(head_dim(arch));
    c["tie_word_embeddings"] = json!(arch != "phi3");
    c
}

/// GGUF metadata of the tiny `arch` model: `gguf_metadata` with `layers` blocks and the head size
/// as llama.cpp reads it (`attention.key_length` / `value_length`); for phi3 the sliding window
/// 0 that llama.cpp's converter writes for "none".
pub fn family_metadata(arch: &str, layers: usize) -> Vec<(String, Value)> {
    let mut m = gguf_metadata(arch);
    for (key, value) in m.iter_mut() {
        if *key == format!("{arch}.block_count") {
            *value = Value::U32(layers as u32);
        }
    }
    for key in ["attention.key_length", "attention.value_length"] {
        m.push((format!("{arch}.{key}"), Value::U32(head_dim(arch) as u32)));
    }
    if arch == "phi3" {
        m.push(("phi3.attention.sliding_window".into(), Value::U32(0)));
    }
    m
}

/// llama.cpp's converter's q/k row permutation for Llama-style GGUF files (`LlamaModel.permute`):
/// each head's two halves interleaved, so that RoPE on adjacent pairs equals Transformers' RoPE on
/// halves.
pub fn permute_qk(t: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = t.dims2().unwrap();
    t.reshape((heads, 2, rows / heads / 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

/// `tensors` (Hugging Face names) as a GGUF of `arch` holds them: GGUF names (Gemma's
/// `post_attention_layernorm` follows attention, Llama's precedes the MLP), q/k rows permuted
/// for Llama-style archs, matrices in `matrices`, vectors in F32.
pub fn gguf_tensors(
    arch: &str,
    tensors: &[(String, Tensor)],
    matrices: GgmlDType,
) -> Vec<(String, QTensor)> {
    let permuted = matches!(arch, "llama" | "mistral" | "smollm");
    tensors
        .iter()
        .map(|(name, t)| {
            let t = match () {
                _ if permuted && name.ends_with("q_proj.weight") => permute_qk(t, HEADS),
                _ if permuted && name.ends_with("k_proj.weight") => permute_qk(t, KV_HEADS),
                _ => t.clone(),
            };
            let dtype = if t.rank() == 1 {
                GgmlDType::F32
            } else {
                matrices
            };
            let name = match arch {
                "gemma3" => name.replace("post_attention_layernorm", "post_attention_norm"),
                _ => name.clone(),
            };
            (
                gguf_tensor_name(&name),
                QTensor::quantize(&t, dtype).unwrap(),
            )
        })
        .collect()
}

/// Writes a one-file checkpoint directory: `config`, the tokenizer files and `tensors`.
pub fn write_checkpoint(dir: &Path, config: &Json, tensors: &[(String, Tensor)]) -> PathBuf {
    write_tokenizer_files(dir, config);
    let map: HashMap<String, Tensor> = tensors.iter().cloned().collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    dir.to_path_buf()
}

/// config.json, tokenizer.json and tokenizer_config.json (ChatML template) in `dir`.
fn write_tokenizer_files(dir: &Path, config: &Json) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    tokenizer().save(dir.join("tokenizer.json"), false).unwrap();
    let tok_config = json!({"chat_template": CHATML, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
}

pub fn tokenizer() -> Tokenizer {
    let vocab: Vocab = vocab_tokens()
        .into_iter()
        .take(256)
        .enumerate()
        .map(|(i, t)| (t, i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .unwrap();
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = SPECIALS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    tok.add_special_tokens(specials).unwrap();
    tok
}

pub fn hf_config() -> Json {
    json!({
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": vocab_size(),
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "tie_word_embeddings": true,
        "eos_token_id": 258,
    })
}

/// Writes a checkpoint directory in `dtype`; `shards` > 1 splits it with an index.
pub fn write_safetensors(dir: &Path, dtype: DType, shards: usize) -> PathBuf {
    write_tokenizer_files(dir, &hf_config());
    let tensors: Vec<(String, Tensor)> = hf_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.to_dtype(dtype).unwrap()))
        .collect();
    if shards <= 1 {
        let map: HashMap<String, Tensor> = tensors.into_iter().collect();
        candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
    } else {
        let mut weight_map = serde_json::Map::new();
        for (i, chunk) in tensors.chunks(tensors.len().div_ceil(shards)).enumerate() {
            let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
            let map: HashMap<String, Tensor> = chunk.iter().cloned().collect();
            for name in map.keys() {
                weight_map.insert(name.clone(), json!(file));
            }
            candle_core::safetensors::save(&map, dir.join(&file)).unwrap();
        }
        let index = json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    dir.to_path_buf()
}

pub fn gguf_tensor_name(hf: &str) -> String {
    let renames = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("lm_head.weight", "output.weight"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.qkv_proj", "attn_qkv"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("mlp.gate_up_proj", "ffn_up"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("post_attention_layernorm", "ffn_norm"),
        ("pre_feedforward_layernorm", "ffn_norm"),
        ("post_feedforward_layernorm", "post_ffw_norm"),
        ("input_layernorm", "attn_norm"),
        ("model.layers.", "blk."),
    ];
    renames
        .iter()
        .fold(hf.to_string(), |name, (from, to)| name.replace(from, to))
}

/// Writes a GGUF file with Q8_0 matrices (F32 norms) and gpt2 tokenizer metadata;
/// `arch` is written as `general.architecture`.
pub fn write_gguf(path: &Path, arch: &str) -> PathBuf {
    write_gguf_with(path, arch, |_| {})
}

/// [`write_gguf`] with its metadata changed by `edit` first (to write a broken or different
/// tokenizer or template).
pub fn write_gguf_with(
    path: &Path,
    arch: &str,
    edit: impl FnOnce(&mut Vec<(String, Value)>),
) -> PathBuf {
    let mut metadata = gguf_metadata(arch);
    edit(&mut metadata);
    let qtensors = gguf_tensors(arch, &hf_tensors(), GgmlDType::Q8_0);
    write_gguf_file(path, &metadata, &qtensors)
}

/// The tiny model's GGUF metadata: sizes and the gpt2 tokenizer, `arch` as
/// `general.architecture`.
pub fn gguf_metadata(arch: &str) -> Vec<(String, Value)> {
    let tokens = vocab_tokens();
    let types: Vec<Value> = (0..tokens.len())
        .map(|i| Value::I32(if (256..259).contains(&i) { 3 } else { 1 }))
        .collect();
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    vec![
        ("general.architecture".into(), s(arch)),
        (format!("{arch}.block_count"), u(LAYERS)),
        (format!("{arch}.embedding_length"), u(HIDDEN)),
        (format!("{arch}.feed_forward_length"), u(FFN)),
        (format!("{arch}.attention.head_count"), u(HEADS)),
        (format!("{arch}.attention.head_count_kv"), u(KV_HEADS)),
        (format!("{arch}.rope.freq_base"), Value::F32(10000.0)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
        (format!("{arch}.context_length"), u(256)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| s(t)).collect()),
        ),
        ("tokenizer.ggml.merges".into(), Value::Array(vec![s("a b")])),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.eos_token_id".into(), u(258)),
        ("tokenizer.ggml.bos_token_id".into(), u(256)),
        ("tokenizer.chat_template".into(), s(CHATML)),
    ]
}

/// Writes `metadata` and `qtensors` (by GGUF name) as a GGUF file.
pub fn write_gguf_file(
    path: &Path,
    metadata: &[(String, Value)],
    qtensors: &[(String, QTensor)],
) -> PathBuf {
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> =
        qtensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
    path.to_path_buf()
}

/// A backend on `model` with `options`.
pub fn backend(model: &Path, options: Json) -> Candle {
    let context = PluginContext::new("candle", &model.to_string_lossy()).with_options(options);
    Candle::new(context).unwrap()
}

/// A packed pass gives each sequence the logits it gets alone (within 1e-5): a sequence resuming
/// a cached state, one that takes its prefix from an earlier sequence of the pass, and one from
/// scratch; a share must point back, at positions that sequence holds, into an empty state; any
/// sequence past the context is refused.
pub fn check_packed_pass(model: &dyn CausalLm) {
    let a: Vec<u32> = (3..40).collect();
    let mut b_ids = a[..20].to_vec();
    b_ids.extend(60..75);
    let c: Vec<u32> = (80..92).collect();
    let alone = |ids: &[u32]| {
        let mut kv = model.new_state();
        let out = model.forward(ids, &mut kv, Logits::All, false).unwrap();
        out.logits.unwrap().to_vec2::<f32>().unwrap()
    };
    let (ref_a, ref_b, ref_c) = (alone(&a), alone(&b_ids), alone(&c));

    // `a` resumes from a state holding its first 9 positions; `b` shares 20 with `a`.
    let mut kv_a = model.new_state();
    model
        .forward(&a[..9], &mut kv_a, Logits::None, false)
        .unwrap();
    let (mut kv_b, mut kv_c) = (model.new_state(), model.new_state());
    let mut seqs = [
        Seq {
            ids: &a[9..],
            kv: &mut kv_a,
            share: None,
            logits_from: 0,
            hidden: None,
            sampled: false,
        },
        Seq {
            ids: &b_ids[20..],
            kv: &mut kv_b,
            share: Some((0, 20)),
            logits_from: 0,
            hidden: None,
            sampled: false,
        },
        Seq {
            ids: &c,
            kv: &mut kv_c,
            share: None,
            logits_from: 4,
            hidden: None,
            sampled: false,
        },
    ];
    let (logits, _) = model.forward_packed(&mut seqs, false).unwrap();
    let rows = |i: usize| logits[i].as_ref().unwrap().to_vec2::<f32>().unwrap();
    assert!(max_diff(&rows(0), &ref_a[9..]) <= 1e-5);
    assert!(max_diff(&rows(1), &ref_b[20..]) <= 1e-5);
    assert!(max_diff(&rows(2), &ref_c[4..]) <= 1e-5);
    assert_eq!(
        (kv_a.len(), kv_b.len(), kv_c.len()),
        (a.len(), b_ids.len(), c.len())
    );

    // A share must point back, at positions that sequence holds, into an empty state.
    let mut kv_d = model.new_state();
    let err = model
        .forward_packed(
            &mut [Seq {
                ids: &c,
                kv: &mut kv_d,
                share: Some((0, 3)),
                logits_from: 0,
                hidden: None,
                sampled: false,
            }],
            false,
        )
        .unwrap_err();
    assert!(err.to_string().contains("cannot take 3 positions"), "{err}");

    // Any sequence past the context is refused, not only the last one.
    let too_long: Vec<u32> = (0..=model.max_context() as u32)
        .map(|i| 3 + i % 50)
        .collect();
    let (mut kv_e, mut kv_f) = (model.new_state(), model.new_state());
    let mut seqs = [
        Seq {
            ids: &too_long,
            kv: &mut kv_e,
            share: None,
            logits_from: too_long.len(),
            hidden: None,
            sampled: false,
        },
        Seq {
            ids: &c,
            kv: &mut kv_f,
            share: None,
            logits_from: 0,
            hidden: None,
            sampled: false,
        },
    ];
    let err = model.forward_packed(&mut seqs, false).unwrap_err();
    assert!(
        err.to_string().contains("past the model's context"),
        "{err}"
    );
}

/// Largest |a - b| over rows of equal shape.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The greedy token of two computations of the same logits, compared where their arithmetic
/// cannot decide it: at each position whose reference top-two margin exceeds `margin`, a
/// bound the caller states from the differences the two computations make by design at the
/// top tokens (8-bit activations against f32, f16 against f32). Below it the winner is a near
/// tie that rounding decides, differently on other CPUs; above it a flip means the logits near
/// the top moved by more than the design explains.
pub struct Greedy {
    pub positions: usize,
    /// Positions whose reference margin exceeds the bound.
    pub decisive: usize,
    /// Decisive positions where both pick the same token.
    pub agree: usize,
}

impl Greedy {
    pub fn of(ours: &[Vec<f32>], theirs: &[Vec<f32>], margin: f32) -> Greedy {
        assert_eq!(ours.len(), theirs.len());
        let (mut decisive, mut agree) = (0, 0);
        for (a, b) in ours.iter().zip(theirs) {
            let (best, gap) = top_two(b);
            if gap > margin {
                decisive += 1;
                agree += usize::from(top_two(a).0 == best);
            }
        }
        Greedy {
            positions: ours.len(),
            decisive,
            agree,
        }
    }

    /// Every decisive position agrees, and there is one to compare.
    pub fn check(&self, what: &str) {
        eprintln!(
            "{what}: greedy token agrees at {} of the {} of {} positions decided by more than \
             the bound",
            self.agree, self.decisive, self.positions
        );
        assert!(self.decisive > 0, "{what}: no position to compare");
        assert_eq!(self.agree, self.decisive, "{what}: greedy tokens differ");
    }
}

/// The best index of `row` and its margin over the second best.
fn top_two(row: &[f32]) -> (usize, f32) {
    let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
    let second = (0..row.len())
        .filter(|&i| i != best)
        .map(|i| row[i])
        .fold(f32::NEG_INFINITY, f32::max);
    (best, row[best] - second)
}

/// What llama.cpp evaluates: token ids, or text it tokenizes itself (BOS as the model's metadata
/// says, special tokens parsed).
pub enum LlamaCppInput<'a> {
    Ids(&'a [u32]),
    Text(&'a str),
}

/// llama.cpp's token ids and the logits of every position on the GGUF at `model`, from
/// `scripts/llama-cpp-logits.py` run with `.venv`'s Python (`scripts/setup-llama-cpp`).
pub fn llama_cpp(model: &Path, input: LlamaCppInput<'_>) -> (Vec<u32>, Vec<Vec<f32>>) {
    llama_cpp_with(model, input, &[])
}

/// [`llama_cpp`] with more options for the script (`--f32-kv`: an f32 KV cache).
pub fn llama_cpp_with(
    model: &Path,
    input: LlamaCppInput<'_>,
    options: &[&str],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    let setup = "run scripts/setup-llama-cpp from the repository root (it installs \
                 llama-cpp-python into .venv)";
    assert!(python.is_file(), "{} is missing: {setup}", python.display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("logits.f32");
    let mut command = std::process::Command::new(&python);
    command
        .arg(root.join("scripts/llama-cpp-logits.py"))
        .arg(model)
        .arg(&out)
        .args(options);
    match input {
        LlamaCppInput::Ids(ids) => {
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            command.arg("--ids").arg(ids.join(","))
        }
        LlamaCppInput::Text(text) => command.arg("--text").arg(text),
    };
    let run = command
        .output()
        .unwrap_or_else(|e| panic!("{} cannot run ({e}): {setup}", python.display()));
    assert!(
        run.status.success(),
        "llama-cpp-logits.py failed ({}); if llama_cpp is missing, {setup}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let line = String::from_utf8_lossy(&run.stdout);
    let info: Json = serde_json::from_str(line.trim()).unwrap();
    let ids: Vec<u32> = serde_json::from_value(info["ids"].clone()).unwrap();
    let vocab = info["vocab"].as_u64().unwrap() as usize;
    let values: Vec<f32> = std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values.len(), ids.len() * vocab, "{line}");
    (ids, values.chunks(vocab).map(<[f32]>::to_vec).collect())
}
