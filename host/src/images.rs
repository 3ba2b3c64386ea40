//! Images for conversations and chat requests: PNG, JPEG, WebP or GIF (its first frame) bytes,
//! decoded by the `image` crate into the upright RGB8 pixels a backend takes (a JPEG's EXIF
//! orientation applied, transparency dropped). The host does not resize: each model's
//! processor does, as its Transformers counterpart does.

use std::io::Cursor;
use std::path::Path;

use base64::Engine as _;
use image::{DynamicImage, ImageDecoder, ImageReader, Limits};
use lmhost_plugin_api::Image;

use crate::error::{Error, Result};

/// The most pixels an image may have, whatever the model: 40 megapixels (a 120 MB RGB copy),
/// beyond a photo from any phone camera.
pub const MAX_PIXELS: u64 = 40_000_000;

/// The formats read, for errors.
const FORMATS: &str = "PNG, JPEG, WebP or GIF";

fn bad(source: &Path, what: &str, message: impl std::fmt::Display) -> Error {
    Error::Image {
        path: source.to_path_buf(),
        message: format!("{what}: {message}"),
    }
}

/// The image file at `path`; `what` names the part in errors.
pub fn read(path: &Path, what: &str) -> Result<Image> {
    let bytes = std::fs::read(path).map_err(|e| bad(path, what, format!("cannot read: {e}")))?;
    decode(&bytes, path, what)
}

/// Base64 of an image file's bytes; `source` and `what` name it in errors.
pub fn decode_base64(data: &str, source: &Path, what: &str) -> Result<Image> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(source, what, format!("not valid base64 ({e})")))?;
    decode(&bytes, source, what)
}

