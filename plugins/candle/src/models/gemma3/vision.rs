//! Gemma 3's eyes: the SigLIP vision tower and the multimodal projector, which turn an image's
//! pixel values into the vectors that replace its soft tokens in the language model's input.
//!
//! The tower is candle-transformers' `siglip::VisionModel` without its pooling head (Gemma 3
//! uses every patch). The projector is Transformers' `Gemma3MultiModalProjector`: the patches'
//! grid average-pooled to `mm_tokens_per_image` cells, Gemma's RMSNorm (`1 + w`) and a matrix
//! product into the language model's width. Both run in f32: an image is encoded once per
//! distinct image, not once per prompt.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::siglip;
use lmhost_plugin_api::Image;
use lmhost_plugin_kit::multimodal::ResizeNormalize;
use serde::Deserialize;

use crate::models::vision::ImageEncoder;

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
    /// The image processor's steps, into the pixel values the tower takes.
    pixels: ResizeNormalize,
}

impl Gemma3Vision {
    /// Loads the tower and projector from `vb` (a checkpoint's root): `vision_tower.*` or
    /// `vision_tower.vision_model.*` (as the hub's files name it), `multi_modal_projector.*`;
    /// `pixels` must resize images to the size the tower takes.
    pub fn load(cfg: &VisionConfig, pixels: ResizeNormalize, vb: VarBuilder) -> Result<Self> {
        let vision = &cfg.vision_config;
        let takes = vision.image_size as u32;
        if (pixels.height, pixels.width) != (takes, takes) {
            candle_core::bail!(
                "images are resized to {}x{}, but the vision tower takes {takes}x{takes}",
                pixels.height,
                pixels.width
            );
        }
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
            pixels,
        })
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

impl ImageEncoder for Gemma3Vision {
    fn encode(&self, image: &Image) -> Result<Tensor> {
        let (h, w) = (self.pixels.height as usize, self.pixels.width as usize);
        let values = self.pixels.pixel_values(image);
        let pixels = Tensor::from_vec(values, (1, 3, h, w), &Device::Cpu)?;
        self.image_features(&pixels)?.squeeze(0)
    }
}
