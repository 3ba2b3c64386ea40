//! `lmhost generate` and `explain` on the README's audio example: Whisper tiny.en through the
//! candle plugin library, found beside the executable as a user runs it.

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

/// One-second windows of the spoken sentence hidden from Whisper's cross-attention: every
/// window of speech helps the true transcript, and the exact values add up to what hearing
/// nothing costs it.
#[test]
fn explain_hides_audio_windows_from_whisper() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("e.json");
    let output = lmhost(&[
        "-q",
        "explain",
        "--config",
        "configs/whisper.toml",
        "--conversation",
        "examples/audio.json",
        "--reply",
        SPOKEN,
        "--audio-players",
        "windows",
        "--audio-window",
        "1",
        "--absence",
        "hide",
        "--estimator",
        "exact",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let players = report["players"].as_array().unwrap();
    assert_eq!(players.len(), 5, "4.8 s in 1 s windows: {report}");
    assert_eq!(
        (players[4]["id"].as_str(), players[4]["start"].as_f64()),
        (Some("m0.a4"), Some(4.0))
    );
    let values: Vec<f64> = players
        .iter()
        .map(|p| p["value"].as_f64().unwrap())
        .collect();
    assert!(values.iter().all(|&v| v > 1.0), "{values:?}");
    let (all, none) = (
        report["v_all"].as_f64().unwrap(),
        report["v_none"].as_f64().unwrap(),
    );
    assert!(none < all - 20.0, "hearing nothing: {none} vs {all}");
    let total: f64 = values.iter().sum();
    assert!(
        (total - (all - none)).abs() < 1e-6,
        "{total} vs {}",
        all - none
    );
}
