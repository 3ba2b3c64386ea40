//! The multimodal processor contract, as the design document states it: a processor exposes
//! the placeholder token that the model replaces with image features (`image_token` and its
//! id), says how many placeholders an image of a given size needs (row, column, start and end
//! markers not counted) and into how many patches it is cut, and marks each prompt position's
//! modality, where an image's markers count as image so that each image is one contiguous run.
//!
//! Transformers' processors agree on the placeholders and their counts; they differ on the
//! markers: Gemma 3's marks only its 256 soft tokens as image and leaves `<start_of_image>` and
//! `<end_of_image>` at text, Idefics3's marks the whole run as this contract does.

use std::sync::Arc;

pub use lmhost_plugin_api::ImageTokens;
use lmhost_plugin_api::{Image, PluginError};

/// Prompt ids from here up stand for image features, not tokens: a vision-language backend
/// gives each image's placeholders ids of their own ([`ImageIds`]), so that the prefix cache,
/// which keys on ids, tells two images apart and finds the same image again.
pub const FIRST_IMAGE_ID: u32 = 1 << 31;

/// What a vision-language backend makes of a prompt's images.
pub trait ImageIds: Send + Sync {
    /// The first of the `count` consecutive ids (from [`FIRST_IMAGE_ID`] up) standing for
    /// `image`'s placeholders, in order; the same image gets the same ids again.
    fn ids_of(&self, image: &Image, count: usize) -> Result<u32, PluginError>;

    /// How many images have been turned into features so far (each distinct image once,
    /// while it is kept).
    fn encoded(&self) -> usize;
}

/// A text front end's eyes: the model's processor and its image ids.
#[derive(Clone)]
pub struct Vision {
    pub processor: Arc<dyn Processor>,
    pub ids: Arc<dyn ImageIds>,
}

/// The runs of image ids in `ids`, as ranges of positions from `offset`: one run per image (an
/// image's ids are consecutive, and every processor here writes markers between two images,
/// so two images' runs never touch).
pub fn image_runs(ids: &[u32], offset: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        if id < FIRST_IMAGE_ID {
            continue;
        }
        let continues = i > 0 && ids[i - 1] >= FIRST_IMAGE_ID && ids[i - 1].wrapping_add(1) == id;
        match runs.last_mut() {
            Some(run) if continues => run.end = offset + i + 1,
            _ => runs.push(offset + i..offset + i + 1),
        }
    }
    runs
}

/// What a prompt position holds: the values of Transformers' `mm_token_type_ids`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Modality {
    Text = 0,
    Image = 1,
    /// Reserved: no processor here takes video.
    Video = 2,
}

/// A vision-language model's processor, as far as the prompt is concerned.
pub trait Processor: Send + Sync {
    /// The placeholder token the model replaces with image features.
    fn image_token(&self) -> &str;

    fn image_token_id(&self) -> u32;

    /// What a chat template writes where an image goes, which [`Processor::image_text`]
    /// replaces (Gemma 3: `<start_of_image>`; Idefics3: `<image>`).
    fn image_marker(&self) -> &str;

    /// For each image size `(height, width)`, its placeholders and patches.
    fn num_multimodal_tokens(&self, image_sizes: &[(u32, u32)]) -> Vec<ImageTokens> {
        image_sizes
            .iter()
            .map(|&size| self.image_tokens(size))
            .collect()
    }

    /// One image's placeholders and patches.
    fn image_tokens(&self, size: (u32, u32)) -> ImageTokens;

    /// The text an image of `size` (height, width) stands for in a prompt: its markers and
    /// placeholders, as the model was trained to see them.
    fn image_text(&self, size: (u32, u32)) -> String;

    /// The modality of each of `ids`: an image's markers and placeholders are image.
    fn modalities(&self, ids: &[u32]) -> Vec<Modality>;
}

/// The id of a token the processor needs, or an error naming it.
pub fn token_id(vocab: impl Fn(&str) -> Option<u32>, token: &str) -> Result<u32, String> {
    vocab(token).ok_or_else(|| {
        format!("the tokenizer has no `{token}` token, which the model's processor needs")
    })
}

/// Gemma 3's processor: every image is 256 soft tokens (a 4x4 average pool of SigLIP's 64x64
/// patches) between `<start_of_image>` and `<end_of_image>`, with a blank line either side.
pub struct Gemma3Processor {
    start: u32,
    soft: u32,
    end: u32,
    tokens_per_image: usize,
}

impl Gemma3Processor {
    pub const START: &'static str = "<start_of_image>";
    pub const SOFT: &'static str = "<image_soft_token>";
    pub const END: &'static str = "<end_of_image>";

    /// `tokens_per_image` is config.json's `mm_tokens_per_image`; `vocab` looks a token up.
    pub fn new(
        tokens_per_image: usize,
        vocab: impl Fn(&str) -> Option<u32>,
    ) -> Result<Self, String> {
        Ok(Gemma3Processor {
            start: token_id(&vocab, Self::START)?,
            soft: token_id(&vocab, Self::SOFT)?,
            end: token_id(&vocab, Self::END)?,
            tokens_per_image,
        })
    }
}

