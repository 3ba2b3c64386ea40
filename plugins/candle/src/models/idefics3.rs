//! Idefics3's eyes (SmolVLM's): a SigLIP vision tower over each view of an image (its tiles and
//! the whole image scaled to one tile), and the connector, Transformers' `Idefics3Connector`: a
//! pixel shuffle that folds each `scale x scale` block of patches into one wider vector, and a
//! matrix product into the language model's width. The language model is a Llama-shaped
//! [`super::decoder::Decoder`] that takes these rows in place of the `<image>` placeholders and
//! attends to them causally, as to text.
//!
//! The tower is candle-transformers' `siglip::VisionModel`: Idefics3's own embeddings bucket
//! each patch's position for images padded to a batch's largest, but every view here is a whole
//! tile, where the buckets are the patches' own positions (checked against Transformers'
//! bucketing for tiles of 2 to 64 patches a side).

use std::sync::Arc;

use candle_core::{Device, Module, Result, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::siglip;
use lmhost_plugin_api::Image;
use lmhost_plugin_kit::multimodal::{Idefics3Processor, Normalize};
use serde::Deserialize;

use super::vision::ImageEncoder;

/// The image fields of an Idefics3 config.json.
#[derive(Debug, Clone, Deserialize)]
pub struct VisionConfig {
    pub vision_config: siglip::VisionConfig,
    #[serde(default = "default_scale_factor")]
    pub scale_factor: usize,
    /// The `<image>` placeholder's id, which the tokenizer must agree with.
    #[serde(default)]
    pub image_token_id: Option<u32>,
}

fn default_scale_factor() -> usize {
    2
}

/// The vision tower and connector of an Idefics3 checkpoint, with its image processor.
pub struct Idefics3Vision {
    tower: siglip::VisionModel,
    /// `(vision width · scale², text width)`.
    projection: Tensor,
    scale: usize,
    processor: Arc<Idefics3Processor>,
    normalize: Normalize,
}

impl Idefics3Vision {
    /// Views the tower encodes at once: a 2048-pixel image is 17 views of 1024 patches, whose
    /// attention scores alone would take 850 MB in one batch.
    const VIEWS_AT_ONCE: usize = 4;

    /// Loads the tower (`model.vision_model.*`) and connector (`model.connector.*`) from `vb`,
    /// a checkpoint's root; the processor's tiles must be the tower's image size and make as
    /// many placeholders as the connector makes rows.
    pub fn load(
        cfg: &VisionConfig,
        processor: Arc<Idefics3Processor>,
        normalize: Normalize,
        vb: VarBuilder,
    ) -> Result<Self> {
        let vision = &cfg.vision_config;
        let side = vision.image_size / vision.patch_size;
        let scale = cfg.scale_factor;
        if scale == 0 || !side.is_multiple_of(scale) {
            candle_core::bail!(
                "scale_factor {scale} must divide the {side} patches along a tile's side"
            );
        }
        let rows = (side / scale).pow(2);
        let tile = processor.tile_size() as usize;
        let placeholders = processor.image_seq_len();
        if tile != vision.image_size || placeholders != rows {
            candle_core::bail!(
                "the image processor makes {tile}-pixel tiles of {placeholders} placeholders, \
                 but the vision tower takes {size}-pixel tiles and makes {rows} rows of each",
                size = vision.image_size
            );
        }
        let tower = siglip::VisionModel::new(vision, false, vb.pp("model.vision_model"))?;
        let connector = vb.pp("model.connector.modality_projection.proj");
        let width = connector.get_unchecked("weight")?.dim(0)?;
        let projection = connector
            .get((width, vision.hidden_size * scale * scale), "weight")?
            .t()?
            .contiguous()?;
        Ok(Idefics3Vision {
            tower,
            projection,
            scale,
            processor,
            normalize,
        })
    }

    /// `(n, 3, tile, tile)` pixel values → `(n · placeholders per tile, text width)` features.
    pub fn image_features(&self, pixel_values: &Tensor) -> Result<Tensor> {
        let n = pixel_values.dim(0)?;
        let mut rows = Vec::new();
        for from in (0..n).step_by(Self::VIEWS_AT_ONCE) {
            let views = pixel_values.narrow(0, from, Self::VIEWS_AT_ONCE.min(n - from))?;
            let hidden = self.tower.forward(&views)?;
            let shuffled = pixel_shuffle(&hidden, self.scale)?;
            rows.push(shuffled.broadcast_matmul(&self.projection)?.flatten_to(1)?);
        }
        Tensor::cat(&rows, 0)
    }
}

/// Transformers' `Idefics3Connector.pixel_shuffle`: `(n, side², d)` patches to
/// `(n, (side / s)², d · s²)`, each `s x s` block of patches one row.
fn pixel_shuffle(x: &Tensor, s: usize) -> Result<Tensor> {
    let (n, seq, d) = x.dims3()?;
    let side = (seq as f64).sqrt() as usize;
    x.reshape((n, side, side / s, d * s))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((n, side / s, side / s, d * s * s))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((n, seq / (s * s), d * s * s))
}

impl ImageEncoder for Idefics3Vision {
    fn encode(&self, image: &Image) -> Result<Tensor> {
        let (values, views) = self.processor.pixel_values(image, &self.normalize);
        let tile = self.processor.tile_size() as usize;
        let pixels = Tensor::from_vec(values, (views, 3, tile, tile), &Device::Cpu)?;
        self.image_features(&pixels)
    }
}
