//! Gemma 3 with images against Transformers 5.25 on a tiny random-weight
//! `Gemma3ForConditionalGeneration` (`tests/data/tiny-gemma3-vlm`, written with its reference
//! outputs by `scripts/vlm-reference.py`): the image processor's pixel values, the image
//! features the tower and projector make of them, and through the backend the scores of a
//! reply after chats with no image, one and two.

use candle_core::{Device, Tensor};
use lmhost_candle::models::gemma3::vision::{Gemma3Vision, VisionConfig};
use lmhost_candle::models::vision::var_builder;
use lmhost_plugin_api::Backend;
use lmhost_plugin_kit::multimodal::ResizeNormalize;

mod common;

use common::vlm::{tensor_diff, Vlm};

fn fixture() -> Vlm {
    Vlm::new("tiny-gemma3-vlm", ["gradient", "flat"])
}

fn resize(vlm: &Vlm) -> ResizeNormalize {
    let config = std::fs::read_to_string(vlm.dir.join("preprocessor_config.json")).unwrap();
    ResizeNormalize::from_config(&serde_json::from_str(&config).unwrap()).unwrap()
}

fn vision(vlm: &Vlm) -> Gemma3Vision {
    let config = std::fs::read_to_string(vlm.dir.join("config.json")).unwrap();
    let config: VisionConfig = serde_json::from_str(&config).unwrap();
    let vb = var_builder(&[vlm.dir.join("model.safetensors")]).unwrap();
    Gemma3Vision::load(&config, resize(vlm), vb).unwrap()
}

const IMAGES: [&str; 3] = ["noise", "gradient", "flat"];

/// Fed Transformers' own pixel values, the features agree to f32 rounding: both compute the
/// same f32 operations (a convolution, two encoder layers, pooling, a norm, a product) in
/// other orders, which moves the last bits, not more.
#[test]
fn image_features_match_transformers_on_its_pixel_values() {
    let vlm = fixture();
    let vision = vision(&vlm);
    for name in IMAGES {
        let pixels = vlm.reference(&format!("{name}.pixel_values"));
        let ours = vision.image_features(&pixels.unsqueeze(0).unwrap());
        let ours = ours.unwrap().squeeze(0).unwrap();
        let diff = tensor_diff(&ours, &vlm.reference(&format!("{name}.features")));
        assert!(diff < 1e-4, "{name}: {diff}");
        eprintln!("{name}: features within {diff}");
    }
}

/// Our pixel values are the image processor's: PIL's bilinear resize, redone step for step
/// (`plugin-kit`'s `resample`), then the same f32 normalization. Measured: within 1.2e-7 (the
/// last bit of a normalized value) on all three images, the features within 2.4e-6. The
/// bounds, 1e-6 and 1e-4, hold on any machine: the resize is integer code, and the features'
/// f32 sums move by about 1e-6 with the CPU's vector width.
#[test]
fn pixel_values_are_the_image_processors() {
    let vlm = fixture();
    let (resize, vision) = (resize(&vlm), vision(&vlm));
    for name in IMAGES {
        let size = (3, resize.height as usize, resize.width as usize);
        let ours = Tensor::from_vec(resize.pixel_values(&vlm.image(name)), size, &Device::Cpu);
        let ours = ours.unwrap();
        let pixels = tensor_diff(&ours, &vlm.reference(&format!("{name}.pixel_values")));
        assert!(pixels <= 1e-6, "{name}: pixels differ by {pixels}");
        let features = vision.image_features(&ours.unsqueeze(0).unwrap()).unwrap();
        let features = tensor_diff(
            &features.squeeze(0).unwrap(),
            &vlm.reference(&format!("{name}.features")),
        );
        assert!(features <= 1e-4, "{name}: features differ by {features}");
        eprintln!("{name}: pixel values within {pixels}, features within {features}");
    }
}

