//! An image processor's pixel steps: resizing (as PIL resizes, [`super::resample`]), then
//! rescaling and normalizing each channel into the planes a vision tower takes.

use image::RgbImage;
use lmhost_plugin_api::Image;

use super::resample::{resize, Filter};
use serde_json::Value;

/// Each byte scaled by `rescale` (1/255), then each channel normalized by `mean` and `std`.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    pub rescale: f32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Normalize {
    /// From an image processor's settings: `rescale_factor`, `image_mean`, `image_std`; an
    /// error names a missing or malformed field.
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let triple = |key: &str| -> Result<[f32; 3], String> {
            let values = config[key]
                .as_array()
                .filter(|a| a.len() == 3)
                .ok_or_else(|| format!("`{key}` must be a list of 3 numbers"))?;
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(values) {
                *o = number(v, key)? as f32;
            }
            Ok(out)
        };
        let std = triple("image_std")?;
        if std.contains(&0.0) {
            return Err("`image_std` must not hold 0".into());
        }
        Ok(Normalize {
            rescale: number(&config["rescale_factor"], "rescale_factor")? as f32,
            mean: triple("image_mean")?,
            std,
        })
    }

    /// `image`'s values, channel by channel (`3 x height x width`, row-major).
    pub fn planes(&self, image: &RgbImage) -> Vec<f32> {
        let plane = (image.width() * image.height()) as usize;
        let mut values = vec![0f32; 3 * plane];
        for (i, pixel) in image.pixels().enumerate() {
            for c in 0..3 {
                let v = f32::from(pixel.0[c]) * self.rescale;
                values[c * plane + i] = (v - self.mean[c]) / self.std[c];
            }
        }
        values
    }
}

fn number(v: &Value, key: &str) -> Result<f64, String> {
    v.as_f64()
        .ok_or_else(|| format!("`{key}` must be a number"))
}

/// `image` as the `image` crate's buffer.
pub fn rgb(image: &Image) -> RgbImage {
    RgbImage::from_raw(image.width, image.height, image.rgb.to_vec())
        .expect("an Image holds width x height RGB pixels")
}

/// A fixed-size image processor's steps (Gemma 3's, SigLIP's): resize to `height x width`
/// (bilinear), then [`Normalize`].
#[derive(Debug, Clone, PartialEq)]
pub struct ResizeNormalize {
    pub height: u32,
    pub width: u32,
    pub normalize: Normalize,
}

impl ResizeNormalize {
    /// From a preprocessor_config.json: `size.height`/`size.width` and [`Normalize`]'s fields;
    /// an error names a missing or malformed field.
    pub fn from_config(config: &Value) -> Result<Self, String> {
        let side = |key: &str| -> Result<u32, String> {
            let v = number(&config["size"][key], &format!("size.{key}"))?;
            (v >= 1.0)
                .then_some(v as u32)
                .ok_or_else(|| format!("`size.{key}` must be positive"))
        };
        Ok(ResizeNormalize {
            height: side("height")?,
            width: side("width")?,
            normalize: Normalize::from_config(config)?,
        })
    }

    /// `image`'s pixel values, channel by channel (`3 x height x width`, row-major).
    pub fn pixel_values(&self, image: &Image) -> Vec<f32> {
        let size = (self.height, self.width);
        self.normalize
            .planes(&resize(&rgb(image), size, Filter::Bilinear))
    }
}
