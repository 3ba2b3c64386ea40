//! The candle backend's text front end on tiny GGUFs the tests write: tokenizer and template
//! errors that name the file and key, raw text, models without a template, tokenize.

mod common;

use candle_core::quantized::gguf_file::Value;
use common::{backend, write_gguf, write_gguf_with};
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, ErrorKind, GenerationConfig, Message, Role, Turn,
};

fn greedy() -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 3,
        ..GenerationConfig::default()
    }
}

fn set(key: &str, value: Value) -> impl FnOnce(&mut Vec<(String, Value)>) + '_ {
    move |meta| {
        meta.retain(|(k, _)| k != key);
        meta.push((key.to_string(), value));
    }
}

#[test]
fn broken_tokenizer_metadata_and_templates_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let s = |v: &str| Value::String(v.to_string());
    let cases = [
        (
            "pre.gguf",
            write_gguf_with(
                &dir.path().join("pre.gguf"),
                "llama",
                set("tokenizer.ggml.pre", s("klingon")),
            ),
            vec!["tokenizer.ggml.pre", "klingon"],
        ),
        (
            "model.gguf",
            write_gguf_with(
                &dir.path().join("model.gguf"),
                "llama",
                set("tokenizer.ggml.model", s("rwkv")),
            ),
            vec!["tokenizer.ggml.model", "rwkv"],
        ),
        (
            "types.gguf",
            write_gguf_with(
                &dir.path().join("types.gguf"),
                "llama",
                set(
                    "tokenizer.ggml.token_type",
                    Value::Array(vec![Value::I32(1); 3]),
                ),
            ),
            vec!["tokenizer.ggml.token_type"],
        ),
        (
            "merge.gguf",
            write_gguf_with(
                &dir.path().join("merge.gguf"),
                "llama",
                set("tokenizer.ggml.merges", Value::Array(vec![s("a zzz")])),
            ),
            vec!["zzz"],
        ),
        (
            "template.gguf",
            write_gguf_with(
                &dir.path().join("template.gguf"),
                "llama",
                set(
                    "tokenizer.chat_template",
                    s("{% for m in messages %}\n{{ m.content }"),
                ),
            ),
            vec!["tokenizer.chat_template", "line"],
        ),
    ];
    for (name, path, expect) in cases {
        let b = backend(&path, json!({}));
        let err = b
            .generate(&ConversationSnapshot::raw("hello"), &greedy())
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::BackendUnavailable, "{name}: {err}");
        assert!(err.message.contains(name), "{name}: {err}");
        for word in expect {
            assert!(err.message.contains(word), "{name}: `{word}` in {err}");
        }
    }
}

#[test]
fn a_template_that_raises_names_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let template = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ messages[0].content }}";
    let path = write_gguf_with(
        &dir.path().join("strict.gguf"),
        "llama",
        set("tokenizer.chat_template", Value::String(template.into())),
    );
    let b = backend(&path, json!({}));
    let messages = vec![
        Message::text(Role::System, "Be brief."),
        Message::text(Role::User, "hello"),
    ];
    let system = ConversationSnapshot::new(vec![Turn {
        messages: messages.into(),
    }])
    .unwrap();
    let err = b.generate(&system, &greedy()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("System role not supported"), "{err}");
}

#[test]
fn a_model_without_a_template_takes_raw_text_and_refuses_chat_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf_with(&dir.path().join("base.gguf"), "llama", |meta| {
        meta.retain(|(k, _)| k != "tokenizer.chat_template")
    });
    let b = backend(&path, json!({}));
    let chat = ConversationSnapshot::from_prompt("hello there");
    let err = b.generate(&chat, &greedy()).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains("has no chat template"), "{err}");
    assert!(err.message.contains("base.gguf"), "{err}");
    // Raw text needs no template, and is tokenized as written.
    let raw = ConversationSnapshot::raw("hello there");
    let record = b.generate(&raw, &greedy()).unwrap();
    let tokens = b.tokenize(&raw, false).unwrap();
    assert_eq!(record.prompt_tokens as usize, tokens.token_ids.len());
    // "plain" asks for role: content lines.
    let plain = backend(&path, json!({"chat_template": "plain"}));
    let tokens = plain.tokenize(&chat, true).unwrap();
    let text: String = tokens.pieces.iter().map(|p| p.as_str()).collect();
    assert_eq!(text, "user: hello there\nassistant:");
}

#[test]
fn tokenize_renders_the_template_and_detokenize_inverts_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let b = backend(&path, json!({}));
    let chat = ConversationSnapshot::from_prompt("hello");
    let tokens = b.tokenize(&chat, true).unwrap();
    let text = b.detokenize(&tokens.token_ids).unwrap();
    let pieces: String = tokens.pieces.iter().map(|p| p.as_str()).collect();
    assert_eq!(text, pieces);
    assert!(
        text.contains("hello") && text.ends_with("assistant\n"),
        "{text:?}"
    );
    // The generation prompt is what generate runs.
    let record = b.generate(&chat, &greedy()).unwrap();
    assert_eq!(record.prompt_tokens as usize, tokens.token_ids.len());
    let err = b.detokenize(&[1_000_000]).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("1000000"), "{err}");
}

#[test]
fn empty_raw_text_starts_from_bos_and_continuations_match_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let b = backend(&path, json!({}));
    // The tiny vocabulary's BOS is id 256; "" alone has no tokens.
    let empty = b
        .score(&ConversationSnapshot::raw(""), "hello there")
        .unwrap();
    assert_eq!(empty.prompt_tokens, 1);
    let whole = b
        .tokenize(&ConversationSnapshot::raw("hello there"), true)
        .unwrap();
    assert_eq!(empty.token_ids, whole.token_ids);
    // A continuation is scored as the same tokens of the whole text, in the same context.
    let head = b
        .score(&ConversationSnapshot::raw("h"), "ello there")
        .unwrap();
    assert_eq!(head.token_ids.as_slice(), &whole.token_ids[1..]);
    let tail = b
        .score(&ConversationSnapshot::raw("hello"), " there")
        .unwrap();
    let n = tail.token_ids.len();
    assert_eq!(
        tail.token_ids.as_slice(),
        &head.token_ids[head.token_ids.len() - n..]
    );
    let diff = tail
        .logprobs
        .iter()
        .zip(&head.logprobs[head.logprobs.len() - n..])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(diff < 1e-5, "max |Δ logprob| {diff}");
}
