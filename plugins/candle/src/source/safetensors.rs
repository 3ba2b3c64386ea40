//! Hugging Face checkpoints: `config.json`, `tokenizer.json`, `tokenizer_config.json` (chat
//! template, special tokens) and safetensors weights, one file or shards listed in an index.
//! A Gemma 3 checkpoint is read as llama.cpp's converter reads it: 1 added to every norm weight
//! (Transformers computes x·(1 + w), the model takes the multiplier). A multimodal one (Gemma 3,
//! Idefics3) keeps its language model nested beside a vision tower, and with its image
//! processor's files also gets that tower, its projector and its processor (`vision.rs`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device};
use lmhost_plugin_kit::text::ModelText;
use serde_json::Value;

use super::{vision, LoadedLm};
use crate::memory::WeightBytes;
use crate::models::decoder::LlamaConfig;
use crate::models::gemma3::{self, Gemma3, Gemma3Config};
use crate::models::BuildOptions;
use crate::models::{text_architectures, CausalLm};
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

/// What prompting a checkpoint needs: `tokenizer.json` (required), and `tokenizer_config.json`
/// and `config.json` where they are (the template, the end-of-sequence ids).
pub fn text_of(
    tokenizer: &Path,
    tokenizer_config: Option<&Path>,
    config: Option<&Path>,
) -> Result<ModelText, String> {
    let config: Value = match config {
        Some(path) => {
            serde_json::from_str(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Value::Null,
    };
    ModelText::from_hf(tokenizer, tokenizer_config, &config)
}

/// [`text_of`] a checkpoint directory, whatever its architecture and whether or not it has
/// weights.
pub fn text_in_dir(dir: &Path) -> Result<ModelText, String> {
    let file = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    let tokenizer = file("tokenizer.json").ok_or("no tokenizer.json in the directory")?;
    text_of(
        &tokenizer,
        file("tokenizer_config.json").as_deref(),
        file("config.json").as_deref(),
    )
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
    layout: Layout,
}

/// How a checkpoint stores what the model asks for; the default is as asked.
#[derive(Default)]
struct Layout {
    /// What replaces the leading `model.` and `lm_head.` of a name: where a multimodal
    /// checkpoint keeps its language model.
    nested: Option<(&'static str, &'static str)>,
    /// Gemma: every `*norm.weight` stores w for x·(1 + w), and the model takes the multiplier.
    norm_offset: bool,
    /// The output layer is the embedding, whatever the file holds (`tie_word_embeddings`).
    tied: bool,
}

/// Where multimodal Gemma 3 checkpoints keep the language model and its output layer:
/// Transformers 4's layout (the Hub's files), then the one it loads them into.
const GEMMA3_NESTED: &[(&str, &str)] = &[
    ("language_model.model.", "language_model.lm_head."),
    ("model.language_model.", "lm_head."),
];

/// Where Idefics3 checkpoints keep theirs (Transformers 4 and 5 alike).
const IDEFICS3_NESTED: &[(&str, &str)] = &[("model.text_model.", "lm_head.")];

impl Layout {
    /// The stored name of the tensor the model calls `name`.
    fn stored(&self, name: &str) -> String {
        let Some((model, head)) = self.nested else {
            return name.to_string();
        };
        match (name.strip_prefix("model."), name.strip_prefix("lm_head.")) {
            (Some(rest), _) => format!("{model}{rest}"),
            (_, Some(rest)) => format!("{head}{rest}"),
            _ => name.to_string(),
        }
    }

    /// Whether the model reads the stored tensor `stored` (not a vision tower's, not a tied head).
    fn reads(&self, stored: &str) -> bool {
        let (model, head) = self.nested.unwrap_or(("", "lm_head."));
        if stored.starts_with(head) {
            return !self.tied;
        }
        stored.starts_with(model)
    }
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
            layout: Layout::default(),
        })
    }

    /// What the tensors the model reads take, from the shards' headers alone.
    fn weight_bytes(&self) -> WeightBytes {
        let mut bytes = WeightBytes::default();
        for (name, view) in self.files.tensors() {
            if self.layout.reads(&name) {
                bytes.add_dense(view.shape().iter().product());
            }
        }
        bytes
    }

    /// Reads the checkpoint in `layout`: the language model nested where the first of `nested`
    /// that holds its embedding says (a multimodal checkpoint), else at the top; an error names
    /// the places tried, and a missing output layer where `layout.tied` is false.
    fn set_layout(
        &mut self,
        nested: &[(&'static str, &'static str)],
        layout: Layout,
    ) -> Result<(), String> {
        let embed = |(model, _): &(&str, &str)| format!("{model}embed_tokens.weight");
        let found = nested.iter().find(|l| self.names.contains(&embed(l)));
        self.layout = Layout {
            nested: found.copied(),
            ..layout
        };
        if found.is_none() && !nested.is_empty() {
            let tried: Vec<String> = nested.iter().map(|l| format!("`{}`", embed(l))).collect();
            return Err(format!(
                "config.json has a `text_config` (a multimodal model), but the checkpoint has \
                 neither {}: only the language model of these layouts loads",
                tried.join(" nor ")
            ));
        }
        // Tied or not is config.json's to say (the model takes a head wherever the file has one).
        if !self.layout.tied && !self.contains("lm_head.weight") {
            return Err(format!(
                "tensor `{}` is missing (config.json sets `tie_word_embeddings` false)",
                self.layout.stored("lm_head.weight")
            ));
        }
        Ok(())
    }
}

