//! The vision-language fixtures `scripts/vlm-reference.py` writes: a tiny random checkpoint, its
//! test images and Transformers' outputs on them (`reference.safetensors`), and the chats those
//! outputs were computed on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use lmhost_plugin_api::abi_stable::std_types::RVec;
use lmhost_plugin_api::{Backend, ConversationSnapshot, Message, Part, Role, Turn};

/// One fixture: `tests/data/<name>`.
pub struct Vlm {
    pub dir: PathBuf,
    reference: HashMap<String, Tensor>,
    /// The images of the chat "two", in order.
    two: [&'static str; 2],
}

impl Vlm {
    pub fn new(name: &str, two: [&'static str; 2]) -> Vlm {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        let reference =
            candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)
                .unwrap();
        Vlm {
            dir,
            reference,
            two,
        }
    }

    pub fn reference(&self, name: &str) -> Tensor {
        let found = self.reference.get(name);
        found.unwrap_or_else(|| panic!("{name}")).clone()
    }

    /// A test image, read as the host reads it.
    pub fn image(&self, name: &str) -> lmhost_plugin_api::Image {
        lmhost::images::read(&self.dir.join(format!("{name}.png")), name).unwrap()
    }

    /// The chat `name` of the reference as a snapshot, and the reply scored after it.
    pub fn chat(&self, name: &str) -> (ConversationSnapshot, &'static str) {
        let part = |p: &str| match self.dir.join(format!("{p}.png")).is_file() {
            true => Part::Image {
                image: self.image(p),
            },
            false => Part::text(p),
        };
        let message = |role, parts: &[&str]| {
            Message::new(role, parts.iter().map(|p| part(p)).collect::<Vec<_>>())
        };
        let [first, second] = self.two;
        let (turns, reply) = match name {
            "text" => (
                vec![vec![message(Role::User, &["What is this?"])]],
                "A cat.",
            ),
            "one" => (
                vec![vec![message(Role::User, &["noise", "What is this?"])]],
                "It is red.",
            ),
            _ => (
                vec![
                    vec![
                        message(Role::System, &["Be brief."]),
                        message(Role::User, &[first, "What is this?"]),
                        message(Role::Assistant, &["A cat."]),
                    ],
                    vec![message(
                        Role::User,
                        &["And now this?", second, "Compare them."],
                    )],
                ],
                "It is blue.",
            ),
        };
        let turns = turns
            .into_iter()
            .map(|messages| Turn {
                messages: RVec::from(messages),
            })
            .collect();
        (ConversationSnapshot::new(turns).unwrap(), reply)
    }

    /// The reference chat's prompt length and all its ids (prompt, then reply).
    pub fn ids(&self, name: &str) -> (usize, Vec<u32>) {
        let ids: Vec<i64> = self
            .reference(&format!("chat.{name}.ids"))
            .to_vec1()
            .unwrap();
        let prompt_len: Vec<i64> = (self.reference(&format!("chat.{name}.prompt_len")))
            .to_vec1()
            .unwrap();
        let ids = ids.into_iter().map(|i| i as u32).collect();
        (prompt_len[0] as usize, ids)
    }

    /// Transformers' log-probabilities of the reference chat's reply tokens.
    pub fn reply_logprobs(&self, name: &str) -> Vec<f32> {
        let (prompt_len, ids) = self.ids(name);
        let logits = self.reference(&format!("chat.{name}.logits"));
        let rows: Vec<Vec<f32>> = candle_nn::ops::log_softmax(&logits, 1)
            .unwrap()
            .to_vec2()
            .unwrap();
        (prompt_len..ids.len())
            .map(|i| rows[i - 1][ids[i] as usize])
            .collect()
    }

    /// Transformers' greedy next token after the chat's prompt, and the gap between its top
    /// two logits there.
    pub fn greedy(&self, name: &str) -> (u32, f32) {
        let (prompt_len, _) = self.ids(name);
        let logits = self.reference(&format!("chat.{name}.logits"));
        let row = logits.to_vec2::<f32>().unwrap().swap_remove(prompt_len - 1);
        let mut sorted = row.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let greedy = (row.iter().enumerate())
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        (greedy as u32, sorted[0] - sorted[1])
    }

    /// A copy of the fixture in a temporary directory, with `edit` applied to its files.
    pub fn edited(&self, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
        edit(copy.path());
        copy
    }

