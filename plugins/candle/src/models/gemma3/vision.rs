//! Gemma 3's eyes: the SigLIP vision tower and the multimodal projector, which turn an image's
//! pixel values into the vectors that replace its soft tokens in the language model's input.
//!
//! The tower is candle-transformers' `siglip::VisionModel` without its pooling head (Gemma 3
//! uses every patch). The projector is Transformers' `Gemma3MultiModalProjector`: the patches'
//! grid average-pooled to `mm_tokens_per_image` cells, Gemma's RMSNorm (`1 + w`) and a matrix
//! product into the language model's width. Both run in f32: an image is encoded once per
//! distinct image, not once per prompt.

use std::collections::VecDeque;
use std::sync::Mutex;

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::siglip;
use lmhost_plugin_api::author::lock_or_reset;
use lmhost_plugin_api::{Image, PluginError};
use lmhost_plugin_kit::multimodal::{ImageIds, ResizeNormalize, FIRST_IMAGE_ID};
use serde::Deserialize;

/// The `vision_config` and the image fields of a Gemma 3 config.json.
#[derive(Debug, Clone, Deserialize)]
pub struct VisionConfig {
    pub vision_config: siglip::VisionConfig,
    #[serde(default = "default_tokens_per_image")]
    pub mm_tokens_per_image: usize,
    /// The soft token's id, which the tokenizer must agree with.
    #[serde(default)]
    pub image_token_index: Option<u32>,
}

fn default_tokens_per_image() -> usize {
    256
}

/// The vision tower and projector of a Gemma 3 checkpoint.
pub struct Gemma3Vision {
    tower: siglip::VisionModel,
    /// `1 + w` of the projector's RMSNorm.
    norm: Tensor,
    eps: f64,
    /// `(vision width, text width)`.
    projection: Tensor,
    /// Patches along a side of the image, and along a side of a pooling cell.
    grid: (usize, usize),
    /// Height and width of the pixel values the tower takes.
    image_size: usize,
}

impl Gemma3Vision {
    /// Loads the tower and projector from `vb` (a checkpoint's root): `vision_tower.*` or
    /// `vision_tower.vision_model.*` (as the hub's files name it), `multi_modal_projector.*`.
    pub fn load(cfg: &VisionConfig, vb: VarBuilder) -> Result<Self> {
        let vision = &cfg.vision_config;
        let patches = vision.image_size / vision.patch_size;
        let side = (cfg.mm_tokens_per_image as f64).sqrt() as usize;
        if side == 0 || side * side != cfg.mm_tokens_per_image || !patches.is_multiple_of(side) {
            candle_core::bail!(
                "mm_tokens_per_image {} must be a square whose side divides the {patches} \
                 patches along an image's side",
                cfg.mm_tokens_per_image
            );
        }
        let tower_vb = vb.pp("vision_tower");
        let tower_vb = match tower_vb.contains_tensor("vision_model.post_layernorm.weight") {
            true => tower_vb.pp("vision_model"),
            false => tower_vb,
        };
        let tower = siglip::VisionModel::new(vision, false, tower_vb)?;
        let projector = vb.pp("multi_modal_projector");
        let norm = (projector.get(vision.hidden_size, "mm_soft_emb_norm.weight")? + 1.0)?;
        let width = projector.get_unchecked("mm_input_projection_weight")?;
        let projection = projector.get(
            (vision.hidden_size, width.dim(1)?),
            "mm_input_projection_weight",
        )?;
        Ok(Gemma3Vision {
            tower,
            norm,
            eps: vision.layer_norm_eps,
            projection,
            grid: (patches, patches / side),
            image_size: vision.image_size,
        })
    }

    /// The side of the square pixel values the tower takes.
    pub fn image_size(&self) -> usize {
        self.image_size
    }

    /// `(n, 3, size, size)` pixel values → `(n, mm_tokens_per_image, text width)` features.
    pub fn image_features(&self, pixel_values: &Tensor) -> Result<Tensor> {
        let hidden = self.tower.forward(pixel_values)?;
        let (n, _, width) = hidden.dims3()?;
        let (patches, cell) = self.grid;
        let pooled = hidden
            .transpose(1, 2)?
            .reshape((n, width, patches, patches))?
            .avg_pool2d(cell)?
            .flatten_from(2)?
            .transpose(1, 2)?;
        let normed = gemma_rms_norm(&pooled, &self.norm, self.eps)?;
        normed.broadcast_matmul(&self.projection)
    }
}

/// `x / sqrt(mean(x²) + eps) · scale` over the last axis, in f32 as Transformers computes it.
fn gemma_rms_norm(x: &Tensor, scale: &Tensor, eps: f64) -> Result<Tensor> {
    let x = x.to_dtype(DType::F32)?;
    let rms = (x.sqr()?.mean_keepdim(candle_core::D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&rms)?.broadcast_mul(scale)
}

/// A VarBuilder over the f32 tensors of `files` on the CPU.
pub fn var_builder(files: &[std::path::PathBuf]) -> Result<VarBuilder<'static>> {
    // SAFETY: the checkpoint files are not modified while the model is loaded (candle's own
    // loaders make the same assumption of memory-mapped weights).
    unsafe { VarBuilder::from_mmaped_safetensors(files, DType::F32, &Device::Cpu) }
}

/// A prompt's images as the language model sees them: each distinct image (by its digest)
/// encoded once into its features, its placeholders given consecutive ids of their own (see
/// [`FIRST_IMAGE_ID`]), and those ids' rows handed to the model's input.
pub struct ImageFeatures {
    vision: Gemma3Vision,
    pixels: ResizeNormalize,
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

    pub fn new(vision: Gemma3Vision, pixels: ResizeNormalize) -> Self {
        ImageFeatures {
            vision,
            pixels,
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

    fn encode(&self, image: &Image) -> Result<Tensor> {
        let size = self.pixels.height as usize;
        let values = self.pixels.pixel_values(image);
        let pixels = Tensor::from_vec(
            values,
            (1, 3, size, self.pixels.width as usize),
            &Device::Cpu,
        )?;
        self.vision.image_features(&pixels)?.squeeze(0)
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
        let features = self.encode(image).map_err(internal)?;
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
