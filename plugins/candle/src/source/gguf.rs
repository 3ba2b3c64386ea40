//! GGUF files: config, tokenizer, chat template and (quantized) tensors from one file.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::Device;

use lmhost_plugin_kit::gguf::Metadata;
use lmhost_plugin_kit::template::ChatTemplate;
use lmhost_plugin_kit::tokenizer::TextTokenizer;

use super::Loaded;
use crate::models::llama::{BuildOptions, Llama, LlamaConfig};
use crate::weights::{check_shape, Weight, WeightSource};

/// GGUF tensor names for the Hugging Face names the models ask for.
fn gguf_name(hf: &str) -> String {
    let hf = hf.strip_prefix("model.").unwrap_or(hf);
    match hf {
        "embed_tokens.weight" => return "token_embd.weight".into(),
        "norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let Some(rest) = hf.strip_prefix("layers.") else {
        return hf.to_string();
    };
    let (layer, rest) = rest.split_once('.').unwrap_or((rest, ""));
    let renamed = [
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
    ]
    .iter()
    .find_map(|(from, to)| {
        rest.strip_prefix(from)
            .map(|suffix| format!("{to}{suffix}"))
    })
    .unwrap_or_else(|| rest.to_string());
    format!("blk.{layer}.{renamed}")
}

struct GgufSource {
    content: Content,
    reader: BufReader<File>,
    device: Device,
}

impl WeightSource for GgufSource {
    fn get(&mut self, name: &str, shape: &[usize]) -> Result<Weight, String> {
        let gname = gguf_name(name);
        if !self.content.tensor_infos.contains_key(&gname) {
            return Err(format!("tensor `{gname}` ({name}) is missing"));
        }
        let q = self
            .content
            .tensor(&mut self.reader, &gname, &self.device)
            .map_err(|e| format!("tensor `{gname}` cannot be read: {e}"))?;
        check_shape(&gname, Weight::Quantized(q), shape)
    }

    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(&gguf_name(name))
    }
}

fn meta_usize(meta: &HashMap<String, Value>, key: &str) -> Result<usize, String> {
    let v = meta
        .get(key)
        .ok_or_else(|| format!("metadata `{key}` is missing"))?;
    v.to_u32()
        .map(|n| n as usize)
        .or_else(|_| v.to_u64().map(|n| n as usize))
        .map_err(|e| format!("metadata `{key}`: {e}"))
}

fn meta_f64(meta: &HashMap<String, Value>, key: &str) -> Option<f64> {
    meta.get(key).and_then(|v| v.to_f32().ok()).map(f64::from)
}

/// The Llama-family config from `{arch}.*` metadata.
fn config(
    meta: &HashMap<String, Value>,
    vocab: usize,
    has_output: bool,
) -> Result<LlamaConfig, String> {
    let arch = meta
        .get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .ok_or("metadata `general.architecture` is missing")?;
    if !crate::models::llama::ARCHITECTURES.contains(&arch.as_str()) {
        return Err(format!(
            "unknown architecture {arch:?}; supported: {}",
            crate::models::llama::ARCHITECTURES.join(", ")
        ));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let heads = meta_usize(meta, &key("attention.head_count"))?;
    let hidden = meta_usize(meta, &key("embedding_length"))?;
    Ok(LlamaConfig {
        hidden_size: hidden,
        intermediate_size: meta_usize(meta, &key("feed_forward_length"))?,
        num_hidden_layers: meta_usize(meta, &key("block_count"))?,
        num_attention_heads: heads,
        num_key_value_heads: meta_usize(meta, &key("attention.head_count_kv")).ok(),
        head_dim: meta_usize(meta, &key("rope.dimension_count")).ok(),
        vocab_size: vocab,
        rope_theta: meta_f64(meta, &key("rope.freq_base")).unwrap_or(10_000.0),
        rms_norm_eps: meta_f64(meta, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        max_position_embeddings: meta_usize(meta, &key("context_length")).unwrap_or(4096),
        tie_word_embeddings: !has_output,
        attention_bias: false,
        sliding_window: None,
        use_sliding_window: None,
        // llama.cpp permutes q/k rows for llama-style archs (interleaved RoPE); qwen2 keeps halves.
        rope_interleaved: arch != "qwen2",
        model_type: arch,
    })
}

/// Loads a GGUF file; every error names what was wrong (the caller adds the path).
pub fn load(path: &Path, build: BuildOptions) -> Result<Loaded, String> {
    let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let mut reader = BufReader::new(file);
    let content =
        Content::read(&mut reader).map_err(|e| format!("not a readable GGUF file: {e}"))?;
    let meta = &content.metadata;
    let text_meta = Metadata::read(path).map_err(|e| e.to_string())?;
    let tokenizer = TextTokenizer::from_gguf(&text_meta).map_err(|e| e.to_string())?;
    let vocab = tokenizer.vocab_size();
    let has_output = content.tensor_infos.contains_key("output.weight");
    let cfg = config(meta, vocab, has_output)?;
    let chat_template = chat_template(&text_meta, &tokenizer)?;
    let mut source = GgufSource {
        content,
        reader,
        device: build.device.clone(),
    };
    let model = Llama::load(cfg, &mut source, build)?;
    Ok(Loaded {
        model: Box::new(model),
        chat_template,
        eos_ids: tokenizer.eog_ids().to_vec(),
        tokenizer,
    })
}

/// `tokenizer.chat_template`, compiled, with the BOS and EOS strings it may print.
fn chat_template(
    meta: &Metadata,
    tokenizer: &TextTokenizer,
) -> Result<Option<ChatTemplate>, String> {
    const KEY: &str = "tokenizer.chat_template";
    let Some(source) = meta.str(KEY) else {
        return Ok(None);
    };
    let text = |id: Option<u32>| id.and_then(|i| tokenizer.token(i)).map(str::to_string);
    ChatTemplate::new(source, format!("GGUF metadata `{KEY}`"))
        .map(|t| Some(t.with_special_tokens(text(tokenizer.bos_id()), text(tokenizer.eos_id()))))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::gguf_name;

    #[test]
    fn maps_hugging_face_names_to_gguf() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.q_proj.weight"),
            "blk.3.attn_q.weight"
        );
        assert_eq!(
            gguf_name("model.layers.0.self_attn.k_proj.bias"),
            "blk.0.attn_k.bias"
        );
        assert_eq!(
            gguf_name("model.layers.12.post_attention_layernorm.weight"),
            "blk.12.ffn_norm.weight"
        );
        assert_eq!(gguf_name("model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(gguf_name("lm_head.weight"), "output.weight");
    }
}
