//! The multimodal processor contract against Transformers' own processors (5.25): for images of
//! nine sizes and aspect ratios, placeholder counts, patches, the text an image expands to, the
//! prompt's token ids and each position's modality. `data/processors.json` is written by
//! `scripts/processor-reference.py` (Transformers, PIL and a word-level tokenizer that knows
//! every marker, stored in the file); these are integer and string computations, so they agree
//! exactly on any machine.

use std::str::FromStr;

use lmhost_plugin_kit::multimodal::{
    Gemma3Processor, Idefics3Processor, ImageTokens, Modality, Processor,
};
use serde_json::Value;
use tokenizers::Tokenizer;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/processors.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn numbers(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

/// Checks `processor` on every case of `reference[name]`, whose prompt holds `marker` where the
/// image goes.
fn check(name: &str, processor: &dyn Processor, tokenizer: &Tokenizer, marker: &str) {
    let data = &reference()[name];
    let prompt = data["prompt"].as_str().unwrap();
    for case in data["cases"].as_array().unwrap() {
        let size = (
            case["height"].as_u64().unwrap() as u32,
            case["width"].as_u64().unwrap() as u32,
        );
        let what = format!("{name} {size:?}");
        let expected = ImageTokens {
            tokens: case["num_image_tokens"].as_u64().unwrap() as u32,
            patches: case["num_image_patches"].as_u64().unwrap() as u32,
        };
        assert_eq!(
            processor.num_multimodal_tokens(&[size]),
            [expected],
            "{what}"
        );
        let text = processor.image_text(size);
        assert_eq!(text, case["image_text"].as_str().unwrap(), "{what}");
        let expanded = prompt.replacen(marker, &text, 1);
        let ids = tokenizer
            .encode(expanded, false)
            .unwrap()
            .get_ids()
            .to_vec();
        let theirs: Vec<u32> = numbers(&case["input_ids"])
            .iter()
            .map(|&i| i as u32)
            .collect();
        assert_eq!(ids, theirs, "{what}");
        let placeholders = ids.iter().filter(|&&i| i == processor.image_token_id());
        assert_eq!(placeholders.count(), expected.tokens as usize, "{what}");
        let ours: Vec<u64> = (processor.modalities(&ids).iter())
            .map(|&m| m as u64)
            .collect();
        let theirs = numbers(&case["mm_token_type_ids"]);
        // One contiguous run of image positions per image, as the contract asks.
        let runs = ours.windows(2).filter(|w| w == &[0, 1]).count() + usize::from(ours[0] == 1);
        assert_eq!(runs, 1, "{what}");
        for (i, (&a, &b)) in ours.iter().zip(&theirs).enumerate() {
            // Where Transformers leaves a marker at text (Gemma 3's start and end of image),
            // the contract marks it image; everywhere else the two agree.
            let marker_only_ours = a == 1 && b == 0 && ids[i] != processor.image_token_id();
            assert!(
                a == b || marker_only_ours,
                "{what}: position {i}: {a} vs {b}"
            );
        }
        assert_eq!(ours.len(), theirs.len(), "{what}");
    }
}

fn tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_str(&reference()[name]["tokenizer"].to_string()).unwrap()
}

fn vocab(tokenizer: &Tokenizer) -> impl Fn(&str) -> Option<u32> + '_ {
    |token| tokenizer.token_to_id(token)
}

#[test]
fn idefics3_and_smolvlm_tile_as_transformers_does() {
    for name in ["idefics3", "smolvlm"] {
        let tokenizer = tokenizer(name);
        let config = &reference()[name]["config"];
        let get = |key: &str| config[key].as_u64().unwrap();
        let processor = Idefics3Processor::new(
            (get("longest_edge") as u32, get("max_image_size") as u32),
            get("image_seq_len") as usize,
            vocab(&tokenizer),
        )
        .unwrap();
        check(name, &processor, &tokenizer, Idefics3Processor::IMAGE);
        // Idefics3's own marking covers the whole run too: exactly equal, not just a superset.
        let case = &reference()[name]["cases"][0];
        let ids: Vec<u32> = numbers(&case["input_ids"])
            .iter()
            .map(|&i| i as u32)
            .collect();
        let ours: Vec<u64> = (processor.modalities(&ids).iter())
            .map(|&m| m as u64)
            .collect();
        assert_eq!(ours, numbers(&case["mm_token_type_ids"]));
        cells_cover_each_view(&processor, (480, 640));
    }
}

