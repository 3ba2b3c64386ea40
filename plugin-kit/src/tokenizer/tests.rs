//! Tokenizers built from tiny metadata: the errors that name a bad key, and the special-token
//! rules on vocabularies small enough to check by hand.

use crate::gguf::{Metadata, Value};

use super::{TextTokenizer, TokenizerError};

fn strings(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::String(s.to_string())).collect())
}

fn ints(items: &[i32]) -> Value {
    Value::Array(items.iter().map(|&i| Value::I32(i)).collect())
}

fn floats(items: &[f32]) -> Value {
    Value::Array(items.iter().map(|&f| Value::F32(f)).collect())
}

fn meta(pairs: Vec<(&str, Value)>) -> Metadata {
    Metadata::from_pairs(pairs.into_iter().map(|(k, v)| (k.to_string(), v)))
}

/// A byte-level BPE over "h", "i", "hi", a space, and a control token.
fn tiny_bpe(pre: Option<&str>) -> Vec<(&'static str, Value)> {
    let mut pairs = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens",
            strings(&[
                "<|im_start|>",
                "h",
                "i",
                "hi",
                "Ġ",
                "Ġhi",
                "<",
                "|",
                ">",
                "_",
                "m",
                "s",
                "t",
                "a",
                "r",
            ]),
        ),
        (
            "tokenizer.ggml.token_type",
            ints(&[3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
        ),
        ("tokenizer.ggml.merges", strings(&["h i", "Ġ hi"])),
        ("tokenizer.ggml.bos_token_id", Value::U32(0)),
    ];
    if let Some(pre) = pre {
        pairs.push(("tokenizer.ggml.pre", Value::String(pre.into())));
    }
    pairs
}

fn error(pairs: Vec<(&str, Value)>) -> String {
    TextTokenizer::from_gguf(&meta(pairs))
        .expect_err("bad metadata")
        .to_string()
}

