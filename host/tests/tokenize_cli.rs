//! `lmhost tokenize` and `detokenize` as a user runs them, on files that hold a tokenizer and
//! no model lmhost runs: every vocabulary of llama.cpp's own tokenizer suite
//! (`models/llama.cpp/ggml-vocab-*.gguf`, vocabulary-only GGUFs of architectures from GPT-2 to
//! Qwen 3.5, from `scripts/fetch-test-data`). The candle backend reads only the tokenizer for
//! these commands, so each must reproduce llama.cpp's expected ids (`.gguf.out`, written by
//! its `test-tokenizer-0`, `add_special = false`) for every input (`.gguf.inp`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::repo;

/// The vocabularies the suite has expected ids for (a `.gguf.out` beside the `.gguf`).
fn vocabularies() -> Vec<String> {
    let dir = repo().join("models/llama.cpp");
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/fetch-test-data", dir.display()));
    let mut names: Vec<String> = entries
        .filter_map(|entry| {
            let file = entry.ok()?.file_name().into_string().ok()?;
            let name = file
                .strip_prefix("ggml-vocab-")?
                .strip_suffix(".gguf.out")?;
            Some(name.to_string())
        })
        .collect();
    names.sort();
    names
}

fn vocab(name: &str) -> PathBuf {
    let path = repo().join(format!("models/llama.cpp/ggml-vocab-{name}.gguf"));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-test-data",
        path.display()
    );
    path
}

/// A config naming `model` for the candle backend, found beside the test's `lmhost`.
fn config(dir: &Path, name: &str, model: &Path) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = format!("[backend]\nkind = \"candle\"\nmodel_id = {model:?}\n");
    std::fs::write(&path, text).unwrap();
    path
}

fn lmhost(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .arg("-q")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("lmhost runs")
}

/// The suite's inputs and expected ids, read as `test-tokenizer-0.cpp` reads them: inputs
/// separated by "\n__ggml_vocab_test__\n", a line of ids each; a repeated input keeps its last.
fn cases(model: &Path) -> Vec<(String, Vec<u32>)> {
    let read = |ext: &str| std::fs::read_to_string(format!("{}.{ext}", model.display())).unwrap();
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let (inputs, outputs) = (read("inp"), read("out"));
    let inputs: Vec<&str> = inputs
        .strip_suffix(SEP)
        .unwrap_or(&inputs)
        .split(SEP)
        .collect();
    let outputs: Vec<&str> = outputs.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "{}", model.display());
    let mut cases: Vec<(String, Vec<u32>)> = Vec::new();
    for (input, line) in inputs.into_iter().zip(outputs) {
        let ids = line
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        cases.retain(|(seen, _)| seen != input);
        cases.push((input.to_string(), ids));
    }
    cases
}

/// Each input through `lmhost tokenize --raw --no-special --json --prompt=…`; the mismatches.
fn mismatches(dir: &Path, name: &str) -> Vec<String> {
    let model = vocab(name);
    let config = config(dir, name, &model);
    let mut failed = Vec::new();
    for (input, expected) in cases(&model) {
        let prompt = format!("--prompt={input}");
        let args = ["tokenize", "--raw", "--no-special", "--json", &prompt];
        let output = lmhost(&config, &args);
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            failed.push(format!("{name}: {input:?}: {stderr}"));
            continue;
        }
        let record: Value = serde_json::from_slice(&output.stdout).unwrap();
        let ids: Vec<u32> = serde_json::from_value(record["token_ids"].clone()).unwrap();
        if ids != expected {
            failed.push(format!(
                "{name}: {input:?}\n  expected {expected:?}\n  got {ids:?}"
            ));
        }
    }
    failed
}

#[test]
fn every_vocabulary_of_llama_cpps_suite_tokenizes_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let vocabularies = vocabularies();
    assert_eq!(vocabularies.len(), 15, "{vocabularies:?}");
    // Two processes at a time: each run loads a vocabulary of up to 262k tokens.
    let (left, right) = vocabularies.split_at(vocabularies.len() / 2);
    let failed: Vec<String> = std::thread::scope(|s| {
        let other = s.spawn(|| {
            let failed: Vec<String> = right
                .iter()
                .flat_map(|n| mismatches(dir.path(), n))
                .collect();
            failed
        });
        let mut failed: Vec<String> = left
            .iter()
            .flat_map(|n| mismatches(dir.path(), n))
            .collect();
        failed.extend(
            other
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e)),
        );
        failed
    });
    assert!(
        failed.is_empty(),
        "{} mismatches:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A vocabulary-only GGUF of an architecture lmhost does not run detokenizes too, and the
/// commands that need the model say which architecture they could not load.
#[test]
fn a_vocabulary_only_file_detokenizes_and_generation_names_the_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "gpt-2", &vocab("gpt-2"));
    let output = lmhost(&config, &["detokenize", "15496,995", "--json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let record: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(record["text"], "Hello world");
    let output = lmhost(&config, &["generate", "--raw", "--prompt", "Hello"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("unknown architecture \"gpt2\""), "{stderr}");
}
