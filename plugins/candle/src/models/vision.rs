//! What every vision-language model here shares: an image encoder's contract, the registry that
//! encodes each distinct image once and hands its features to the language model by image id,
//! and the language model's input rows with those features in place of the placeholders.

use std::collections::VecDeque;
use std::sync::Mutex;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::VarBuilder;
use lmhost_plugin_api::author::lock_or_reset;
use lmhost_plugin_api::{Image, PluginError};
use lmhost_plugin_kit::multimodal::{image_runs, ImageIds, FIRST_IMAGE_ID};

/// A model's eyes: an image (its pixels) to the rows that replace its placeholders in the
/// language model's input, `(placeholders, text width)`, preprocessing included.
pub trait ImageEncoder: Send + Sync {
    fn encode(&self, image: &Image) -> Result<Tensor>;
}

/// A VarBuilder over the f32 tensors of `files` on the CPU: the vision towers run in f32, once
/// per distinct image, not once per prompt.
pub fn var_builder(files: &[std::path::PathBuf]) -> Result<VarBuilder<'static>> {
    // SAFETY: the checkpoint files are not modified while the model is loaded (candle's own
    // loaders make the same assumption of memory-mapped weights).
    unsafe { VarBuilder::from_mmaped_safetensors(files, DType::F32, &Device::Cpu) }
}

/// A prompt's images as the language model sees them: each distinct image (by its digest)
/// encoded once into its features, its placeholders given consecutive ids of their own (see
/// [`FIRST_IMAGE_ID`]), and those ids' rows handed to the model's input.
pub struct ImageFeatures {
    encoder: Box<dyn ImageEncoder>,
    seen: Mutex<Seen>,
}

/// The images encoded so far, most recently used last.
#[derive(Default)]
struct Seen {
    /// `(digest, first id, features (tokens, width))`.
    images: VecDeque<(String, u32, Tensor)>,
    /// The first id the next new image gets: ids are never reused, so an evicted image's
    /// cached prompts can never match another image's.
    next: u32,
    /// Images the vision tower has encoded.
    encoded: usize,
}

impl ImageFeatures {
    /// Images whose features are kept: a prompt's images and those of the prompts around it
    /// (an explanation's coalitions share a few), at a few MB each for a 4B model.
    const KEPT: usize = 64;

    pub fn new(encoder: Box<dyn ImageEncoder>) -> Self {
        ImageFeatures {
            encoder,
            seen: Mutex::new(Seen {
                next: FIRST_IMAGE_ID,
                ..Seen::default()
            }),
        }
    }

    /// The feature rows of image ids, `(ids.len(), width)`; an id no kept image has is an
    /// error (its image was evicted between rendering and running, which a prompt's own
    /// images, rendered just before, never are).
    pub fn rows(&self, ids: &[u32]) -> Result<Tensor> {
        let seen = lock_or_reset(&self.seen, |s| s.images.clear());
        let rows = ids
            .iter()
            .map(|&id| {
                let found = seen.images.iter().find(|(_, first, features)| {
                    id >= *first && ((id - first) as usize) < features.dim(0).unwrap_or(0)
                });
                match found {
                    Some((_, first, features)) => features.narrow(0, (id - first) as usize, 1),
                    None => candle_core::bail!("image id {id} stands for no kept image"),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&rows, 0)
    }
}

impl ImageIds for ImageFeatures {
    fn ids_of(&self, image: &Image, count: usize) -> std::result::Result<u32, PluginError> {
        let digest = image.digest();
        let internal = |e: candle_core::Error| PluginError::internal(format!("vision tower: {e}"));
        {
            let mut seen = lock_or_reset(&self.seen, |s| s.images.clear());
            if let Some(i) = seen.images.iter().position(|(d, ..)| *d == digest) {
                let kept = seen.images.remove(i).expect("found just now");
                let first = kept.1;
                seen.images.push_back(kept);
                return Ok(first);
            }
        }
        // Encoded outside the lock: another prompt's image may be looked up meanwhile.
        let features = self.encoder.encode(image).map_err(internal)?;
        if features.dim(0).map_err(internal)? != count {
            return Err(PluginError::internal(format!(
                "the vision tower made {} features for an image of {count} placeholders",
                features.dim(0).unwrap_or(0)
            )));
        }
        let mut seen = lock_or_reset(&self.seen, |s| s.images.clear());
        let first = seen.next;
        seen.next = first
            .checked_add(count as u32)
            .ok_or_else(|| PluginError::internal("image ids ran out; reload the model"))?;
        seen.encoded += 1;
        seen.images.push_back((digest, first, features));
        if seen.images.len() > Self::KEPT {
            seen.images.pop_front();
        }
        Ok(first)
    }

    fn encoded(&self) -> usize {
        lock_or_reset(&self.seen, |s| s.images.clear()).encoded
    }
}

/// Whether the checkpoint at `model_id` may see images: a local folder whose `config.json`
/// has a `vision_config`, or anything not yet on disk (a hub id: known once it loads). A GGUF
/// file, or a folder without one, sees none.
pub fn may_see(model_id: &std::path::Path) -> bool {
    if model_id.is_file() {
        return false;
    }
    match std::fs::read_to_string(model_id.join("config.json")) {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|config| config.get("vision_config").is_some()),
        Err(_) => !model_id.is_dir(),
    }
}

/// Whether `ids` hold an image's placeholders.
pub fn has_images(ids: &[u32]) -> bool {
    ids.iter().any(|&id| id >= FIRST_IMAGE_ID)
}

/// `ids` as token ids: an image id becomes token 0, whose embedding [`with_image_rows`]
/// replaces.
pub fn token_ids(ids: &[u32]) -> Vec<u32> {
    ids.iter()
        .map(|&id| if id >= FIRST_IMAGE_ID { 0 } else { id })
        .collect()
}

/// The input rows `x`, `(ids.len(), width)`, of `ids` with each image id's row replaced by its
/// image's features (as they are: Transformers scatters them in after any embedding scale).
pub fn with_image_rows(x: Tensor, ids: &[u32], images: Option<&ImageFeatures>) -> Result<Tensor> {
    let runs = image_runs(ids, 0);
    if runs.is_empty() {
        return Ok(x);
    }
    let Some(features) = images else {
        candle_core::bail!("a prompt holds image ids, but this model has no vision tower");
    };
    let mut pieces = Vec::new();
    let mut at = 0;
    for run in runs {
        if run.start > at {
            pieces.push(x.narrow(0, at, run.start - at)?);
        }
        let rows = features.rows(&ids[run.clone()])?;
        pieces.push(rows.to_dtype(x.dtype())?.to_device(x.device())?);
        at = run.end;
    }
    if at < ids.len() {
        pieces.push(x.narrow(0, at, ids.len() - at)?);
    }
    Tensor::cat(&pieces, 0)
}
