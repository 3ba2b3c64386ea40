//! Gemma 3's processor: a fixed number of soft tokens per image.

use super::{grid_cells, token_id, ImageTokens, Modality, Processor};

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

    /// The soft tokens are a square average pool of the patch grid of the whole image (resized
    /// to a square without keeping its aspect), row by row.
    fn placeholder_cells(&self, _size: (u32, u32)) -> Vec<[f64; 4]> {
        let side = (self.tokens_per_image as f64).sqrt() as usize;
        grid_cells(side, [0.0, 0.0, 1.0, 1.0])
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