impl Processor for Gemma3Processor {
    fn image_token(&self) -> &str {
        Self::SOFT
    }

    fn image_token_id(&self) -> u32 {
        self.soft
    }

    fn image_marker(&self) -> &str {
        Self::START
    }

    /// Pan-and-scan crops are not made (Transformers' default): one view of each image.
    fn image_tokens(&self, _size: (u32, u32)) -> ImageTokens {
        ImageTokens {
            tokens: self.tokens_per_image as u32,
            patches: 1,
        }
    }

    fn image_text(&self, _size: (u32, u32)) -> String {
        let soft = Self::SOFT.repeat(self.tokens_per_image);
        format!("\n\n{}{soft}{}\n\n", Self::START, Self::END)
    }

    fn modalities(&self, ids: &[u32]) -> Vec<Modality> {
        let mut inside = false;
        ids.iter()
            .map(|&id| {
                let image = inside || id == self.start || id == self.soft;
                inside = (inside || id == self.start) && id != self.end;
                if image || id == self.end {
                    Modality::Image
                } else {
                    Modality::Text
                }
            })
            .collect()
    }
}

/// Idefics3's processor (SmolVLM's too): the image is scaled so that its longest side is
/// `longest_edge`, cut into tiles of `max_image_size` (row by row, each tile
/// `<fake_token_around_image><row_r_col_c>` and `image_seq_len` placeholders, a newline after
/// each row), and followed by the whole image scaled to one tile
/// (`<fake_token_around_image><global-img>`, its placeholders, `<fake_token_around_image>`).
pub struct Idefics3Processor {
    longest_edge: u32,
    max_image_size: u32,
    image_seq_len: usize,
    image: u32,
    fake: u32,
    global: u32,
}

impl Idefics3Processor {
    pub const IMAGE: &'static str = "<image>";
    pub const FAKE: &'static str = "<fake_token_around_image>";
    pub const GLOBAL: &'static str = "<global-img>";
    /// Transformers' bound on either side of the scaled image.
    const MAX_SIDE: u32 = 4096;

    /// From preprocessor_config.json's `size.longest_edge` and `max_image_size.longest_edge`
    /// and processor_config.json's `image_seq_len`; `vocab` looks a token up.
    pub fn new(
        (longest_edge, max_image_size): (u32, u32),
        image_seq_len: usize,
        vocab: impl Fn(&str) -> Option<u32>,
    ) -> Result<Self, String> {
        if max_image_size == 0 || longest_edge == 0 {
            return Err(format!(
                "size.longest_edge {longest_edge} and max_image_size.longest_edge \
                 {max_image_size} must be positive"
            ));
        }
        Ok(Idefics3Processor {
            longest_edge,
            max_image_size,
            image_seq_len,
            image: token_id(&vocab, Self::IMAGE)?,
            fake: token_id(&vocab, Self::FAKE)?,
            global: token_id(&vocab, Self::GLOBAL)?,
        })
    }

    /// The image's size, `(height, width)`, once scaled as the image processor scales it:
    /// the longest side to `longest_edge` (the other kept in proportion, rounded up to even),
    /// within [`Self::MAX_SIDE`], then each side up to a whole number of tiles.
    pub fn scaled_size(&self, (height, width): (u32, u32)) -> (u32, u32) {
        let (h, w) = (f64::from(height.max(1)), f64::from(width.max(1)));
        let even = |v: u32| v + v % 2;
        let (h, w) = if w >= h {
            let h = even((f64::from(self.longest_edge) / (w / h)) as u32);
            (h.max(1), self.longest_edge)
        } else {
            let w = even((f64::from(self.longest_edge) * (w / h)) as u32);
            (self.longest_edge, w.max(1))
        };
        let (h, w) = below(h, w, Self::MAX_SIDE);
        let tile = self.max_image_size;
        let up = |v: u32| v.div_ceil(tile) * tile;
        let aspect = f64::from(w) / f64::from(h);
        if w >= h {
            let w = up(w);
            (up((f64::from(w) / aspect) as u32), w)
        } else {
            let h = up(h);
            (h, up((f64::from(h) * aspect) as u32))
        }
    }

    /// The tile rows and columns of an image of `size`, (0, 0) where it fits one tile.
    pub fn grid(&self, size: (u32, u32)) -> (u32, u32) {
        let (h, w) = self.scaled_size(size);
        let tile = self.max_image_size;
        if h > tile || w > tile {
            ((h - tile) / tile + 1, (w - tile) / tile + 1)
        } else {
            (0, 0)
        }
    }
}

