//! An application that links candle, onnx, openai and mock in-process (this test binary, built
//! with those features by `scripts/test`) gets the same answers from each as from its plugin
//! library: generation, streaming, scoring, tokenizing and an explanation.

mod common;

use common::repo;

use std::path::{Path, PathBuf};

use common::TestServer;
use lmhost::{conversation, Backend, Config, Host, Message, Origin, Role, RunOptions};

/// Where cargo put the plugin libraries: beside this test binary.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

fn config(toml: &str) -> Config {
    let mut config = Config::parse(toml, Path::new("bundled.toml")).unwrap();
    config.plugin_dirs = vec![library_dir()];
    config.generation.max_new_tokens = 8;
    config
}

/// The backend `config` names, in-process and from its library, each checked for its origin.
fn both(config: &Config) -> (Backend, Backend) {
    let kind = &config.backend.kind;
    let dirs = [library_dir()];
    let bundled = Host::new();
    let (_, origin) = bundled.registry().find(kind, &dirs).unwrap();
    assert_eq!(origin, Origin::InProcess, "{kind} is compiled in");
    let libraries = Host::empty();
    let (_, origin) = libraries.registry().find(kind, &dirs).unwrap();
    assert!(matches!(origin, Origin::Library(_)), "{kind}: {origin:?}");
    (
        bundled.open(config).unwrap(),
        libraries.open(config).unwrap(),
    )
}

/// Every request the host makes, on both backends: the answers must match.
fn same_answers(config: &Config) {
    let (in_process, library) = both(config);
    let chat = conversation::from_messages([
        Message::text(Role::System, "Answer in one word."),
        Message::text(Role::User, "The sky is blue today."),
        Message::text(Role::User, "What colour is the sky?"),
    ])
    .unwrap();
    let generation = &config.generation;
    let kind = &config.backend.kind;

    let answer = in_process.generate(&chat, generation).unwrap();
    let expected = library.generate(&chat, generation).unwrap();
    assert_eq!(answer.text, expected.text, "{kind}: generate");
    assert_eq!(answer.token_ids, expected.token_ids, "{kind}: generate");
    assert!(!answer.text.is_empty(), "{kind}: an answer");

    let mut streamed = String::new();
    in_process
        .generate_stream(&chat, generation, |delta| {
            streamed.push_str(&delta.text);
            true
        })
        .unwrap();
    assert_eq!(streamed, answer.text.as_str(), "{kind}: streaming");

    let score = in_process.score(&chat, &answer.text).unwrap();
    let expected = library.score(&chat, &answer.text).unwrap();
    assert_eq!(score.token_ids, expected.token_ids, "{kind}: score");
    close(&score.logprobs, &expected.logprobs, kind);

    let tokens = in_process.tokenize(&chat, true).unwrap();
    assert_eq!(tokens, library.tokenize(&chat, true).unwrap(), "{kind}");

    let options = RunOptions {
        reply: Some(answer.text.to_string()),
        ..RunOptions::default()
    };
    let run = |backend| lmhost::explain_run::run(config, backend, &chat, &options).unwrap();
    let (ours, theirs) = (run(&in_process), run(&library));
    let values = |o: &lmhost::Outcome| -> Vec<f32> {
        o.explanation
            .attributions
            .iter()
            .map(|a| a.value as f32)
            .collect()
    };
    assert_eq!(ours.explanation.attributions.len(), 3, "{kind}: players");
    close(&values(&ours), &values(&theirs), kind);
}

fn close(ours: &[f32], theirs: &[f32], kind: &str) {
    assert_eq!(ours.len(), theirs.len(), "{kind}");
    for (a, b) in ours.iter().zip(theirs) {
        assert!((a - b).abs() < 1e-4, "{kind}: {ours:?} vs {theirs:?}");
    }
}

fn with_messages(toml: &str) -> String {
    format!("{toml}\n[explanation]\nplayers = \"messages\"\n")
}

#[test]
fn mock_in_process_matches_its_library() {
    same_answers(&config(&with_messages(
        "[backend]\nkind = \"mock\"\nmodel_id = \"m\"\n",
    )));
}

#[test]
fn candle_in_process_matches_its_library() {
    let gguf = repo().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "run scripts/fetch-models");
    same_answers(&config(&with_messages(&format!(
        "[backend]\nkind = \"candle\"\nmodel_id = {:?}\n",
        gguf.display().to_string()
    ))));
}

#[test]
fn onnx_in_process_matches_its_library() {
    let export = repo().join("models/smollm2-onnx");
    let runtime = repo().join("models/onnxruntime/libonnxruntime.so.1.32.0");
    assert!(
        export.exists() && runtime.exists(),
        "run scripts/setup-onnx"
    );
    same_answers(&config(&with_messages(&format!(
        "[backend]\nkind = \"onnx\"\nmodel_id = {:?}\n[backend.options]\nort_library = {:?}\n",
        export.display().to_string(),
        runtime.display().to_string()
    ))));
}

#[test]
fn openai_in_process_matches_its_library() {
    let server = TestServer::mock(0, |_| {});
    let dir = tempfile::tempdir().unwrap();
    // `lmhost serve` publishes no chat template; scoring renders chat with this one.
    let template = dir.path().join("lines.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
         {% if add_generation_prompt %}assistant:\n{% endif %}",
    )
    .unwrap();
    same_answers(&config(&with_messages(&format!(
        "[backend]\nkind = \"openai\"\nmodel_id = \"{}\"\n[backend.options]\nbase_url = {:?}\n\
         chat_template = {:?}\n",
        common::MODEL,
        server.url("/v1"),
        template.display().to_string()
    ))));
}
