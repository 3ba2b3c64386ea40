//! Idefics3 (SmolVLM's architecture) with images against Transformers 5.25 on a tiny
//! random-weight `Idefics3ForConditionalGeneration` (`tests/data/tiny-idefics3-vlm`, written
//! with its reference outputs by `scripts/vlm-reference.py`; its image processor's settings
//! nested in processor_config.json, as Transformers 5 saves them): each image's views and their
//! pixel values, the features the tower and connector make of them, and through the backend the
//! scores of a reply after chats with no image, one and two.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use lmhost_candle::models::idefics3::{Idefics3Vision, VisionConfig};
use lmhost_candle::models::vision::var_builder;
use lmhost_plugin_kit::multimodal::{Idefics3Processor, Normalize};

mod common;

use common::vlm::{tensor_diff, Vlm};

fn fixture() -> Vlm {
    Vlm::new("tiny-idefics3-vlm", ["gradient", "strip"])
}

/// The image processor as the fixture's processor_config.json and tokenizer set it up.
fn processor(vlm: &Vlm) -> (Idefics3Processor, Normalize) {
    let config = std::fs::read_to_string(vlm.dir.join("processor_config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    let images = &config["image_processor"];
    let side = |key: &str| images[key]["longest_edge"].as_u64().unwrap() as u32;
    let seq_len = config["image_seq_len"].as_u64().unwrap() as usize;
    let tokenizer = tokenizers::Tokenizer::from_file(vlm.dir.join("tokenizer.json")).unwrap();
    let vocab = |t: &str| tokenizer.token_to_id(t);
    let processor = Idefics3Processor::new((side("size"), side("max_image_size")), seq_len, vocab);
    let normalize = Normalize::from_config(images).unwrap();
    (processor.unwrap(), normalize)
}

fn vision(vlm: &Vlm) -> Idefics3Vision {
    let config = std::fs::read_to_string(vlm.dir.join("config.json")).unwrap();
    let config: VisionConfig = serde_json::from_str(&config).unwrap();
    let vb = var_builder(&[vlm.dir.join("model.safetensors")]).unwrap();
    let (processor, normalize) = processor(vlm);
    Idefics3Vision::load(&config, Arc::new(processor), normalize, vb).unwrap()
}

/// Landscape noise (2x2 tiles), a portrait gradient (2x1), flat colours (2x2) and a wide strip
/// (1x2), each with its global view.
const IMAGES: [&str; 4] = ["noise", "gradient", "flat", "strip"];

/// Fed Transformers' own pixel values, the features agree to f32 rounding: a convolution, two
/// encoder layers, the pixel shuffle (a reordering) and a product, in other orders.
#[test]
fn image_features_match_transformers_on_its_pixel_values() {
    let vlm = fixture();
    let vision = vision(&vlm);
    for name in IMAGES {
        let pixels = vlm.reference(&format!("{name}.pixel_values"));
        let ours = vision.image_features(&pixels).unwrap();
        let diff = tensor_diff(&ours, &vlm.reference(&format!("{name}.features")));
        assert!(diff < 1e-4, "{name}: {diff}");
        eprintln!("{name}: features within {diff}");
    }
}

/// Our views of each image are the image processor's: as many, in the same order, with its
/// pixel values. Each image is resized twice (to the longest edge, then to whole tiles) and
/// once more for its global view, all with PIL's Lanczos redone step for step, so the bytes
/// are PIL's, and the normalization the same f32 arithmetic. Measured: within 1.2e-7, features
/// within 4.8e-6; the bounds, 1e-6 and 1e-4, as for Gemma 3's.
#[test]
fn views_and_pixel_values_are_the_image_processors() {
    let vlm = fixture();
    let (processor, normalize) = processor(&vlm);
    let vision = vision(&vlm);
    for name in IMAGES {
        let theirs = vlm.reference(&format!("{name}.pixel_values"));
        let (values, views) = processor.pixel_values(&vlm.image(name), &normalize);
        let tile = processor.tile_size() as usize;
        let ours = Tensor::from_vec(values, (views, 3, tile, tile), &Device::Cpu).unwrap();
        let pixels = tensor_diff(&ours, &theirs);
        assert!(pixels <= 1e-6, "{name}: pixels differ by {pixels}");
        let features = vision.image_features(&ours).unwrap();
        let features = tensor_diff(&features, &vlm.reference(&format!("{name}.features")));
        assert!(features <= 1e-4, "{name}: features differ by {features}");
        eprintln!(
            "{name}: {views} views, pixel values within {pixels}, features within {features}"
        );
    }
}

/// Through the candle backend (SmolVLM's chat template, every message as a list of parts, the
/// tiles' placeholders, the prefix cache), a reply's log-probabilities after each chat agree
/// with Transformers': measured within 2.4e-7; the bound, 1e-5, as for the logits below.
#[test]
fn reply_scores_after_chats_with_images_match_transformers() {
    common::vlm::reply_scores_match(&fixture(), 1e-5);
}

/// Coalitions of a chat with an image share it through the prefix cache: each later prompt
/// reuses at least the image's 20 placeholders and the text before them.
#[test]
fn coalitions_share_an_image_through_the_prefix_cache() {
    common::vlm::coalitions_share_an_image(&fixture(), 23);
}

/// Generation after a chat with an image starts with Transformers' greedy token.
#[test]
fn generation_after_an_image_starts_with_transformers_greedy_token() {
    common::vlm::greedy_after(&fixture(), &["text", "one", "two"], 0.01);
}

/// Tokenizing a chat with an image gives Transformers' prompt ids, marks the image's run from
/// its first `<fake_token_around_image>` to the one that closes its global view, and counts
/// 4 tiles and the global view of 4 placeholders each.
#[test]
fn tokenize_marks_the_image_run() {
    let (image, record) = common::vlm::tokenized_image_run(&fixture());
    let ids = &record.token_ids;
    let fake = 3;
    assert_eq!((ids[image.start], ids[image.end - 1]), (fake, fake));
    assert_eq!((record.images[0].tokens, record.images[0].patches), (20, 5));
}

/// A checkpoint whose config and tokenizer disagree on the image token, whose processor makes
/// more placeholders per tile than the connector makes rows, or whose image processor's
/// settings are broken fails to load naming the file; one without them runs as a language
/// model and refuses an image by name.
#[test]
fn bad_vision_files_are_named() {
    let vlm = fixture();
    let error = |dir: &tempfile::TempDir| common::vlm::score_error(&vlm, dir.path());
    let edit = |file: &str, from: &str, to: &str| vlm.replaced(file, from, to);
    let err = error(&edit(
        "config.json",
        "\"image_token_id\": 4",
        "\"image_token_id\": 7",
    ));
    assert!(
        err.contains("`image_token_id` is 7") && err.contains("`<image>` is 4"),
        "{err}"
    );
    let err = error(&edit(
        "processor_config.json",
        "\"image_seq_len\": 4",
        "\"image_seq_len\": 9",
    ));
    assert!(
        err.contains("processor_config.json") && err.contains("9 placeholders"),
        "{err}"
    );
    let err = error(&edit(
        "processor_config.json",
        "\"longest_edge\": 32",
        "\"longest_edge\": 0",
    ));
    assert!(err.contains("`max_image_size.longest_edge`"), "{err}");
    let missing = vlm.edited(|d| std::fs::remove_file(d.join("processor_config.json")).unwrap());
    let err = error(&missing);
    assert!(err.contains("cannot see images"), "{err}");
}

/// The logits at every position of each chat (prompt, images and reply) agree with
/// Transformers': measured within 1e-7, as the same f32 model in other orders. The bound,
/// 1e-5, holds on any machine (other vector widths move f32 sums by about 1e-6 here) and fails
/// if the image's tokens attend wrongly: letting a tile's tokens see each other whole, as Gemma 3's do, moves them by 2.9e-4 (Idefics3 attends to them causally).
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
