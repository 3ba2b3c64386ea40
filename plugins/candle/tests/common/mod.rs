//! Tiny random-weight models the tests write themselves: a GGUF file (quantized, byte-level
//! tokenizer in metadata) and a Hugging Face checkpoint directory (safetensors + tokenizer.json).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
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
    let d = HIDDEN / HEADS;
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
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        let s = 10 * (l as u64 + 1);
        let mut add = |name: &str, shape: &[usize], seed: u64, scale: f32| {
            t.push((format!("{p}.{name}"), weights(shape, s + seed, scale)));
        };
        add("self_attn.q_proj.weight", &[HEADS * d, HIDDEN], 1, 0.3);
        add("self_attn.k_proj.weight", &[KV_HEADS * d, HIDDEN], 2, 0.3);
        add("self_attn.v_proj.weight", &[KV_HEADS * d, HIDDEN], 3, 0.3);
        add("self_attn.o_proj.weight", &[HIDDEN, HEADS * d], 4, 0.3);
        add("mlp.gate_proj.weight", &[FFN, HIDDEN], 5, 0.3);
        add("mlp.up_proj.weight", &[FFN, HIDDEN], 6, 0.3);
        add("mlp.down_proj.weight", &[HIDDEN, FFN], 7, 0.3);
        add("input_layernorm.weight", &[HIDDEN], 8, 0.1);
        add("post_attention_layernorm.weight", &[HIDDEN], 9, 0.1);
    }
    t
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
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), hf_config().to_string()).unwrap();
    tokenizer().save(dir.join("tokenizer.json"), false).unwrap();
    let tok_config = json!({"chat_template": CHATML, "eos_token": "<|im_end|>"});
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
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

fn gguf_tensor_name(hf: &str) -> String {
    let renames = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("post_attention_layernorm", "ffn_norm"),
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
    let tokens = vocab_tokens();
    let types: Vec<Value> = (0..tokens.len())
        .map(|i| Value::I32(if (256..259).contains(&i) { 3 } else { 1 }))
        .collect();
    let s = |v: &str| Value::String(v.to_string());
    let u = |v: usize| Value::U32(v as u32);
    let metadata: Vec<(String, Value)> = vec![
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
    ];
    let mut metadata = metadata;
    edit(&mut metadata);
    let qtensors: Vec<(String, QTensor)> = hf_tensors()
        .into_iter()
        .map(|(n, t)| {
            let dtype = if t.rank() == 1 {
                GgmlDType::F32
            } else {
                GgmlDType::Q8_0
            };
            (gguf_tensor_name(&n), QTensor::quantize(&t, dtype).unwrap())
        })
        .collect();
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