impl WeightSource for SafetensorsSource {
    fn get(&mut self, name: &str, shape: &[usize]) -> Result<Weight, String> {
        let name = self.layout.stored(name);
        if !self.names.contains(&name) {
            return Err(format!("tensor `{name}` is missing"));
        }
        let mut t = self
            .files
            .get(&name)
            .and_then(|view| view.load(&self.device))
            .map_err(|e| format!("tensor `{name}` cannot be read: {e}"))?;
        // In f32, as Transformers adds it: 1 + w in a bf16 checkpoint's own dtype would round to
        // steps of 2^-7.
        if self.layout.norm_offset && name.ends_with("norm.weight") {
            t = t
                .to_dtype(DType::F32)
                .and_then(|t| t.affine(1.0, 1.0))
                .map_err(|e| format!("tensor `{name}`: {e}"))?;
        }
        check_shape(&name, Weight::Dense(t), shape)
    }

    fn contains(&self, name: &str) -> bool {
        let name = self.layout.stored(name);
        self.layout.reads(&name) && self.names.contains(&name)
    }
}

/// The config of each family a checkpoint may hold.
enum Config {
    Llama(LlamaConfig),
    Gemma3(Gemma3Checkpoint),
    /// SmolVLM's architecture: a Llama-shaped language model under `text_config`.
    Idefics3(LlamaConfig),
}

/// The `model_type` of Idefics3 checkpoints (SmolVLM's).
const IDEFICS3: &str = "idefics3";

/// A Gemma 3 checkpoint's config and what its layout depends on.
struct Gemma3Checkpoint {
    cfg: Gemma3Config,
    /// The settings sit under `text_config` (a multimodal model).
    multimodal: bool,
    tied: bool,
}

/// Gemma 3's config.json: the language model's settings at the top (`gemma3_text`) or under
/// `text_config` (`gemma3`, multimodal).
fn gemma3_config(json: &Value) -> Result<Gemma3Checkpoint, String> {
    let nested = json.get("text_config");
    let key = if nested.is_some() {
        "`text_config`: "
    } else {
        ""
    };
    let text: gemma3::TextConfig =
        serde_json::from_value(nested.unwrap_or(json).clone()).map_err(|e| format!("{key}{e}"))?;
    Ok(Gemma3Checkpoint {
        cfg: text.resolve().map_err(|e| format!("{key}{e}"))?,
        multimodal: nested.is_some(),
        tied: text.tie_word_embeddings,
    })
}

pub fn load(
    files: &Files,
    model_class: Option<&str>,
    mut build: BuildOptions,
) -> Result<LoadedLm, String> {
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
    let at_config = |e: String| format!("{}: {e}", files.config.display());
    let cfg = if gemma3::MODEL_TYPES.contains(&arch.as_str()) {
        Config::Gemma3(gemma3_config(&config_json).map_err(at_config)?)
    } else if arch == IDEFICS3 {
        let text = config_json.get("text_config").cloned().unwrap_or_default();
        let mut cfg: LlamaConfig =
            serde_json::from_value(text).map_err(|e| at_config(format!("`text_config`: {e}")))?;
        cfg.model_type = "llama".into();
        cfg.rope_interleaved = false;
        Config::Idefics3(cfg)
    } else if crate::models::is_llama_shaped(&arch) {
        let mut cfg: LlamaConfig =
            serde_json::from_value(config_json.clone()).map_err(|e| at_config(e.to_string()))?;
        cfg.model_type = arch;
        cfg.rope_interleaved = false;
        Config::Llama(cfg)
    } else {
        return Err(at_config(format!(
            "unknown architecture {arch:?}; supported: {}, {IDEFICS3}",
            text_architectures().join(", ")
        )));
    };
    let text = ModelText::from_hf(
        &files.tokenizer,
        files.tokenizer_config.as_deref(),
        &config_json,
    )?;
    let mut source = SafetensorsSource::open(&files.weights, &build.device)?;
    match &cfg {
        Config::Llama(_) => {}
        Config::Gemma3(gemma) => {
            let nested = if gemma.multimodal { GEMMA3_NESTED } else { &[] };
            let layout = Layout {
                norm_offset: true,
                tied: gemma.tied,
                nested: None,
            };
            source.set_layout(nested, layout)?;
        }
        Config::Idefics3(cfg) => {
            let layout = Layout {
                tied: cfg.tie_word_embeddings,
                ..Layout::default()
            };
            source.set_layout(IDEFICS3_NESTED, layout)?;
        }
    }
    let bytes = source.weight_bytes();
    build.format = crate::memory::fit(&build, &bytes)?;
    let stored_prompts =
        crate::weights::stored_prompts(build.format, bytes.quantized(), build.dtype, &build.device);
    let (model, vision): (Box<dyn CausalLm>, _) = match cfg {
        Config::Llama(cfg) => (
            Box::new(crate::models::load_decoder(cfg, &mut source, build)?),
            None,
        ),
        Config::Gemma3(gemma) => {
            let eyes = match gemma.multimodal {
                true => vision::gemma3(files, &config_json, &text)?,
                false => None,
            };
            let mut model = Gemma3::load(gemma.cfg, &mut source, build)?;
            if let Some((features, _)) = &eyes {
                model = model.seeing(features.clone());
            }
            (Box::new(model), eyes.map(|(_, vision)| vision))
        }
        Config::Idefics3(cfg) => {
            let eyes = vision::idefics3(files, &config_json, &text)?;
            let mut model = crate::models::load_decoder(cfg, &mut source, build)?;
            if let Some((features, _)) = &eyes {
                model = model.seeing(features.clone());
            }
            (Box::new(model), eyes.map(|(_, vision)| vision))
        }
    };
    Ok(LoadedLm {
        model,
        text,
        stored_prompts,
        vision,
    })
}