/// Through the candle backend (chat template, image placeholders, prefix cache), a reply's
/// log-probabilities after each chat agree with Transformers': measured within 4.8e-7; the
/// bound, 1e-5, as for the logits below.
#[test]
fn reply_scores_after_chats_with_images_match_transformers() {
    common::vlm::reply_scores_match(&fixture(), 1e-5);
}

/// Coalitions of a chat with an image (its text players present or not, as `explain` sends
/// them) share the image through the prefix cache: the vision tower encodes it once, later
/// prompts reuse the cached state of the image and the text before it, and every score is the
/// one computed without the cache.
#[test]
fn coalitions_share_an_image_through_the_prefix_cache() {
    let vlm = fixture();
    // Each later prompt reuses at least <bos>, the turn's opening and the image's 6 tokens.
    common::vlm::coalitions_share_an_image(&vlm, 9);
}

/// Generation after a chat with an image starts with Transformers' greedy token: checked where
/// its top two logits are further apart (0.01) than the scores above could differ ("text"
/// 0.039, "one" 0.025; "two" ends on a near tie, 0.0035 apart).
#[test]
fn generation_after_an_image_starts_with_transformers_greedy_token() {
    let vlm = fixture();
    common::vlm::greedy_after(&vlm, &["text", "one"], 0.01);
}

/// A checkpoint whose config and tokenizer disagree on the image token, or whose image
/// processor's file is broken, fails to load naming the file; one without that file runs as a
/// language model and refuses an image by name.
#[test]
fn bad_vision_files_are_named() {
    let vlm = fixture();
    let error = |dir: &tempfile::TempDir| common::vlm::score_error(&vlm, dir.path());
    let mismatched = vlm.replaced(
        "config.json",
        "\"image_token_index\": 62",
        "\"image_token_index\": 5",
    );
    let err = error(&mismatched);
    assert!(
        err.contains("`image_token_index` is 5") && err.contains("62"),
        "{err}"
    );
    let broken = vlm.edited(|d| std::fs::write(d.join("preprocessor_config.json"), "{}").unwrap());
    let err = error(&broken);
    assert!(
        err.contains("preprocessor_config.json") && err.contains("`size.height`"),
        "{err}"
    );
    // Without preprocessor_config.json the settings nested in processor_config.json serve.
    let nested = vlm.edited(|d| std::fs::remove_file(d.join("preprocessor_config.json")).unwrap());
    let (snapshot, reply) = vlm.chat("one");
    common::vlm::backend(nested.path())
        .score(&snapshot, reply)
        .unwrap();
    let missing = vlm.edited(|d| {
        std::fs::remove_file(d.join("preprocessor_config.json")).unwrap();
        std::fs::remove_file(d.join("processor_config.json")).unwrap();
    });
    let err = error(&missing);
    assert!(err.contains("cannot see images"), "{err}");
}

/// Tokenizing a chat with an image gives Transformers' prompt ids, each position's modality
/// (the image's run from `<start_of_image>` to `<end_of_image>`) and the image's counts.
#[test]
fn tokenize_marks_the_image_run() {
    let vlm = fixture();
    let (image, record) = common::vlm::tokenized_image_run(&vlm);
    let ids = &record.token_ids;
    assert_eq!(
        (ids[image.start], ids[image.end - 1], image.len()),
        (61, 63, 6)
    );
    assert_eq!((record.images[0].tokens, record.images[0].patches), (4, 1));
}

/// The logits at every position of each chat (prompt, images and reply) agree with
/// Transformers': measured within 4.5e-7, as the same f32 model in other orders. The bound,
/// 1e-5, holds on any machine (other vector widths move f32 sums by about 1e-6 here) and fails
/// if the image's tokens attend wrongly: attending to an image's tokens causally, as text, moves them by 0.12.
#[test]
fn logits_at_every_position_match_transformers() {
    common::vlm::all_logits_match(&fixture(), 1e-5);
}

/// Parts of an image hidden from attention (explain's `hide` over image regions): see
/// [`common::vlm::hiding_image_regions`].
#[test]
fn hiding_image_regions_hides_their_placeholders() {
    common::vlm::hiding_image_regions(&fixture());
}
