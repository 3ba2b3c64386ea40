//! Conformance with llama.cpp's own tokenizer suite: every `models/llama.cpp/ggml-vocab-*.gguf`
//! that has expected ids (`.gguf.out`, written by llama.cpp's `test-tokenizer-0`) must encode
//! each input (`.gguf.inp`) to exactly those ids, with `add_special = false` and
//! `parse_special = false`, as `test-tokenizer-0.cpp` does. That test checks ids only; this one
//! also decodes them back, and streams them (a reply's text as its ids come, one at a time,
//! must be the text of all of them at once).
//!
//! The data comes from `scripts/fetch-test-data`; without it these tests fail and say so.

use std::path::{Path, PathBuf};

use lmhost_plugin_kit::gguf::{Metadata, Value};
use lmhost_plugin_kit::text::ReplyText;
use lmhost_plugin_kit::tokenizer::TextTokenizer;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn suite_dir() -> PathBuf {
    let dir = root().join("models/llama.cpp");
    assert!(
        dir.join("ggml-vocab-llama-bpe.gguf.out").is_file(),
        "llama.cpp's vocab suite is not in {}: run scripts/fetch-test-data",
        dir.display()
    );
    dir
}

fn vocab_path(name: &str) -> PathBuf {
    suite_dir().join(format!("ggml-vocab-{name}.gguf"))
}

fn load(name: &str) -> TextTokenizer {
    let path = vocab_path(name);
    let meta = Metadata::read(&path).unwrap_or_else(|e| panic!("{e}"));
    TextTokenizer::from_gguf(&meta).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The inputs and expected ids, parsed as `read_tests` in test-tokenizer-0.cpp does: inputs
/// separated by "\n__ggml_vocab_test__\n", one line of ids per input. Its map keeps the last
/// expectation of a repeated input, so this does too.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let path = vocab_path(name);
    let read = |ext: &str| {
        let file = PathBuf::from(format!("{}.{ext}", path.display()));
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
    };
    let (inp, out) = (read("inp"), read("out"));
    let inputs = split_inputs(&inp);
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: inputs and outputs differ in number"
    );
    let mut cases: Vec<(String, Vec<u32>)> = Vec::new();
    for (input, line) in inputs.into_iter().zip(outputs) {
        let ids = line
            .split_whitespace()
            .map(|t| {
                t.parse()
                    .unwrap_or_else(|e| panic!("{name}: id {t:?}: {e}"))
            })
            .collect();
        cases.retain(|(seen, _)| *seen != input);
        cases.push((input, ids));
    }
    cases
}

fn split_inputs(raw: &str) -> Vec<String> {
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(at) => {
                inputs.push(rest[..at].to_string());
                rest = &rest[at + SEP.len()..];
            }
            None => {
                inputs.push(rest.to_string());
                rest = "";
            }
        }
    }
    inputs
}

/// The vocabularies llama.cpp's suite has expected ids for; all must match.
const EXPECTED: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// Runs one vocabulary's cases; returns a report line and the first mismatches.
fn check(name: &str) -> (String, Vec<String>) {
    let tokenizer = load(name);
    let cases = cases(name);
    let mut failures = Vec::new();
    let (mut passed, mut round_trips, mut streamed) = (0, 0, 0);
    for (input, expected) in &cases {
        let got = tokenizer
            .encode(input, false, false)
            .unwrap_or_else(|e| panic!("{name}: {input:?}: {e}"));
        passed += usize::from(&got == expected);
        if &got != expected {
            failures.push(format!(
                "{name}: {input:?}\n  expected {expected:?}\n  got      {got:?}"
            ));
        }
        // Detokenizing gives the input back wherever the vocabulary can represent it: every
        // vocabulary here but WordPiece, which lowercases and drops whitespace.
        let text = tokenizer.decode(expected, false).unwrap_or_default();
        round_trips += usize::from(&text == input);
        if &text != input && tokenizer.kind() != "bert" {
            failures.push(format!("{name}: {input:?} decodes to {text:?}"));
        }
        // A reply's text as its ids come, one at a time, is the text of all its ids at once.
        let mut reply = ReplyText::default();
        for n in 1..=expected.len() {
            let last = n == expected.len();
            reply
                .extend(&tokenizer, &expected[..n], last)
                .unwrap_or_else(|e| panic!("{name}: {input:?}: {e}"));
        }
        let whole = tokenizer.decode(expected, true).unwrap_or_default();
        streamed += usize::from(reply.as_str() == whole);
        if reply.as_str() != whole {
            failures.push(format!(
                "{name}: {input:?} streams as {:?}, decodes as {whole:?}",
                reply.as_str()
            ));
        }
    }
    let line = format!(
        "{name} ({}): {passed}/{n} ids, {round_trips}/{n} decode back to the input, \
         {streamed}/{n} stream as they decode",
        tokenizer.kind(),
        n = cases.len(),
    );
    (line, failures)
}

#[test]
fn every_vocab_encodes_as_llama_cpp_does() {
    // Loading the large vocabularies dominates; two threads halve the wait.
    let (left, right) = EXPECTED.split_at(EXPECTED.len() / 2);
    let results: Vec<(String, Vec<String>)> = std::thread::scope(|s| {
        let other = s.spawn(|| right.iter().map(|name| check(name)).collect::<Vec<_>>());
        let mut results: Vec<_> = left.iter().map(|name| check(name)).collect();
        results.extend(
            other
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e)),
        );
        results
    });
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (line, failed) in results {
        println!("{line}");
        report.push(line);
        failures.extend(failed.into_iter().take(3));
    }
    assert!(
        failures.is_empty(),
        "{}\n\n{}",
        report.join("\n"),
        failures.join("\n")
    );
}