/// `(height, width)` scaled down, in proportion, so that neither side exceeds `max`.
fn below(h: u32, w: u32, max: u32) -> (u32, u32) {
    let aspect = f64::from(w) / f64::from(h);
    let (h, w) = if w >= h && w > max {
        ((f64::from(max) / aspect) as u32, max)
    } else if h > w && h > max {
        (max, (f64::from(max) * aspect) as u32)
    } else {
        (h, w)
    };
    (h.max(1), w.max(1))
}

impl Processor for Idefics3Processor {
    fn image_token(&self) -> &str {
        Self::IMAGE
    }

    fn image_token_id(&self) -> u32 {
        self.image
    }

    fn image_marker(&self) -> &str {
        Self::IMAGE
    }

    fn image_tokens(&self, size: (u32, u32)) -> ImageTokens {
        let (rows, cols) = self.grid(size);
        let patches = rows * cols + 1;
        ImageTokens {
            tokens: patches * self.image_seq_len as u32,
            patches,
        }
    }

    fn image_text(&self, size: (u32, u32)) -> String {
        let placeholders = Self::IMAGE.repeat(self.image_seq_len);
        let global = format!("{}{}{placeholders}{}", Self::FAKE, Self::GLOBAL, Self::FAKE);
        let (rows, cols) = self.grid(size);
        if rows == 0 {
            return global;
        }
        let mut text = String::new();
        for r in 1..=rows {
            for c in 1..=cols {
                text += &format!("{}<row_{r}_col_{c}>{placeholders}", Self::FAKE);
            }
            text.push('\n');
        }
        text + "\n" + &global
    }

    /// From an image's first `<fake_token_around_image>` to the one that closes its global
    /// view, the newlines between rows included.
    fn modalities(&self, ids: &[u32]) -> Vec<Modality> {
        let (mut inside, mut global) = (false, false);
        ids.iter()
            .map(|&id| {
                if !inside {
                    inside = id == self.fake;
                    return if inside {
                        Modality::Image
                    } else {
                        Modality::Text
                    };
                }
                if id == self.global {
                    global = true;
                } else if id == self.fake && global {
                    (inside, global) = (false, false);
                }
                Modality::Image
            })
            .collect()
    }
}

/// A fixed-size image processor's steps (Gemma 3's, SigLIP's): resize to `height x width`
/// (bilinear), scale each byte by `rescale` (1/255), normalize each channel by `mean` and
/// `std`. Resampling is the `image` crate's triangle filter where Transformers uses PIL's
/// bilinear one: the same filter, rounded differently (see the candle tests for how close).
#[derive(Debug, Clone, PartialEq)]
pub struct ResizeNormalize {
    pub height: u32,
    pub width: u32,
    pub rescale: f32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl ResizeNormalize {
    /// From a preprocessor_config.json: `size.height`/`size.width`, `rescale_factor`,
    /// `image_mean`, `image_std`; an error names a missing or malformed field.
    pub fn from_config(config: &serde_json::Value) -> Result<Self, String> {
        let number = |v: &serde_json::Value, key: &str| {
            v.as_f64()
                .ok_or_else(|| format!("preprocessor_config.json: `{key}` must be a number"))
        };
        let triple = |key: &str| -> Result<[f32; 3], String> {
            let values = config[key]
                .as_array()
                .filter(|a| a.len() == 3)
                .ok_or_else(|| {
                    format!("preprocessor_config.json: `{key}` must be a list of 3 numbers")
                })?;
            let mut out = [0f32; 3];
            for (o, v) in out.iter_mut().zip(values) {
                *o = number(v, key)? as f32;
            }
            Ok(out)
        };
        let side = |key: &str| -> Result<u32, String> {
            let v = number(&config["size"][key], &format!("size.{key}"))?;
            (v >= 1.0)
                .then_some(v as u32)
                .ok_or_else(|| format!("preprocessor_config.json: `size.{key}` must be positive"))
        };
        let std = triple("image_std")?;
        if std.contains(&0.0) {
            return Err("preprocessor_config.json: `image_std` must not hold 0".into());
        }
        Ok(ResizeNormalize {
            height: side("height")?,
            width: side("width")?,
            rescale: number(&config["rescale_factor"], "rescale_factor")? as f32,
            mean: triple("image_mean")?,
            std,
        })
    }

    /// `image`'s pixel values, channel by channel (`3 x height x width`, row-major).
    pub fn pixel_values(&self, image: &Image) -> Vec<f32> {
        let (w, h) = (image.width, image.height);
        let source = image::RgbImage::from_raw(w, h, image.rgb.to_vec())
            .expect("an Image holds width x height RGB pixels");
        let resized = image::imageops::resize(
            &source,
            self.width,
            self.height,
            image::imageops::FilterType::Triangle,
        );
        let plane = (self.height * self.width) as usize;
        let mut values = vec![0f32; 3 * plane];
        for (i, pixel) in resized.pixels().enumerate() {
            for c in 0..3 {
                let v = f32::from(pixel.0[c]) * self.rescale;
                values[c * plane + i] = (v - self.mean[c]) / self.std[c];
            }
        }
        values
    }
}