fn replace(
    mut pairs: Vec<(&'static str, Value)>,
    key: &'static str,
    value: Value,
) -> Vec<(&'static str, Value)> {
    pairs.retain(|(k, _)| *k != key);
    pairs.push((key, value));
    pairs
}

#[test]
fn byte_level_bpe_with_a_control_token() {
    let tok = TextTokenizer::from_gguf(&meta(tiny_bpe(Some("gpt-2")))).expect("tokenizer");
    assert_eq!(tok.kind(), "gpt2/gpt-2");
    assert_eq!(tok.encode("hi hi", false, false).expect("encode"), [3, 5]);
    assert_eq!(
        tok.encode("<|im_start|>hi", false, true).expect("encode"),
        [0, 3]
    );
    let plain = tok.encode("<|im_start|>", false, false).expect("encode");
    assert_eq!(plain, [6, 7, 2, 10, 9, 11, 12, 13, 14, 12, 7, 8]);
    assert_eq!(
        tok.decode(&[0, 3, 5], false).expect("decode"),
        "<|im_start|>hi hi"
    );
    assert_eq!(tok.decode(&[0, 3, 5], true).expect("decode"), "hi hi");
    assert!(matches!(
        tok.decode(&[99], true),
        Err(TokenizerError::IdOutOfRange { id: 99, .. })
    ));
    assert_eq!(tok.id("<|im_start|>"), Some(0));
    assert_eq!(tok.token(3), Some("hi"));
}

#[test]
fn a_missing_pre_tokenizer_is_llama_cpp_s_default_and_says_so() {
    let tok = TextTokenizer::from_gguf(&meta(tiny_bpe(None))).expect("tokenizer");
    assert!(
        tok.kind()
            .starts_with("gpt2/default (no tokenizer.ggml.pre"),
        "{}",
        tok.kind()
    );
}

#[test]
fn unknown_model_and_pre_are_refused_with_the_supported_list() {
    let err = error(replace(
        tiny_bpe(None),
        "tokenizer.ggml.model",
        Value::String("t5".into()),
    ));
    assert!(err.contains("`tokenizer.ggml.model` is \"t5\""), "{err}");
    assert!(err.contains("gpt2, gemma4, llama, bert"), "{err}");
    let err = error(tiny_bpe(Some("mystery")));
    assert!(err.contains("`tokenizer.ggml.pre` is \"mystery\""), "{err}");
    assert!(err.contains("llama-bpe") && err.contains("qwen2"), "{err}");
}

#[test]
fn mismatched_lengths_name_the_key() {
    let err = error(replace(
        tiny_bpe(None),
        "tokenizer.ggml.token_type",
        ints(&[1, 1]),
    ));
    assert!(
        err.contains("`tokenizer.ggml.token_type` has 2 entries, expected one per token (15)"),
        "{err}"
    );
    let mut spm = tiny_spm();
    spm = replace(spm, "tokenizer.ggml.scores", floats(&[0.0]));
    let err = error(spm);
    assert!(
        err.contains("`tokenizer.ggml.scores` has 1 entries"),
        "{err}"
    );
}

#[test]
fn merges_must_name_known_tokens() {
    let err = error(replace(
        tiny_bpe(None),
        "tokenizer.ggml.merges",
        strings(&["h x"]),
    ));
    assert!(
        err.contains("entry 0 (\"h x\"): \"x\" is not in tokenizer.ggml.tokens"),
        "{err}"
    );
    let err = error(replace(
        tiny_bpe(None),
        "tokenizer.ggml.merges",
        strings(&["hi"]),
    ));
    assert!(err.contains("no space"), "{err}");
}

#[test]
fn missing_and_mistyped_keys_are_named() {
    let mut pairs = tiny_bpe(None);
    pairs.retain(|(k, _)| *k != "tokenizer.ggml.tokens");
    let err = error(pairs);
    assert!(
        err.contains("`tokenizer.ggml.tokens` is missing, expected an array of strings"),
        "{err}"
    );
    let err = error(replace(
        tiny_bpe(None),
        "tokenizer.ggml.tokens",
        Value::U32(3),
    ));
    assert!(
        err.contains("`tokenizer.ggml.tokens` is u32, expected an array of strings"),
        "{err}"
    );
    let mut pairs = tiny_bpe(None);
    pairs.retain(|(k, _)| *k != "tokenizer.ggml.model");
    assert!(error(pairs).contains("`tokenizer.ggml.model` is missing"));
    let mut spm = tiny_spm();
    spm.retain(|(k, _)| *k != "tokenizer.ggml.scores");
    assert!(error(spm).contains("`tokenizer.ggml.scores` is missing"));
}

/// A SentencePiece vocabulary where "▁ab" beats "ab" and bytes cover the rest.
fn tiny_spm() -> Vec<(&'static str, Value)> {
    vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        (
            "tokenizer.ggml.tokens",
            strings(&[
                "<unk>", "<s>", "</s>", "<0x63>", "▁", "a", "b", "ab", "▁a", "▁ab",
            ]),
        ),
        (
            "tokenizer.ggml.scores",
            floats(&[0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -5.0, -4.0, -6.0]),
        ),
        (
            "tokenizer.ggml.token_type",
            ints(&[2, 3, 3, 6, 1, 1, 1, 1, 1, 1]),
        ),
    ]
}

#[test]
fn sentencepiece_ranks_merges_by_score_and_falls_back_to_bytes() {
    let tok = TextTokenizer::from_gguf(&meta(tiny_spm())).expect("tokenizer");
    assert_eq!(tok.kind(), "llama");
    // "▁a" (-4) joins before "ab" (-5); then "▁ab" (-6).
    assert_eq!(tok.encode("ab", false, false).expect("encode"), [9]);
    assert_eq!(tok.encode("ab", true, false).expect("encode"), [1, 9]);
    assert_eq!(tok.encode("abc", false, false).expect("encode"), [9, 3]);
    assert_eq!(tok.decode(&[1, 9, 3], true).expect("decode"), "abc");
    assert_eq!(tok.eog_ids(), [2]);
    let no_prefix = replace(
        tiny_spm(),
        "tokenizer.ggml.add_space_prefix",
        Value::Bool(false),
    );
    let tok = TextTokenizer::from_gguf(&meta(no_prefix)).expect("tokenizer");
    assert_eq!(tok.encode("ab", false, false).expect("encode"), [7]);
}
