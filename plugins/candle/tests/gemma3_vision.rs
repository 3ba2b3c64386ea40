//! Gemma 3's vision side against Transformers 5.25 on a tiny random-weight
//! `Gemma3ForConditionalGeneration` (`tests/data/tiny-gemma3-vlm`, written with its reference
//! outputs by `scripts/vlm-reference.py`): the image processor's pixel values, and the image
//! features the tower and projector make of them.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use lmhost_candle::models::gemma3::vision::{var_builder, Gemma3Vision, VisionConfig};
use lmhost_plugin_kit::multimodal::ResizeNormalize;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tiny-gemma3-vlm")
}

fn reference(name: &str) -> Tensor {
    let tensors = candle_core::safetensors::load(dir().join("reference.safetensors"), &Device::Cpu);
    tensors
        .unwrap()
        .remove(name)
        .unwrap_or_else(|| panic!("{name}"))
}

fn vision() -> Gemma3Vision {
    let config = std::fs::read_to_string(dir().join("config.json")).unwrap();
    let config: VisionConfig = serde_json::from_str(&config).unwrap();
    let vb = var_builder(&[dir().join("model.safetensors")]).unwrap();
    Gemma3Vision::load(&config, vb).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

const IMAGES: [&str; 3] = ["noise", "gradient", "flat"];

/// Fed Transformers' own pixel values, the features agree to f32 rounding: both compute the
/// same f32 operations (a convolution, two encoder layers, pooling, a norm, a product) in
/// other orders, which moves the last bits, not more.
#[test]
fn image_features_match_transformers_on_its_pixel_values() {
    let vision = vision();
    for name in IMAGES {
        let pixels = reference(&format!("{name}.pixel_values"))
            .unsqueeze(0)
            .unwrap();
        let ours = vision.image_features(&pixels).unwrap().squeeze(0).unwrap();
        let theirs = reference(&format!("{name}.features"));
        assert_eq!(ours.dims(), theirs.dims(), "{name}");
        let diff = max_diff(&ours, &theirs);
        assert!(diff < 1e-4, "{name}: {diff}");
        eprintln!("{name}: features within {diff}");
    }
}

/// Our pixel values against the processor's: PIL's bilinear resize there, the `image` crate's
/// triangle filter here (the same filter, rounded to bytes in other steps). Measured: every
/// value within one byte step (2/255 = 0.0078 after normalizing to [-1, 1]) on all three images,
/// and the features, of mean magnitude 2, within 0.025 (noise), 0.019 (gradient) and 0.0004
/// (flat colours) end to end. The bounds, two byte steps and 0.1, hold on any machine: both
/// resizers are integer or f32 code that does not depend on the CPU's vector width.
#[test]
fn pixel_values_come_close_to_the_image_processors() {
    let config = std::fs::read_to_string(dir().join("preprocessor_config.json")).unwrap();
    let resize = ResizeNormalize::from_config(&serde_json::from_str(&config).unwrap()).unwrap();
    let vision = vision();
    for name in IMAGES {
        let path = dir().join(format!("{name}.png"));
        let image = lmhost::images::read(&path, name).unwrap();
        let size = (resize.height as usize, resize.width as usize);
        let ours = Tensor::from_vec(
            resize.pixel_values(&image),
            (3, size.0, size.1),
            &Device::Cpu,
        );
        let ours = ours.unwrap();
        let theirs = reference(&format!("{name}.pixel_values"));
        let pixels = max_diff(&ours, &theirs);
        assert!(
            pixels <= 2.0 * 2.0 / 255.0,
            "{name}: pixels differ by {pixels}"
        );
        let features = vision.image_features(&ours.unsqueeze(0).unwrap()).unwrap();
        let features = max_diff(
            &features.squeeze(0).unwrap(),
            &reference(&format!("{name}.features")),
        );
        assert!(features <= 0.1, "{name}: features differ by {features}");
        eprintln!("{name}: pixel values within {pixels}, features within {features}");
    }
}
