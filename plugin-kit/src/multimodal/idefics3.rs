//! Idefics3's processor (SmolVLM's): images cut into tiles, each tile's placeholders behind its
//! row and column marker, and the tiles' pixel values.

use image::imageops;
use lmhost_plugin_api::Image;

use super::pixels::{rgb, Normalize};
use super::resample::{resize, Filter};
use super::{grid_cells, token_id, ImageTokens, Modality, Processor};

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

    /// The side of a tile, in pixels.
    pub fn tile_size(&self) -> u32 {
        self.max_image_size
    }

    /// The placeholders of one tile.
    pub fn image_seq_len(&self) -> usize {
        self.image_seq_len
    }

    /// The image's size, `(height, width)`, once scaled as the image processor scales it:
    /// [`Self::resized_size`], then each side up to a whole number of tiles.
    pub fn scaled_size(&self, size: (u32, u32)) -> (u32, u32) {
        self.tiled_size(self.resized_size(size))
    }

    /// The image processor's first resize: the longest side to `longest_edge` (the other kept
    /// in proportion, rounded up to even), within [`Self::MAX_SIDE`].
    fn resized_size(&self, (height, width): (u32, u32)) -> (u32, u32) {
        let (h, w) = (f64::from(height.max(1)), f64::from(width.max(1)));
        let even = |v: u32| v + v % 2;
        let (h, w) = if w >= h {
            let h = even((f64::from(self.longest_edge) / (w / h)) as u32);
            (h.max(1), self.longest_edge)
        } else {
            let w = even((f64::from(self.longest_edge) * (w / h)) as u32);
            (self.longest_edge, w.max(1))
        };
        below(h, w, Self::MAX_SIDE)
    }

    /// The second resize, for the vision encoder: the longer side up to a whole number of
    /// tiles, the other in proportion and up to a whole number of tiles too.
    fn tiled_size(&self, (h, w): (u32, u32)) -> (u32, u32) {
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

    /// The pixel values of `image`'s views, `(views, 3, max_image_size, max_image_size)`
    /// flattened, and the number of views: its tiles row by row, then the whole image scaled
    /// to one tile (a single view where it fits one tile). Resized twice (Lanczos, as the
    /// image processor does with PIL) before it is cut; the image processor's `do_*` switches are
    /// taken at their defaults, as every Idefics3 and SmolVLM checkpoint sets them.
    pub fn pixel_values(&self, image: &Image, normalize: &Normalize) -> (Vec<f32>, usize) {
        let lanczos = Filter::Lanczos;
        let size = self.resized_size((image.height, image.width));
        let first = resize(&rgb(image), size, lanczos);
        let (h, w) = self.tiled_size(size);
        let whole = resize(&first, (h, w), lanczos);
        let tile = self.max_image_size;
        let mut views = Vec::new();
        if h > tile || w > tile {
            for r in 0..h / tile {
                for c in 0..w / tile {
                    let view = imageops::crop_imm(&whole, c * tile, r * tile, tile, tile);
                    views.push(view.to_image());
                }
            }
            views.push(resize(&whole, (tile, tile), lanczos));
        } else {
            views.push(whole);
        }
        let count = views.len();
        (
            views.iter().flat_map(|v| normalize.planes(v)).collect(),
            count,
        )
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

    /// Each tile's placeholders are the pixel-shuffled patch grid of its part of the image,
    /// row by row (the image is resized along each axis alone, so a tile's fraction of the
    /// resized image is its fraction of the original); then the global view's, over the
    /// whole image.
    fn placeholder_cells(&self, size: (u32, u32)) -> Vec<[f64; 4]> {
        let side = (self.image_seq_len as f64).sqrt() as usize;
        let (rows, cols) = self.grid(size);
        let mut cells = Vec::new();
        for r in 0..rows {
            for c in 0..cols {
                let (r, c, rows, cols) =
                    (f64::from(r), f64::from(c), f64::from(rows), f64::from(cols));
                let tile = [c / cols, r / rows, (c + 1.0) / cols, (r + 1.0) / rows];
                cells.extend(grid_cells(side, tile));
            }
        }
        cells.extend(grid_cells(side, [0.0, 0.0, 1.0, 1.0]));
        cells
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
