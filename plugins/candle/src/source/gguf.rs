//! GGUF files: config, tokenizer, chat template and (quantized) tensors from one file.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::Device;

use lmhost_plugin_kit::gguf::{GgufError, Metadata};
use lmhost_plugin_kit::text::ModelText;
use lmhost_plugin_kit::tokenizer::TOKENS;

use super::LoadedLm;
use crate::memory::WeightBytes;
use crate::models::decoder::LlamaConfig;
use crate::models::gemma3::{self, Gemma3, Gemma3Config};
use crate::models::BuildOptions;
use crate::models::CausalLm;
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
        ("self_attn.qkv_proj", "attn_qkv"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        // Phi-3: gate and up in one matrix, which llama.cpp calls `ffn_up`.
        ("mlp.gate_up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("pre_feedforward_layernorm", "ffn_norm"),
        ("post_feedforward_layernorm", "post_ffw_norm"),
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
    /// `general.architecture`.
    arch: String,
    content: Content,
    reader: BufReader<File>,
    device: Device,
}

impl GgufSource {
    /// The GGUF name of `hf` in this file. Gemma's `post_attention_layernorm` follows attention
    /// (llama.cpp's `post_attention_norm`); Llama's precedes the MLP (`ffn_norm`).
    fn name(&self, hf: &str) -> String {
        match self.arch.as_str() {
            gemma3::ARCHITECTURE => {
                gguf_name(&hf.replace("post_attention_layernorm", "post_attention_norm"))
            }
            _ => gguf_name(hf),
        }
    }
}

impl WeightSource for GgufSource {
    fn get(&mut self, name: &str, shape: &[usize]) -> Result<Weight, String> {
        let gname = self.name(name);
        if !self.content.tensor_infos.contains_key(&gname) {
            return Err(format!("tensor `{gname}` ({name}) is missing"));
        }
        let q = self
            .content
            .tensor(&mut self.reader, &gname, &self.device)
            .map_err(|e| format!("tensor `{gname}` cannot be read: {e}"))?;
        check_shape(&gname, Weight::Quantized(Arc::new(q)), shape)
    }

    fn contains(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(&self.name(name))
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

/// `general.architecture`.
fn architecture(meta: &HashMap<String, Value>) -> Result<String, String> {
    meta.get("general.architecture")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .ok_or_else(|| "metadata `general.architecture` is missing".into())
}

/// The config of each family this file loads.
enum Config {
    Llama(LlamaConfig),
    Gemma3(Gemma3Config),
}

/// The Llama-family config from `{arch}.*` metadata.
fn config(
    meta: &HashMap<String, Value>,
    vocab: usize,
    has_output: bool,
) -> Result<LlamaConfig, String> {
    let arch = architecture(meta)?;
    if !crate::models::is_llama_shaped(&arch) {
        return Err(format!(
            "unknown architecture {arch:?}; supported: {}",
            crate::models::text_architectures().join(", ")
        ));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let heads = meta_usize(meta, &key("attention.head_count"))?;
    let hidden = meta_usize(meta, &key("embedding_length"))?;
    // llama.cpp: head size `attention.key_length` (default hidden / heads); RoPE rotates
    // `rope.dimension_count` of it.
    let head_dim = meta_usize(meta, &key("attention.key_length")).ok();
    let full = head_dim.unwrap_or(hidden / heads.max(1));
    if let Ok(rotated) = meta_usize(meta, &key("rope.dimension_count")) {
        if rotated != full {
            return Err(format!(
                "metadata `{}` is {rotated}, the head size is {full}: only RoPE over the whole \
                 head is implemented",
                key("rope.dimension_count")
            ));
        }
    }
    let scaling = key("rope.scaling.type");
    match meta.get(&scaling).map(|v| v.to_string()) {
        None => {}
        Some(Ok(t)) if t == "none" => {}
        Some(t) => {
            return Err(format!(
                "metadata `{scaling}` is {:?}: only unscaled RoPE and Llama 3's `rope_freqs` \
                 factors are implemented",
                t.map_or_else(|e| e.to_string(), Clone::clone)
            ))
        }
    }
    Ok(LlamaConfig {
        hidden_size: hidden,
        intermediate_size: meta_usize(meta, &key("feed_forward_length"))?,
        num_hidden_layers: meta_usize(meta, &key("block_count"))?,
        num_attention_heads: heads,
        num_key_value_heads: meta_usize(meta, &key("attention.head_count_kv")).ok(),
        head_dim,
        vocab_size: vocab,
        rope_theta: meta_f64(meta, &key("rope.freq_base")).unwrap_or(10_000.0),
        rms_norm_eps: meta_f64(meta, &key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        max_position_embeddings: meta_usize(meta, &key("context_length")).unwrap_or(4096),
        tie_word_embeddings: !has_output,
        attention_bias: false,
        sliding_window: meta_usize(meta, &key("attention.sliding_window")).ok(),
        use_sliding_window: None,
        rope_scaling: None,
        partial_rotary_factor: None,
        // llama.cpp's converter permutes q/k rows of Llama-style archs (interleaved RoPE); Qwen
        // and Phi-3 files keep halves (NEOX).
        rope_interleaved: matches!(arch.as_str(), "llama" | "mistral" | "smollm"),
        model_type: arch,
    })
}

/// What prompting the model in a GGUF file needs, read from its metadata alone (the caller
/// adds the path to an error).
pub fn text(path: &Path) -> Result<ModelText, String> {
    ModelText::from_gguf(&metadata(path)?)
}

/// The file's metadata, read by lmhost's own reader, which checks the header (counts, lengths
/// and shapes within the file).
fn metadata(path: &Path) -> Result<Metadata, String> {
    Metadata::read(path).map_err(|e| match e {
        GgufError::File { source, .. } => source.to_string(),
        e => e.to_string(),
    })
}

/// Loads a GGUF file; every error names what was wrong (the caller adds the path). lmhost's
/// own reader checks the header first, so candle's, which allocates what the header says, only
/// ever reads a sound one.
pub fn load(path: &Path, build: BuildOptions) -> Result<LoadedLm, String> {
    let meta = metadata(path)?;
    // The tokenizer is built on a thread of its own while the weights load, much of which
    // reads the file on one core; the model's shape needs only the vocabulary's length.
    let vocab = meta.array(TOKENS).map(<[_]>::len);
    std::thread::scope(|scope| {
        let text = scope.spawn(|| ModelText::from_gguf(&meta));
        let model = load_model(path, build, vocab);
        let text = text
            .join()
            .map_err(|_| "building its tokenizer panicked".to_string())??;
        let (model, stored_prompts) = model?;
        Ok(LoadedLm {
            model,
            text,
            stored_prompts,
            vision: None,
        })
    })
}

/// The model in a GGUF file of `vocab` tokens, and whether a generation's prompt runs through
/// its decode copies.
fn load_model(
    path: &Path,
    mut build: BuildOptions,
    vocab: Option<usize>,
) -> Result<(Box<dyn CausalLm>, bool), String> {
    let vocab = vocab.ok_or_else(|| format!("{TOKENS} is missing or not an array"))?;
    let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot open: {e}"))?
        .len();
    let mut reader = BufReader::new(file);
    let content =
        Content::read(&mut reader).map_err(|e| format!("not a readable GGUF file: {e}"))?;
    check_extents(&content, len)?;
    let meta = &content.metadata;
    let has_output = content.tensor_infos.contains_key("output.weight");
    let arch = architecture(meta)?;
    let cfg = if arch == gemma3::ARCHITECTURE {
        Config::Gemma3(gemma3_config(meta, vocab)?)
    } else {
        let mut cfg = config(meta, vocab, has_output)?;
        // llama.cpp loads q/k/v biases wherever a file has them (`create_tensor_qkv`).
        cfg.attention_bias = ["blk.0.attn_q.bias", "blk.0.attn_qkv.bias"]
            .iter()
            .any(|name| content.tensor_infos.contains_key(*name));
        Config::Llama(cfg)
    };
    let bytes = weight_bytes(&content);
    build.format = crate::memory::fit(&build, &bytes)?;
    let stored_prompts =
        crate::weights::stored_prompts(build.format, bytes.quantized(), build.dtype, &build.device);
    let mut source = GgufSource {
        arch,
        content,
        reader,
        device: build.device.clone(),
    };
    let model: Box<dyn CausalLm> = match cfg {
        Config::Llama(cfg) => Box::new(crate::models::load_decoder(cfg, &mut source, build)?),
        Config::Gemma3(cfg) => Box::new(Gemma3::load(cfg, &mut source, build)?),
    };
    Ok((model, stored_prompts))
}

/// The Gemma 3 config from `gemma3.*` metadata, read as llama.cpp's `llama_model_gemma3` reads
/// it (defaults included).
fn gemma3_config(meta: &HashMap<String, Value>, vocab: usize) -> Result<Gemma3Config, String> {
    let key = |k: &str| format!("{}.{k}", gemma3::ARCHITECTURE);
    let hidden = meta_usize(meta, &key("embedding_length"))?;
    let heads = meta_usize(meta, &key("attention.head_count"))?;
    let layers = meta_usize(meta, &key("block_count"))?;
    let head_dim = meta_usize(meta, &key("attention.key_length")).unwrap_or(hidden / heads.max(1));
    for other in ["attention.value_length", "rope.dimension_count"] {
        if let Ok(n) = meta_usize(meta, &key(other)) {
            if n != head_dim {
                return Err(format!(
                    "metadata `{}` is {n}, the head size is {head_dim}: only equal key, value \
                     and rotated sizes are implemented",
                    key(other)
                ));
            }
        }
    }
    let factor = meta_f64(meta, &key("rope.scaling.factor"))
        .or_else(|| meta_f64(meta, &key("rope.scale_linear")))
        .filter(|&f| f != 0.0)
        .unwrap_or(1.0);
    let scaling = key("rope.scaling.type");
    let factor = match meta.get(&scaling).map(|v| v.to_string()) {
        None => factor,
        Some(Ok(t)) if t == "linear" => factor,
        // llama.cpp never scales under "none".
        Some(Ok(t)) if t == "none" => 1.0,
        Some(_) if factor == 1.0 => 1.0,
        Some(t) => {
            return Err(format!(
                "metadata `{scaling}` is {:?}: only linear RoPE scaling is implemented",
                t.map_or_else(|e| e.to_string(), Clone::clone)
            ))
        }
    };
    // Without a sliding window every layer is global (llama.cpp's LLAMA_SWA_TYPE_NONE).
    let window = meta_usize(meta, &key("attention.sliding_window"))
        .ok()
        .filter(|&w| w > 0);
    let pattern = key("attention.sliding_window_pattern");
    let local_layers = match meta.get(&pattern) {
        Some(Value::Array(flags)) => flags
            .iter()
            .map(Value::to_bool)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("metadata `{pattern}`: {e}"))?,
        Some(_) => gemma3::local_layers(layers, meta_usize(meta, &pattern)?),
        None => gemma3::local_layers(layers, gemma3::PATTERN),
    };
    let eps = key("attention.layer_norm_rms_epsilon");
    Ok(Gemma3Config {
        hidden_size: hidden,
        intermediate_size: meta_usize(meta, &key("feed_forward_length"))?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: meta_usize(meta, &key("attention.head_count_kv")).unwrap_or(heads),
        head_dim,
        vocab_size: vocab,
        rope_theta: meta_f64(meta, &key("rope.freq_base")).unwrap_or(10_000.0),
        rope_local_base_freq: meta_f64(meta, &key("rope.freq_base_swa"))
            .unwrap_or(gemma3::LOCAL_ROPE_BASE),
        rope_scaling_factor: factor,
        rms_norm_eps: meta_f64(meta, &eps).ok_or_else(|| format!("metadata `{eps}` is missing"))?,
        max_position_embeddings: meta_usize(meta, &key("context_length"))?,
        sliding_window: window,
        local_layers,
        // GGUF files do not store it; llama.cpp uses head_dim, except for 27B (62 layers), whose
        // config sets hidden / heads.
        query_pre_attn_scalar: if layers == 62 {
            (hidden / heads.max(1)) as f64
        } else {
            head_dim as f64
        },
        final_logit_softcapping: meta_f64(meta, &key("final_logit_softcapping"))
            .filter(|&c| c > 0.0),
    })
}

/// What the file's tensors take, from the tensor list alone.
/// Refuses a tensor whose data would lie past the end of the file (`len` bytes), before any is
/// read into a buffer of the size its header claims.
fn check_extents(content: &Content, len: u64) -> Result<(), String> {
    for (name, info) in &content.tensor_infos {
        let dtype = info.ggml_dtype;
        let blocks = (info.shape.elem_count() / dtype.block_size()) as u128;
        let end = u128::from(content.tensor_data_offset)
            + u128::from(info.offset)
            + blocks * dtype.type_size() as u128;
        if end > u128::from(len) {
            return Err(format!(
                "tensor `{name}` ({:?}, {dtype:?}) would end at byte {end}, past the end of \
                 the file ({len} bytes): the file is truncated or its header is corrupt",
                info.shape.dims()
            ));
        }
    }
    Ok(())
}

fn weight_bytes(content: &Content) -> WeightBytes {
    let mut bytes = WeightBytes::default();
    for info in content.tensor_infos.values() {
        bytes.add(info.ggml_dtype, info.shape.elem_count());
    }
    bytes
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
        assert_eq!(
            gguf_name("model.layers.1.post_feedforward_layernorm.weight"),
            "blk.1.post_ffw_norm.weight"
        );
        assert_eq!(gguf_name("model.embed_tokens.weight"), "token_embd.weight");
        assert_eq!(gguf_name("lm_head.weight"), "output.weight");
    }
}
