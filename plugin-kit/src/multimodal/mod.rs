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

mod gemma3;
mod idefics3;
mod pixels;
pub mod resample;

pub use gemma3::Gemma3Processor;
pub use idefics3::Idefics3Processor;
pub use pixels::{Normalize, ResizeNormalize};

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

/// The runs of image ids in `ids`, as ranges of positions from `offset`: one run per image, or
/// per tile where the processor writes markers between an image's tiles (an image's ids are
/// consecutive, and every processor here writes markers between two images, so two images'
/// runs never touch).
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

    /// For an image of `size` (height, width), the part of it each placeholder stands for, in
    /// order: `[x0, y0, x1, y1]` as fractions of its width and height. What hiding an image
    /// region from attention hides: the placeholders whose cells overlap it.
    fn placeholder_cells(&self, size: (u32, u32)) -> Vec<[f64; 4]>;
}

/// The cells of a `side x side` grid laid over `within` (`[x0, y0, x1, y1]` fractions), row by
/// row: where the placeholders of a square feature map lie.
pub fn grid_cells(side: usize, within: [f64; 4]) -> Vec<[f64; 4]> {
    let [x0, y0, x1, y1] = within;
    let (w, h) = ((x1 - x0) / side as f64, (y1 - y0) / side as f64);
    (0..side * side)
        .map(|k| {
            let (r, c) = ((k / side) as f64, (k % side) as f64);
            [
                x0 + c * w,
                y0 + r * h,
                x0 + (c + 1.0) * w,
                y0 + (r + 1.0) * h,
            ]
        })
        .collect()
}

/// The id of a token the processor needs, or an error naming it.
pub fn token_id(vocab: impl Fn(&str) -> Option<u32>, token: &str) -> Result<u32, String> {
    vocab(token).ok_or_else(|| {
        format!("the tokenizer has no `{token}` token, which the model's processor needs")
    })
}