/// One cell per placeholder; each view's cells tile its part of the image, row by row, and the
/// global view's (last) the whole image.
fn cells_cover_each_view(processor: &Idefics3Processor, size: (u32, u32)) {
    let cells = processor.placeholder_cells(size);
    let counts = processor.image_tokens(size);
    assert_eq!(cells.len(), counts.tokens as usize);
    let per_view = processor.image_seq_len();
    let (rows, cols) = processor.grid(size);
    let views: Vec<&[[f64; 4]]> = cells.chunks(per_view).collect();
    assert_eq!(views.len(), (rows * cols + 1) as usize);
    let side = (per_view as f64).sqrt();
    for (v, view) in views.iter().enumerate() {
        let (r, c) = match v < (rows * cols) as usize {
            true => ((v as u32 / cols) as f64, (v as u32 % cols) as f64),
            false => (0.0, 0.0),
        };
        let (w, h) = match v < (rows * cols) as usize {
            true => (1.0 / f64::from(cols), 1.0 / f64::from(rows)),
            false => (1.0, 1.0),
        };
        let [x0, y0, ..] = view[0];
        let [.., x1, y1] = view[per_view - 1];
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(
            close(x0, c * w) && close(y0, r * h),
            "view {v} starts at {x0}, {y0}"
        );
        assert!(
            close(x1, (c + 1.0) * w) && close(y1, (r + 1.0) * h),
            "view {v}"
        );
        // The second placeholder is the first's right neighbour.
        assert!(close(view[1][0], x0 + w / side), "view {v} is row by row");
    }
}

#[test]
fn gemma3_images_are_256_soft_tokens_between_their_markers() {
    let tokenizer = tokenizer("gemma3");
    let per_image = reference()["gemma3"]["config"]["mm_tokens_per_image"]
        .as_u64()
        .unwrap();
    let processor = Gemma3Processor::new(per_image as usize, vocab(&tokenizer)).unwrap();
    check("gemma3", &processor, &tokenizer, Gemma3Processor::START);
    assert_eq!(processor.image_token(), "<image_soft_token>");
    let start = tokenizer.token_to_id(Gemma3Processor::START).unwrap();
    let modalities = processor.modalities(&[7, start, processor.image_token_id(), 9]);
    assert_eq!(modalities[..2], [Modality::Text, Modality::Image]);
}

#[test]
fn a_missing_marker_token_is_named() {
    let err = Idefics3Processor::new((2048, 512), 64, |_| None)
        .err()
        .unwrap();
    assert!(err.contains("`<image>`"), "{err}");
    let err = Gemma3Processor::new(256, |t| (t != Gemma3Processor::END).then_some(1));
    assert!(err.err().unwrap().contains("`<end_of_image>`"));
}

#[test]
fn a_preprocessor_config_without_its_fields_is_refused_by_name() {
    use lmhost_plugin_kit::multimodal::ResizeNormalize;
    let good = serde_json::json!({
        "size": {"height": 56, "width": 56}, "rescale_factor": 0.5,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    });
    assert_eq!(ResizeNormalize::from_config(&good).unwrap().height, 56);
    for (key, expected) in [
        ("size", "`size.height`"),
        ("image_mean", "`image_mean` must be a list of 3 numbers"),
        ("rescale_factor", "`rescale_factor`"),
    ] {
        let mut bad = good.clone();
        bad.as_object_mut().unwrap().remove(key);
        let err = ResizeNormalize::from_config(&bad).unwrap_err();
        assert!(err.contains(expected), "{key}: {err}");
    }
    let mut zero = good.clone();
    zero["image_std"] = serde_json::json!([0.5, 0.0, 0.5]);
    assert!(ResizeNormalize::from_config(&zero).is_err());
}