#[test]
fn vocabs_without_expectations_load_or_are_refused_clearly() {
    for name in ["aquila", "baichuan", "gpt-neox"] {
        let tokenizer = load(name);
        assert!(
            tokenizer.encode("Hello world", true, false).is_ok(),
            "{name}"
        );
    }
    assert_eq!(
        load("aquila").kind(),
        "gpt2/default (no tokenizer.ggml.pre: degraded)"
    );
    let meta = Metadata::read(&vocab_path("nomic-bert-moe")).unwrap_or_else(|e| panic!("{e}"));
    let err = TextTokenizer::from_gguf(&meta)
        .expect_err("t5 is not supported")
        .to_string();
    assert!(err.contains("`tokenizer.ggml.model` is \"t5\""), "{err}");
}

#[test]
fn special_tokens_follow_llama_cpp() {
    let qwen = load("qwen2");
    let im_end = qwen.id("<|im_end|>").expect("<|im_end|>");
    assert!(qwen.eog_ids().contains(&im_end));
    assert_eq!(
        qwen.encode("<|im_start|>", false, true)
            .expect("encode")
            .len(),
        1
    );
    assert!(
        qwen.encode("<|im_start|>", false, false)
            .expect("encode")
            .len()
            > 1
    );
    let llama = load("llama-spm");
    assert_eq!(llama.encode("Hello", true, false).expect("encode")[0], 1);
    assert_eq!(llama.eog_ids(), [2]);
    let llama3 = load("llama-bpe");
    let eot = llama3.id("<|eot_id|>").expect("<|eot_id|>");
    assert!(llama3.eog_ids().contains(&eot));
    assert_eq!(llama3.encode("Hi", true, false).expect("encode")[0], 128000);
    let bert = load("bert-bge");
    let ids = bert.encode("hello", true, false).expect("encode");
    assert_eq!((ids[0], ids[ids.len() - 1]), (101, 102));
}

fn smollm2() -> Metadata {
    let path = root().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    Metadata::read(&path).unwrap_or_else(|e| panic!("{e} (the SmolLM2 GGUF is part of models/)"))
}

fn strings<'m>(meta: &'m Metadata, key: &str) -> Vec<&'m str> {
    let Some(Value::Array(items)) = meta.get(key) else {
        panic!("{key} is not an array");
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => s.as_str(),
            other => panic!("{key}: {other:?}"),
        })
        .collect()
}

/// The pipeline the candle backend built by hand before this crate: digits split one by one,
/// byte-level BPE, control and user-defined tokens added.
fn hand_built(meta: &Metadata) -> Tokenizer {
    let tokens = strings(meta, "tokenizer.ggml.tokens");
    let merges = strings(meta, "tokenizer.ggml.merges")
        .into_iter()
        .filter_map(|m| m.split_once(' '))
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .expect("BPE");
    let mut tokenizer = Tokenizer::new(bpe);
    let pre: Vec<PreTokenizerWrapper> = vec![
        Digits::new(true).into(),
        ByteLevel::new(false, true, true).into(),
    ];
    tokenizer.with_pre_tokenizer(Some(Sequence::new(pre)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let Some(Value::Array(types)) = meta.get("tokenizer.ggml.token_type") else {
        panic!("token types");
    };
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter_map(|(t, ty)| match ty {
            Value::I32(3) => Some(AddedToken::from(t.to_string(), true)),
            Value::I32(4) => Some(AddedToken::from(t.to_string(), false)),
            _ => None,
        })
        .collect();
    tokenizer.add_special_tokens(added).expect("added tokens");
    tokenizer
}

#[test]
fn smollm2_matches_the_hand_built_pipeline() {
    let meta = smollm2();
    let tokenizer = TextTokenizer::from_gguf(&meta).expect("SmolLM2 tokenizer");
    assert_eq!(tokenizer.kind(), "gpt2/smollm");
    assert_eq!(
        tokenizer
            .encode("<|im_start|>", false, true)
            .expect("encode"),
        [1]
    );
    assert_eq!(
        tokenizer.encode("<|im_end|>", false, true).expect("encode"),
        [2]
    );
    assert!(tokenizer.eog_ids().contains(&2));
    let question = "What is the capital of France?";
    let ids = tokenizer.encode(question, true, true).expect("encode");
    assert_eq!(tokenizer.decode(&ids, true).expect("decode"), question);
    let old = hand_built(&meta);
    for text in [
        question,
        "<|im_start|>user\nIn 1789, 12345 people paid 3.50€ each.<|im_end|>\n",
        "Ünïcödé naïve café — 東京 🦙 ...",
        "  spaces   and\ttabs\n\n\nnewlines 007",
    ] {
        let new = tokenizer.encode(text, false, true).expect("encode");
        let old = old.encode(text, false).expect("old encode");
        assert_eq!(new, old.get_ids(), "{text:?}");
    }
}

/// A continuation tokenizes as it does inside the whole text, in both families: SentencePiece
/// (whose space prefix belongs to the start of a text only) and byte-level BPE.
#[test]
fn continuations_have_their_tokens_in_the_whole_text() {
    for name in ["llama-spm", "phi-3", "llama-bpe", "qwen2"] {
        let tok = load(name);
        let (prompt, reply) = (
            "The capital of France is",
            " Paris, and Berlin is in Germany.",
        );
        let whole = tok
            .encode(&format!("{prompt}{reply}"), false, true)
            .expect("whole");
        let head = tok.encode(prompt, false, true).expect("prompt");
        let tail = tok.encode_continuation(reply).expect("continuation");
        assert_eq!(whole[head.len()..], tail[..], "{name}");
        assert_eq!([head, tail].concat(), whole, "{name}");
    }
}
