//! `lmhost generate` on the README's audio example: Whisper tiny.en through the candle plugin
//! library, found beside the executable as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

const SPOKEN: &str = "We will meet at the library on Monday morning to discuss the new project.";

fn lmhost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("lmhost runs")
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn the_audio_example_prints_a_transcript() {
    let output = lmhost(&[
        "generate",
        "--config",
        "configs/whisper.toml",
        "--conversation",
        "examples/audio.json",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let text = String::from_utf8_lossy(&output.stdout);
    let heard = words(&text);
    let truth = words(SPOKEN);
    let found = truth.iter().filter(|w| heard.contains(w)).count();
    assert!(
        found as f64 / truth.len() as f64 >= 0.7,
        "transcript {text:?} shares {found} of {} words with {SPOKEN:?}",
        truth.len()
    );
}

#[test]
fn a_text_only_conversation_to_whisper_says_it_needs_audio() {
    let output = lmhost(&[
        "generate",
        "--config",
        "configs/whisper.toml",
        "--prompt",
        "hello",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid_input") && stderr.contains("needs an audio part"),
        "{stderr}"
    );
}