    /// A copy of the fixture with `from` replaced by `to` in `file`, which must hold it.
    pub fn replaced(&self, file: &str, from: &str, to: &str) -> tempfile::TempDir {
        self.edited(|d| {
            let text = std::fs::read_to_string(d.join(file)).unwrap();
            assert!(text.contains(from), "{file}: {from}");
            std::fs::write(d.join(file), text.replace(from, to)).unwrap();
        })
    }
}

/// The largest absolute difference between two tensors of one shape.
pub fn tensor_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
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

/// The backend over the fixture's checkpoint (or a copy of it), in f32 as Transformers ran it.
pub fn backend(dir: &Path) -> lmhost_candle::Candle {
    super::backend(dir, serde_json::json!({"weights": "f32"}))
}

/// Through the backend, the reply's log-probabilities after each reference chat are
/// Transformers' within `bound`.
pub fn reply_scores_match(vlm: &Vlm, bound: f32) {
    let backend = backend(&vlm.dir);
    for name in ["text", "one", "two"] {
        let (snapshot, reply) = vlm.chat(name);
        let ours = backend.score(&snapshot, reply).unwrap();
        let theirs = vlm.reply_logprobs(name);
        assert_eq!(ours.logprobs.len(), theirs.len(), "{name}");
        let diff = (ours.logprobs.iter().zip(&theirs))
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < bound, "{name}: {:?} vs {theirs:?}", ours.logprobs);
        eprintln!("{name}: reply scores within {diff}");
    }
}

/// Coalitions of the chat "one" (its text players present or not, as `explain` sends them)
/// share its image through the prefix cache: the vision tower encodes it once, each later
/// prompt reuses at least `reused` tokens (the image and what comes before it), and every score
/// is the one computed without the cache.
pub fn coalitions_share_an_image(vlm: &Vlm, reused: u32) {
    use lmhost_plugin_api::KvCacheSettings;
    let backend = backend(&vlm.dir);
    let (full, reply) = vlm.chat("one");
    let image = full.turns[0].messages[0].parts[0].clone();
    let coalition = |text: &str| {
        let parts = match text {
            "" => vec![image.clone()],
            text => vec![image.clone(), Part::text(text)],
        };
        let message = Message::new(Role::User, parts);
        let turn = Turn {
            messages: RVec::from(vec![message]),
        };
        ConversationSnapshot::new(vec![turn]).unwrap()
    };
    let prompts: Vec<ConversationSnapshot> = ["What is this?", "What is", "", "this?"]
        .into_iter()
        .map(coalition)
        .collect();
    let run = |enabled: bool| {
        let settings = KvCacheSettings {
            enabled,
            max_entries: 16,
            max_bytes: 0,
        };
        backend.set_kv_cache(settings).unwrap();
        let records = backend.score_batch(&prompts, reply).unwrap();
        let cached: u32 = records.iter().map(|r| r.cached_prompt_tokens).sum();
        let rows: Vec<Vec<f32>> = records.into_iter().map(|r| r.logprobs.to_vec()).collect();
        (rows, cached)
    };
    let (on, cached) = run(true);
    let engine = backend.engine().unwrap();
    let vision = engine.front.vision().expect("a vision-language model");
    assert_eq!(vision.ids.encoded(), 1, "one image, encoded once");
    assert!(cached >= 3 * reused, "cached {cached}");
    let (off, _) = run(false);
    for (a, b) in on.iter().zip(&off) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5, "cache on vs off: {a:?} {b:?}");
        }
    }
    assert_eq!(
        vision.ids.encoded(),
        1,
        "the image is kept, not encoded again"
    );
}

/// Generation after each of the chats `names` starts with Transformers' greedy token, each
/// chosen by a margin of at least `gap`.
pub fn greedy_after(vlm: &Vlm, names: &[&str], gap: f32) {
    use lmhost_plugin_api::GenerationConfig;
    let backend = backend(&vlm.dir);
    for name in names {
        let (snapshot, _) = vlm.chat(name);
        let config = GenerationConfig {
            max_new_tokens: 1,
            temperature: 0.0,
            ..GenerationConfig::default()
        };
        let record = backend.generate(&snapshot, &config).unwrap();
        let (greedy, margin) = vlm.greedy(name);
        assert!(margin > gap, "{name}: a near tie, {margin}");
        assert_eq!(record.token_ids.as_slice(), [greedy], "{name}");
    }
}

/// The error scoring the chat "one" on the checkpoint in `dir` ends in.
pub fn score_error(vlm: &Vlm, dir: &Path) -> String {
    let (snapshot, reply) = vlm.chat("one");
    let err = backend(dir).score(&snapshot, reply).unwrap_err();
    err.message.to_string()
}