/// An image file's bytes, decoded; `source` and `what` name it in errors.
pub fn decode(bytes: &[u8], source: &Path, what: &str) -> Result<Image> {
    let fail = |message: String| bad(source, what, message);
    if bytes.is_empty() {
        return Err(fail(format!("no bytes; expected a {FORMATS} image")));
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| fail(e.to_string()))?;
    let Some(format) = reader.format() else {
        return Err(fail(format!(
            "not an image this host reads; expected {FORMATS}"
        )));
    };
    let mut decoder = reader.into_decoder().map_err(|e| {
        fail(format!(
            "cannot decode as {format:?} ({e}); expected a whole {FORMATS} image"
        ))
    })?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels == 0 {
        return Err(fail(format!(
            "the image is {width}x{height} pixels; it is empty"
        )));
    }
    if pixels > MAX_PIXELS {
        return Err(fail(format!(
            "the image is {width}x{height} pixels ({:.1} MP); at most {} MP are accepted",
            pixels as f64 / 1e6,
            MAX_PIXELS / 1_000_000
        )));
    }
    let mut limits = Limits::default();
    limits.max_alloc = Some(16 * MAX_PIXELS);
    decoder
        .set_limits(limits)
        .map_err(|e| fail(e.to_string()))?;
    let orientation = decoder.orientation().map_err(|e| fail(e.to_string()))?;
    let mut image = DynamicImage::from_decoder(decoder).map_err(|e| {
        fail(format!(
            "cannot decode as {format:?} ({e}); the file may be truncated or corrupt"
        ))
    })?;
    image.apply_orientation(orientation);
    let rgb = image.into_rgb8();
    let (width, height) = rgb.dimensions();
    Image::new(width, height, rgb.into_raw()).map_err(|e| fail(e.message.into_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `image` as a file of `format`, written by the `image` crate.
    fn encoded(image: &DynamicImage, format: image::ImageFormat) -> Vec<u8> {
        let mut bytes = Cursor::new(Vec::new());
        image.write_to(&mut bytes, format).unwrap();
        bytes.into_inner()
    }

    /// A 3x2 image whose every pixel differs, so any flip or transposition shows.
    fn sample() -> DynamicImage {
        let pixels: Vec<u8> = (0..3 * 2 * 3).map(|i| (i * 13) as u8).collect();
        DynamicImage::ImageRgb8(image::RgbImage::from_raw(3, 2, pixels).unwrap())
    }

    fn decoded(bytes: &[u8]) -> Result<Image> {
        decode(bytes, Path::new("c.json"), "message 1, part 1")
    }

    #[test]
    fn lossless_formats_come_back_pixel_for_pixel() {
        let image = sample();
        for format in [image::ImageFormat::Png, image::ImageFormat::WebP] {
            let got = decoded(&encoded(&image, format)).unwrap();
            assert_eq!((got.width, got.height), (3, 2), "{format:?}");
            assert_eq!(got.rgb.as_slice(), image.as_bytes(), "{format:?}");
        }
        let gif = decoded(&encoded(&image, image::ImageFormat::Gif)).unwrap();
        assert_eq!((gif.width, gif.height), (3, 2));
    }

    #[test]
    fn transparency_is_dropped_and_jpeg_decodes() {
        let rgba = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(
            4,
            4,
            image::Rgba([10, 20, 30, 0]),
        ));
        let got = decoded(&encoded(&rgba, image::ImageFormat::Png)).unwrap();
        assert_eq!(&got.rgb[..3], &[10, 20, 30]);
        let jpeg = decoded(&encoded(&sample(), image::ImageFormat::Jpeg)).unwrap();
        assert_eq!((jpeg.width, jpeg.height, jpeg.rgb.len()), (3, 2, 18));
    }

    /// A JPEG whose EXIF says "rotate 90° clockwise to view" comes back upright: its stored
    /// 3x2 pixels become 2x3, the stored bottom-left pixel first.
    #[test]
    fn exif_orientation_is_applied() {
        let stored = sample();
        let jpeg = encoded(&stored, image::ImageFormat::Jpeg);
        let plain = decoded(&jpeg).unwrap();
        // An APP1 segment after SOI: "Exif\0\0", a big-endian TIFF header, one IFD entry
        // (tag 0x0112 Orientation, SHORT, count 1, value 6: rotate 90° clockwise).
        let mut exif = b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01".to_vec();
        exif.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0]);
        let mut rotated = jpeg[..2].to_vec();
        rotated.extend_from_slice(&[0xFF, 0xE1]);
        rotated.extend_from_slice(&((exif.len() + 2) as u16).to_be_bytes());
        rotated.extend_from_slice(&exif);
        rotated.extend_from_slice(&jpeg[2..]);
        let got = decoded(&rotated).unwrap();
        assert_eq!((got.width, got.height), (2, 3));
        // Rotating clockwise puts the stored bottom-left pixel at the top left.
        assert_eq!(&got.rgb[..3], &plain.rgb[3 * 3..3 * 3 + 3]);
    }

    #[test]
    fn bad_bytes_are_errors_naming_the_part_and_the_formats() {
        let png = encoded(&sample(), image::ImageFormat::Png);
        let cases: [(&[u8], &str); 3] = [
            (b"", "no bytes"),
            (b"hello, world", "PNG, JPEG, WebP or GIF"),
            (&png[..png.len() / 2], "truncated or corrupt"),
        ];
        for (bytes, expected) in cases {
            let err = decoded(bytes).unwrap_err().to_string();
            assert!(err.starts_with("c.json: message 1, part 1: "), "{err}");
            assert!(err.contains(expected), "{expected}: {err}");
        }
        let err = decode_base64("not base64!", Path::new("c.json"), "part").unwrap_err();
        assert!(err.to_string().contains("not valid base64"), "{err}");
    }

    #[test]
    fn an_oversized_image_is_refused_before_it_is_decoded() {
        // A PNG header claiming 10000x10000 pixels, with no pixel data: refused by size, not
        // by the missing data.
        let mut png = encoded(&sample(), image::ImageFormat::Png);
        png[16..20].copy_from_slice(&10_000u32.to_be_bytes());
        png[20..24].copy_from_slice(&10_000u32.to_be_bytes());
        let crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        let err = decoded(&png).unwrap_err().to_string();
        assert!(
            err.contains("10000x10000") && err.contains("at most 40 MP"),
            "{err}"
        );
    }

    /// The CRC-32 a PNG chunk carries over its type and data.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in bytes {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
            }
        }
        !crc
    }
}