/// A chat with two images (one before its message's text, one between two texts) through
/// Gemma 3's chat template: the prompt's token ids are Transformers' `apply_chat_template`'s,
/// and its placeholders where Transformers puts them.
#[test]
fn a_gemma3_chat_with_images_renders_as_transformers_does() {
    use lmhost_plugin_api::abi_stable::std_types::RVec;
    use lmhost_plugin_api::{ConversationSnapshot, Image, Message, Part, Role, Turn};
    use lmhost_plugin_kit::prompt::PromptFormat;
    use lmhost_plugin_kit::template::ChatTemplate;

    let chat = &reference()["gemma3"]["chat"];
    let tokenizer = tokenizer("gemma3");
    let processor = Gemma3Processor::new(256, vocab(&tokenizer)).unwrap();
    let template = ChatTemplate::new(chat["template"].as_str().unwrap(), "gemma3")
        .unwrap()
        .with_special_tokens(chat["bos_token"].as_str().map(String::from), None);
    let role = |r: &str| match r {
        "system" => Role::System,
        "user" => Role::User,
        _ => Role::Assistant,
    };
    let mut turns = vec![];
    let mut messages = vec![];
    for m in chat["messages"].as_array().unwrap() {
        let parts: Vec<Part> = (m["parts"].as_array().unwrap().iter())
            .map(|p| match p.as_str() {
                Some(text) => Part::text(text),
                None => {
                    let (h, w) = (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap() as u32);
                    let rgb = vec![128; (h * w * 3) as usize];
                    Part::Image {
                        image: Image::new(w, h, rgb).unwrap(),
                    }
                }
            })
            .collect();
        let role = role(m["role"].as_str().unwrap());
        messages.push(Message::new(role, parts));
        if role == Role::Assistant {
            turns.push(Turn {
                messages: RVec::from(std::mem::take(&mut messages)),
            });
        }
    }
    turns.push(Turn {
        messages: RVec::from(messages),
    });
    let snapshot = ConversationSnapshot::new(turns).unwrap();
    let format = PromptFormat::Template(template);
    let (prompt, images) = format
        .render_with_images(&snapshot, "tiny", &processor)
        .unwrap();
    assert_eq!(
        images
            .iter()
            .map(|i| (i.height, i.width))
            .collect::<Vec<_>>(),
        [(480, 640), (100, 60)]
    );
    assert!(!prompt.add_special);
    let ids = tokenizer
        .encode(prompt.text.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let theirs: Vec<u32> = numbers(&chat["input_ids"])
        .iter()
        .map(|&i| i as u32)
        .collect();
    assert_eq!(ids, theirs);
    let ours: Vec<u64> = (processor.modalities(&ids).iter())
        .map(|&m| m as u64)
        .collect();
    let placeholders: Vec<bool> = ids
        .iter()
        .map(|&i| i == processor.image_token_id())
        .collect();
    for ((a, b), soft) in ours
        .iter()
        .zip(numbers(&chat["mm_token_type_ids"]))
        .zip(placeholders)
    {
        assert!(*a == b || (*a == 1 && b == 0 && !soft));
    }
    // A template that drops images is refused rather than silently misplacing them.
    let dropping = ChatTemplate::new("{% for m in messages %}{{ m.role }}{% endfor %}", "t");
    let err = PromptFormat::Template(dropping.unwrap())
        .render_with_images(&snapshot, "tiny", &processor)
        .unwrap_err();
    assert!(err.message.contains("wrote 0 image markers"), "{err}");
}

/// Resizing redoes PIL's (the version `processors.json` names) byte for byte: bilinear and
/// Lanczos, up and down, one axis kept, and the height shrinking more than twice the width,
/// where Pillow runs its vertical pass first. Integer arithmetic, so on any machine.
#[test]
fn resizes_are_pils_byte_for_byte() {
    use base64::Engine;
    use lmhost_plugin_kit::multimodal::resample::{resize, Filter};
    let reference = reference();
    for case in reference["resample"]["cases"].as_array().unwrap() {
        let [h, w] = numbers(&case["from"])[..] else {
            panic!("{case}")
        };
        let [oh, ow] = numbers(&case["to"])[..] else {
            panic!("{case}")
        };
        let filter = match case["filter"].as_str().unwrap() {
            "bilinear" => Filter::Bilinear,
            _ => Filter::Lanczos,
        };
        // The script's `pattern`: sharp edges, on which Lanczos rings.
        let image = image::RgbImage::from_fn(w as u32, h as u32, |x, y| {
            let (x, y) = (u64::from(x), u64::from(y));
            image::Rgb([0, 1, 2].map(|c| (((x * 37 + y * 91 + c * 53) ^ (x * y)) % 256) as u8))
        });
        let ours = resize(&image, (oh as u32, ow as u32), filter).into_raw();
        let theirs = base64::engine::general_purpose::STANDARD
            .decode(case["rgb"].as_str().unwrap())
            .unwrap();
        assert_eq!(ours, theirs, "{}", case["from"]);
    }
}
