//! A vision-language checkpoint's eyes: its image processor's files read, its vision tower and
//! projector loaded, and both checked against the tokenizer and config. A checkpoint without
//! an image processor's settings runs as its language model alone, and refuses images.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lmhost_plugin_kit::multimodal::{
    Gemma3Processor, Idefics3Processor, Normalize, Processor, ResizeNormalize, Vision,
};
use lmhost_plugin_kit::text::ModelText;
use serde_json::Value;

use super::safetensors::Files;
use crate::models::vision::{var_builder, ImageEncoder, ImageFeatures};
use crate::models::{gemma3, idefics3};

/// What a language model that sees images is given, and what its front end is given.
pub type Eyes = (Arc<ImageFeatures>, Vision);

/// The files a checkpoint keeps its processor in, beside config.json.
struct ProcessorFiles {
    /// The image processor's settings and the file they came from: preprocessor_config.json
    /// (the hub's layout), else processor_config.json's `image_processor` (what Transformers 5
    /// saves).
    images: (Value, PathBuf),
    /// processor_config.json, where there is one.
    processor: Value,
}

impl ProcessorFiles {
    fn find(files: &Files) -> Result<Option<Self>, String> {
        let json = |name: &str| -> Result<Option<(Value, PathBuf)>, String> {
            let path = files.config.with_file_name(name);
            if !path.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&path).map_err(|e| at(&path, e))?;
            let value = serde_json::from_str(&text).map_err(|e| at(&path, e))?;
            Ok(Some((value, path)))
        };
        let processor = json("processor_config.json")?;
        let images = match json("preprocessor_config.json")? {
            Some(found) => Some(found),
            None => processor
                .as_ref()
                .filter(|(v, _)| v.get("image_processor").is_some())
                .map(|(v, path)| (v["image_processor"].clone(), path.clone())),
        };
        Ok(images.map(|images| ProcessorFiles {
            images,
            processor: processor.map_or(Value::Null, |(v, _)| v),
        }))
    }

    /// An error about the image processor's settings, naming their file.
    fn err(&self, e: impl std::fmt::Display) -> String {
        at(&self.images.1, e)
    }

    /// An error loading the vision tower, which is checked against these settings.
    fn tower_err(&self, e: impl std::fmt::Display) -> String {
        let file = self.images.1.display();
        format!("vision tower (with the image processor settings of {file}): {e}")
    }
}

fn at(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// A multimodal Gemma 3 checkpoint's vision tower, projector and processor.
pub fn gemma3(files: &Files, config: &Value, text: &ModelText) -> Result<Option<Eyes>, String> {
    let Some(found) = ProcessorFiles::find(files)? else {
        return Ok(None);
    };
    let pixels = ResizeNormalize::from_config(&found.images.0).map_err(|e| found.err(e))?;
    let cfg: gemma3::vision::VisionConfig =
        serde_json::from_value(config.clone()).map_err(|e| at(&files.config, e))?;
    let vb = var_builder(&files.weights).map_err(|e| e.to_string())?;
    let tower =
        gemma3::vision::Gemma3Vision::load(&cfg, pixels, vb).map_err(|e| found.tower_err(e))?;
    let processor = Gemma3Processor::new(cfg.mm_tokens_per_image, |t| text.tokenizer.id(t))
        .map_err(|e| at(&files.tokenizer, e))?;
    let token = ("image_token_index", cfg.image_token_index);
    eyes(files, Box::new(tower), Arc::new(processor), token).map(Some)
}

/// An Idefics3 (SmolVLM) checkpoint's vision tower, connector and processor: tiles of
/// `max_image_size.longest_edge` pixels from images scaled to `size.longest_edge`, each tile's
/// placeholders processor_config.json's `image_seq_len` (else what the tower makes of a tile).
pub fn idefics3(files: &Files, config: &Value, text: &ModelText) -> Result<Option<Eyes>, String> {
    let Some(found) = ProcessorFiles::find(files)? else {
        return Ok(None);
    };
    let settings = &found.images.0;
    let side = |key: &str| {
        let v = settings[key]["longest_edge"].as_u64().filter(|&v| v > 0);
        v.map(|v| v as u32)
            .ok_or_else(|| found.err(format!("`{key}.longest_edge` must be a positive integer")))
    };
    let sizes = (side("size")?, side("max_image_size")?);
    let normalize = Normalize::from_config(settings).map_err(|e| found.err(e))?;
    let cfg: idefics3::VisionConfig =
        serde_json::from_value(config.clone()).map_err(|e| at(&files.config, e))?;
    let vision = &cfg.vision_config;
    let tile_rows = (vision.image_size / vision.patch_size / cfg.scale_factor.max(1)).pow(2);
    let seq_len = match found.processor.get("image_seq_len") {
        Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| {
            let path = files.config.with_file_name("processor_config.json");
            at(&path, "`image_seq_len` must be an integer")
        })?,
        None => tile_rows,
    };
    let processor = Idefics3Processor::new(sizes, seq_len, |t| text.tokenizer.id(t))
        .map_err(|e| at(&files.tokenizer, e))?;
    let processor = Arc::new(processor);
    let vb = var_builder(&files.weights).map_err(|e| e.to_string())?;
    let tower = idefics3::Idefics3Vision::load(&cfg, processor.clone(), normalize, vb)
        .map_err(|e| found.tower_err(e))?;
    let token = ("image_token_id", cfg.image_token_id);
    eyes(files, Box::new(tower), processor, token).map(Some)
}

/// The features registry over `encoder` and the front end's vision, once config.json's
/// image token (`(key, id)`) is the processor's.
fn eyes(
    files: &Files,
    encoder: Box<dyn ImageEncoder>,
    processor: Arc<dyn Processor>,
    (key, id): (&str, Option<u32>),
) -> Result<Eyes, String> {
    if let Some(id) = id.filter(|&id| id != processor.image_token_id()) {
        return Err(at(
            &files.config,
            format!(
                "`{key}` is {id}, but the tokenizer's `{}` is {}",
                processor.image_token(),
                processor.image_token_id()
            ),
        ));
    }
    let features = Arc::new(ImageFeatures::new(encoder));
    let vision = Vision {
        processor,
        ids: features.clone(),
    };
    Ok((features, vision))
}
