//! Pillow's resampling of 8-bit images (`Resample.c`), step for step: Transformers' image
//! processors resize with PIL, and a resize that rounds in other places (the `image` crate
//! keeps the first pass in f32 where Pillow clips it to bytes) moves sharp images' pixels by
//! many byte steps under Lanczos' ringing. Two separable passes, each with fixed-point weights of
//! [`PRECISION_BITS`] and its result clipped to bytes, in Pillow 13's order (Pillow 12 and
//! earlier always ran the horizontal pass first, which moves a byte here and there where the
//! height shrinks most: the tests pin the version they were computed with).

use image::RgbImage;

/// Pillow's resampling filters the processors here use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// `PIL.Image.BILINEAR` (a triangle of support 1).
    Bilinear,
    /// `PIL.Image.LANCZOS` (a 3-lobed windowed sinc).
    Lanczos,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
            Filter::Lanczos if (-3.0..3.0).contains(&x) => sinc(x) * sinc(x / 3.0),
            Filter::Lanczos => 0.0,
        }
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

/// Pillow's fixed-point precision for 8-bit images: `32 - 8 - 2` bits.
const PRECISION_BITS: u32 = 22;

/// Each output position's first input position and integer weights.
struct Coeffs {
    taps: Vec<(usize, Vec<i64>)>,
}

impl Coeffs {
    /// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc` for `input` positions to
    /// `output`.
    fn new(input: u32, output: u32, filter: Filter) -> Coeffs {
        let scale = f64::from(input) / f64::from(output);
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ss = 1.0 / filterscale;
        let taps = (0..output)
            .map(|xx| {
                let center = (f64::from(xx) + 0.5) * scale;
                let xmin = ((center - support + 0.5) as i64).max(0) as usize;
                let xmax = ((center + support + 0.5) as i64).min(i64::from(input)) as usize;
                let weights: Vec<f64> = (xmin..xmax.max(xmin))
                    .map(|x| filter.weight((x as f64 - center + 0.5) * ss))
                    .collect();
                let total: f64 = weights.iter().sum();
                let fixed = weights
                    .iter()
                    .map(|&w| {
                        let w = if total != 0.0 { w / total } else { w };
                        let w = w * f64::from(1u32 << PRECISION_BITS);
                        (if w < 0.0 { w - 0.5 } else { w + 0.5 }) as i64
                    })
                    .collect();
                (xmin, fixed)
            })
            .collect();
        Coeffs { taps }
    }
}

/// A weighted sum in Pillow's fixed point, rounded and clipped to a byte.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `image` resized to `(height, width)` as Pillow's `Image.resize` does it with `filter`; as it
/// is where the size is already that (Pillow returns a copy then).
pub fn resize(image: &RgbImage, (height, width): (u32, u32), filter: Filter) -> RgbImage {
    let shrink = |from: u32, to: u32| i64::from(from) - i64::from(to);
    let (down, across) = (shrink(image.height(), height), shrink(image.width(), width));
    // Pillow runs the vertical pass first where the height shrinks more than twice the width.
    let vertical_first = down > 0 && down > across * 2;
    let mut out = image.clone();
    if vertical_first && height != out.height() {
        out = vertical(&out, height, filter);
    }
    if width != out.width() {
        out = horizontal(&out, width, filter);
    }
    if height != out.height() {
        out = vertical(&out, height, filter);
    }
    out
}

const HALF: i64 = 1 << (PRECISION_BITS - 1);

fn horizontal(image: &RgbImage, width: u32, filter: Filter) -> RgbImage {
    pass(image, width, filter, true)
}

fn vertical(image: &RgbImage, height: u32, filter: Filter) -> RgbImage {
    pass(image, height, filter, false)
}

/// One pass along the rows (`across`) or the columns to `size` pixels, each output pixel the
/// weighted sum of its taps.
fn pass(image: &RgbImage, size: u32, filter: Filter, across: bool) -> RgbImage {
    let (w, h) = image.dimensions();
    let coeffs = Coeffs::new(if across { w } else { h }, size, filter);
    let (out_w, out_h) = if across { (size, h) } else { (w, size) };
    RgbImage::from_fn(out_w, out_h, |x, y| {
        let (at, line) = if across { (x, y) } else { (y, x) };
        let (start, weights) = &coeffs.taps[at as usize];
        let mut sums = [HALF; 3];
        for (i, &weight) in weights.iter().enumerate() {
            let tap = (start + i) as u32;
            let pixel = match across {
                true => image.get_pixel(tap, line),
                false => image.get_pixel(line, tap),
            };
            for (sum, &v) in sums.iter_mut().zip(&pixel.0) {
                *sum += i64::from(v) * weight;
            }
        }
        image::Rgb(sums.map(clip8))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights sum to one (in fixed point, within rounding) and a same-size resize is the
    /// image itself.
    #[test]
    fn weights_are_normalized_and_identity_is_kept() {
        for filter in [Filter::Bilinear, Filter::Lanczos] {
            for (input, output) in [(80, 64), (28, 32), (64, 32), (5, 17)] {
                for (_, w) in Coeffs::new(input, output, filter).taps {
                    let sum: i64 = w.iter().sum();
                    assert!(
                        (sum - (1 << PRECISION_BITS)).abs() <= w.len() as i64,
                        "{sum}"
                    );
                }
            }
        }
        let image = RgbImage::from_fn(7, 5, |x, y| image::Rgb([x as u8 * 30, y as u8 * 50, 9]));
        assert_eq!(resize(&image, (5, 7), Filter::Lanczos), image);
    }
}
