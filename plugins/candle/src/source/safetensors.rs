//! Hugging Face checkpoints: `config.json`, `tokenizer.json`, `tokenizer_config.json` (chat
//! template, special tokens) and safetensors weights, one file or shards listed in an index.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::Device;
use lmhost_plugin_kit::template::ChatTemplate;
use lmhost_plugin_kit::tokenizer::TextTokenizer;
use serde_json::Value;
use tokenizers::Tokenizer;

use super::Loaded;
use crate::memory::WeightBytes;
use crate::models::decoder::Decoder;
use crate::models::llama::{BuildOptions, LlamaConfig, ARCHITECTURES};
use crate::weights::{check_shape, Weight, WeightSource};

/// The files of a checkpoint, wherever they came from (a directory or the hub cache).
pub struct Files {
    pub config: PathBuf,
    pub tokenizer: PathBuf,
    pub tokenizer_config: Option<PathBuf>,
    pub weights: Vec<PathBuf>,
}

/// The shard file names an index lists, deduplicated, in order.
pub fn shards_of_index(index: &Path) -> Result<Vec<String>, String> {
    let text = read(index)?;
    let json: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", index.display()))?;
    let map = json
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("{}: no `weight_map` object", index.display()))?;
    let mut shards: Vec<String> = map
        .values()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    shards.sort();
    shards.dedup();
    Ok(shards)
}

impl Files {
    /// The files of a local checkpoint directory.
    pub fn in_dir(dir: &Path) -> Result<Files, String> {
        let file = |name: &str| {
            let p = dir.join(name);
            p.is_file().then_some(p)
        };
        let config = file("config.json").ok_or("no config.json in the directory")?;
        let tokenizer = file("tokenizer.json").ok_or("no tokenizer.json in the directory")?;
        let weights = if let Some(single) = file("model.safetensors") {
            vec![single]
        } else if let Some(index) = file("model.safetensors.index.json") {
            shards_of_index(&index)?
                .iter()
                .map(|s| dir.join(s))
                .collect()
        } else {
            return Err(
                "no model.safetensors or model.safetensors.index.json in the directory".into(),
            );
        };
        Ok(Files {
            config,
            tokenizer,
            tokenizer_config: file("tokenizer_config.json"),
            weights,
        })
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The shards, memory-mapped: a tensor is copied out of the map when the model asks for it, so
/// loading holds one tensor in its stored dtype at a time, never a second copy of the files.
struct SafetensorsSource {
    files: MmapedSafetensors,
    names: HashSet<String>,
    device: Device,
}

impl SafetensorsSource {
    fn open(paths: &[PathBuf], device: &Device) -> Result<Self, String> {
        for path in paths {
            if !path.is_file() {
                return Err(format!("{}: no such file", path.display()));
            }
        }
        // SAFETY: the maps are read-only and dropped once the model is built. As with every
        // mmap reader, no other process may truncate or rewrite a shard while it loads (the
        // reader checks offsets against the header, not against later changes to the file).
        let files = unsafe { MmapedSafetensors::multi(paths) }
            .map_err(|e| format!("not a readable safetensors file: {e}"))?;
        let names = files.tensors().into_iter().map(|(name, _)| name).collect();
        Ok(SafetensorsSource {
            files,
            names,
            device: device.clone(),
        })
    }

    /// What the shards' tensors take, from their headers alone.
    fn weight_bytes(&self) -> WeightBytes {
        let mut bytes = WeightBytes::default();
        for (_, view) in self.files.tensors() {
            bytes.add_dense(view.shape().iter().product());
        }
        bytes
    }
}

impl WeightSource for SafetensorsSource {
    fn get(&mut self, name: &str, shape: &[usize]) -> Result<Weight, String> {
        if !self.names.contains(name) {
            return Err(format!("tensor `{name}` is missing"));
        }
        let t = self
            .files
            .get(name)
            .and_then(|view| view.load(&self.device))
            .map_err(|e| format!("tensor `{name}` cannot be read: {e}"))?;
        check_shape(name, Weight::Dense(t), shape)
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// A special token in tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// EOS ids: config.json's `eos_token_id` (a number or a list), else the tokenizer's eos token.
fn eos_ids(config: &Value, eos_token: Option<&str>, tokenizer: &Tokenizer) -> Vec<u32> {
    match config.get("eos_token_id") {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64().map(|n| n as u32))
            .collect(),
        _ => eos_token
            .and_then(|t| tokenizer.token_to_id(t))
            .into_iter()
            .collect(),
    }
}

pub fn load(
    files: &Files,
    model_class: Option<&str>,
    mut build: BuildOptions,
) -> Result<Loaded, String> {
    let config_text = read(&files.config)?;
    let config_json: Value = serde_json::from_str(&config_text)
        .map_err(|e| format!("{}: {e}", files.config.display()))?;
    let arch = model_class
        .map(String::from)
        .or_else(|| {
            config_json
                .get("model_type")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .unwrap_or_else(|| "llama".into());
    if !ARCHITECTURES.contains(&arch.as_str()) {
        return Err(format!(
            "{}: unknown architecture {arch:?}; supported: {}",
            files.config.display(),
            ARCHITECTURES.join(", ")
        ));
    }
    let mut cfg: LlamaConfig = serde_json::from_value(config_json.clone())
        .map_err(|e| format!("{}: {e}", files.config.display()))?;
    cfg.model_type = arch;
    cfg.rope_interleaved = false;
    let tokenizer = Tokenizer::from_file(&files.tokenizer)
        .map_err(|e| format!("{}: {e}", files.tokenizer.display()))?;
    let tok_config: Value = match &files.tokenizer_config {
        Some(p) => serde_json::from_str(&read(p)?).map_err(|e| format!("{}: {e}", p.display()))?,
        None => Value::Null,
    };
    let id_of = |key: &str| token_text(tok_config.get(key)).and_then(|t| tokenizer.token_to_id(&t));
    let (bos, eos_token) = (id_of("bos_token"), token_text(tok_config.get("eos_token")));
    let eos = eos_ids(&config_json, eos_token.as_deref(), &tokenizer);
    let chat_template = match (&files.tokenizer_config, tok_config.get("chat_template")) {
        (Some(path), Some(_)) => Some(
            ChatTemplate::from_json(&tok_config, path.display().to_string())
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let tokenizer = TextTokenizer::from_hf(tokenizer, bos, eos.first().copied());
    let mut source = SafetensorsSource::open(&files.weights, &build.device)?;
    build.format = crate::memory::fit(&build, &source.weight_bytes())?;
    let model = Decoder::load(cfg, &mut source, build)?;
    Ok(Loaded {
        model: Box::new(model),
        tokenizer,
        chat_template,
        eos_ids: eos,
    })
}
