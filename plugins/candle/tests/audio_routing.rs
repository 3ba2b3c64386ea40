//! The candle backend routes audio: a speech checkpoint (found by `model_class` or by the
//! checkpoint itself) takes the processor path; a text-only causal LM refuses audio, naming the
//! model.

mod common;

use std::path::Path;

use lmhost_plugin_api::abi_stable::std_types::RVec;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, ErrorKind, GenerationConfig, Message, Part, Role, Turn,
};

fn whisper_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/whisper-tiny.en")
}

/// The README example's clip (espeak-ng, 22050 Hz) with a text part.
fn audio_snapshot() -> ConversationSnapshot {
    let wav = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/audio.wav");
    let audio = lmhost::audio::read_wav(&wav).unwrap();
    let message = Message::new(
        Role::User,
        vec![Part::text("Transcribe:"), Part::Audio { audio }],
    );
    ConversationSnapshot::new(vec![Turn {
        messages: RVec::from(vec![message]),
    }])
    .unwrap()
}

#[test]
fn a_text_only_model_refuses_audio_naming_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let backend = common::backend(&model, json!({"weights": "f32", "threads": 1}));
    let caps = backend.capabilities();
    assert!(!caps.audio_input && !caps.image_input && caps.hides);
    let err = backend
        .generate(&audio_snapshot(), &GenerationConfig::default())
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("tiny.gguf"), "{err}");
    assert!(
        err.message.contains("text-only causal language model"),
        "{err}"
    );
    let err = backend.score(&audio_snapshot(), "words").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    // Text still works on the same backend.
    let config = GenerationConfig {
        max_new_tokens: 2,
        ..GenerationConfig::default()
    };
    backend
        .generate(&ConversationSnapshot::from_prompt("hi"), &config)
        .unwrap();
}

#[test]
fn a_whisper_checkpoint_is_detected_and_transcribes_through_the_backend() {
    let backend = common::backend(&whisper_dir(), json!({"threads": 1}));
    let caps = backend.capabilities();
    assert!(caps.audio_input && !caps.prefix_cache && !caps.image_input && caps.hides);
    let record = backend
        .generate(&audio_snapshot(), &GenerationConfig::default())
        .unwrap();
    let text = record.text.to_lowercase();
    assert!(
        text.contains("library") && text.contains("monday"),
        "{text}"
    );
    assert_eq!(record.cached_prompt_tokens, 0);
    assert_eq!(
        backend.stats().generated_tokens,
        record.token_ids.len() as u64
    );

    // Forcing another class on the same checkpoint takes the causal-LM path, which refuses audio.
    let forced = common::backend(&whisper_dir(), json!({"model_class": "llama"}));
    let err = forced
        .generate(&audio_snapshot(), &GenerationConfig::default())
        .unwrap_err();
    assert!(
        err.message.contains("text-only causal language model"),
        "{err}"
    );
}