/// Tokenizing the chat "one" gives Transformers' prompt ids, and marks one contiguous run of
/// image positions, returned with the record.
pub fn tokenized_image_run(
    vlm: &Vlm,
) -> (std::ops::Range<usize>, lmhost_plugin_api::TokenizeRecord) {
    let (snapshot, _) = vlm.chat("one");
    let record = backend(&vlm.dir).tokenize(&snapshot, true).unwrap();
    let (prompt_len, ids) = vlm.ids("one");
    assert_eq!(record.token_ids.as_slice(), &ids[..prompt_len]);
    let image: Vec<usize> = (record.mm_token_type_ids.iter().enumerate())
        .filter(|(_, &m)| m == 1)
        .map(|(i, _)| i)
        .collect();
    let (first, last) = (image[0], image[image.len() - 1]);
    assert_eq!(image.len(), last - first + 1, "one contiguous run");
    assert_eq!(record.images.len(), 1);
    (first..last + 1, record)
}

/// Our logits at every position of each reference chat are Transformers' within `bound`.
pub fn all_logits_match(vlm: &Vlm, bound: f32) {
    for name in ["text", "one", "two"] {
        let diff = all_logits_diff(vlm, name);
        assert!(diff < bound, "{name}: {diff}");
    }
}

/// The largest difference between our logits and Transformers' at every position of the chat
/// `name` (its prompt, images included, and reply): image positions too, where attending to an
/// image's tokens in the wrong order shows most.
fn all_logits_diff(vlm: &Vlm, name: &str) -> f32 {
    use lmhost_candle::models::Logits;
    let backend = backend(&vlm.dir);
    let engine = backend.engine().unwrap();
    let (snapshot, _) = vlm.chat(name);
    let (prompt_len, reference_ids) = vlm.ids(name);
    let reply = &reference_ids[prompt_len..];
    let mut ids = engine.front.prompt_ids(&snapshot, reply.len()).unwrap();
    assert_eq!(ids.len(), prompt_len, "{name}");
    ids.extend_from_slice(reply);
    let mut kv = engine.model.new_state();
    let forward = engine.model.forward(&ids, &mut kv, Logits::All, false);
    let ours = forward.unwrap().logits.unwrap();
    let theirs = vlm.reference(&format!("chat.{name}.logits"));
    tensor_diff(&ours, &theirs)
}

/// Hiding parts of the noise image of the chat "one" from the attention of the question and
/// the reply (`score_hidden` with image boxes): hiding nothing is the plain score, hiding every
/// cell of a 2 x 2 grid is hiding the whole image, hiding one cell moves the score, and the
/// vision tower encodes the image once for all of it.
pub fn hiding_image_regions(vlm: &Vlm) {
    let backend = backend(&vlm.dir);
    assert!(backend.capabilities().image_input && backend.capabilities().hides);
    let (snapshot, reply) = vlm.chat("one");
    let plain = backend.score(&snapshot, reply).unwrap();
    let bounds = [
        [0, 0, 40, 30],
        [40, 0, 80, 30],
        [0, 30, 40, 60],
        [40, 30, 80, 60],
        [0, 0, 80, 60],
    ];
    let boxes: Vec<_> = (bounds.iter())
        .map(|&bounds| lmhost_plugin_api::ImageBox {
            message: 0,
            image: 0,
            bounds,
        })
        .collect();
    let parts = lmhost_plugin_api::Hideable {
        boxes: boxes.into(),
        ..Default::default()
    };
    let hidden = [vec![], vec![0, 1, 2, 3], vec![4], vec![1]];
    let records = backend
        .score_hidden(&snapshot, reply, &parts, &hidden, 0)
        .unwrap();
    let diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    let [none, cells, whole, one] = [0, 1, 2, 3].map(|i| records[i].logprobs.to_vec());
    assert!(
        diff(&none, &plain.logprobs) <= 1e-5,
        "{none:?} vs {plain:?}"
    );
    assert!(diff(&cells, &whole) <= 1e-6, "{cells:?} vs {whole:?}");
    assert!(
        diff(&one, &none) > 1e-4,
        "hiding a cell changes nothing: {one:?}"
    );
    assert!(
        diff(&whole, &one) > 1e-4,
        "hiding all is hiding one: {whole:?}"
    );
    let engine = backend.engine().unwrap();
    let vision = engine.front.vision().expect("a vision-language model");
    assert_eq!(vision.ids.encoded(), 1, "one image, encoded once");
}
