//! A conversation with an image through the `lmhost` binary and `lmhost serve` on each tiny
//! vision-language model (a random Gemma 3 and a random Idefics3 that `scripts/vlm-reference.py`
//! wrote, whose scores the candle backend's tests check against Transformers): generate, score
//! and explain with message players, tokenize with each position's modality, and a chat
//! completion with an `image_url`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use serde_json::{json, Value};

mod common;

use common::{explain_json, post, repo, values, TestServer, MODEL};

const GEMMA3: &str = "tiny-gemma3-vlm";
const IDEFICS3: &str = "tiny-idefics3-vlm";

fn model(vlm: &str) -> PathBuf {
    repo().join("plugins/candle/tests/data").join(vlm)
}

fn config(vlm: &str) -> String {
    format!(
        "[backend]\nkind = \"candle\"\nmodel_id = \"{}\"\n[backend.options]\nweights = \"f32\"\n\
         [generation]\nmax_new_tokens = 4\ntemperature = 0.0\n",
        model(vlm).display()
    )
}

/// A config and a conversation (a system message, then the noise image and a question) in `dir`.
fn files(vlm: &str, dir: &Path) -> (PathBuf, PathBuf) {
    let config = dir.join("vlm.toml");
    std::fs::write(&config, self::config(vlm)).unwrap();
    let content = json!([
        {"type": "image", "path": model(vlm).join("noise.png")},
        {"type": "text", "text": "What is this?"},
    ]);
    let messages = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": content},
    ]});
    let conversation = dir.join("image.json");
    std::fs::write(&conversation, messages.to_string()).unwrap();
    (config, conversation)
}

/// Runs `lmhost -q <args>`, which must succeed.
fn lmhost(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .arg("-q")
        .args(args)
        .output()
        .expect("lmhost runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    output
}

#[test]
fn gemma3_generates_scores_and_explains_a_conversation_with_an_image() {
    // The image is 4 soft tokens between its 2 markers, in one view.
    converse_about_an_image(GEMMA3, 6, json!([{"tokens": 4, "patches": 1}]));
}

#[test]
fn idefics3_generates_scores_and_explains_a_conversation_with_an_image() {
    // 2x2 tiles and the global view, 4 placeholders each, behind their markers: each tile's
    // <fake_token_around_image> and <row_r_col_c>, a newline after each row, a blank line,
    // then <fake_token_around_image><global-img>, the placeholders, <fake_token_around_image>.
    converse_about_an_image(
        IDEFICS3,
        4 * 6 + 2 + 7,
        json!([{"tokens": 20, "patches": 5}]),
    );
}

/// Generate, tokenize, score and explain the conversation of [`files`] on `vlm`, whose image
/// takes `positions` prompt positions and is counted as `images`.
fn converse_about_an_image(vlm: &str, positions: usize, images: Value) {
    let dir = tempfile::tempdir().unwrap();
    let (config, conversation) = files(vlm, dir.path());
    let (config, conversation) = (config.to_str().unwrap(), conversation.to_str().unwrap());
    let with = |command: &str, extra: &[&str]| {
        let mut args = vec![command, "--config", config, "--conversation", conversation];
        args.extend(extra);
        lmhost(&args)
    };
    let record: Value = serde_json::from_slice(&with("generate", &["--json"]).stdout).unwrap();
    assert!(
        !record["token_ids"].as_array().unwrap().is_empty(),
        "{record}"
    );
    // The image's placeholders and its markers are part of the prompt.
    assert!(
        record["prompt_tokens"].as_u64().unwrap() > positions as u64 + 6,
        "{record}"
    );
    let tokens: Value = serde_json::from_slice(&with("tokenize", &["--json"]).stdout).unwrap();
    let image = tokens["mm_token_type_ids"].as_array().unwrap();
    assert_eq!(
        image.iter().filter(|m| m.as_u64() == Some(1)).count(),
        positions,
        "{tokens}"
    );
    assert_eq!(tokens["images"], images);
    let scored: Value =
        serde_json::from_slice(&with("score", &["--reply", "It is red.", "--json"]).stdout)
            .unwrap();
    assert_eq!(scored["logprobs"].as_array().unwrap().len(), 4, "{scored}");
    // Exact Shapley of the reply, with `extra` flags.
    let explain = |extra: &[&str]| {
        let mut args = vec![
            "--config",
            config,
            "--conversation",
            conversation,
            "--reply",
            "It is red.",
            "--estimator",
            "exact",
        ];
        args.extend(extra);
        explain_json(&dir.path().join("e.json"), &args)
    };
    let report = explain(&[]);
    let players = report["players"].as_array().unwrap();
    assert_eq!(players.len(), 2, "{report}");
    assert_eq!(players[1]["text"], "[image 80x60] What is this?");
    let gap = report["efficiency"]["gap"].as_f64().unwrap();
    let total: f64 = values(&report).iter().sum();
    assert!(gap.abs() < 1e-4 && total.abs() > 0.0, "{report}");
    // The image's 2 x 2 cells as players, painted gray or hidden from attention.
    for absence in ["delete", "hide"] {
        let report = explain(&[
            "--image-players",
            "grid",
            "--grid",
            "2x2",
            "--absence",
            absence,
        ]);
        let players = report["players"].as_array().unwrap();
        assert_eq!(players.len(), 6, "{absence}: {report}");
        assert_eq!(players[5]["id"], "m1.i0.r3", "{absence}");
        assert_eq!(players[5]["box"], json!([40, 30, 80, 60]), "{absence}");
        let gap = report["efficiency"]["gap"].as_f64().unwrap();
        assert!(gap.abs() < 1e-4, "{absence}: {report}");
    }
}

/// Tiny Gemma 3's image is 2 x 2 soft tokens: a 4 x 4 grid hidden from attention would split
/// each token's cell into four regions it cannot tell apart, so it is refused naming the
/// setting; painting the same cells works (each is painted on the pixels).
#[test]
fn a_grid_finer_than_the_image_tokens_is_refused_under_hide() {
    let dir = tempfile::tempdir().unwrap();
    let (config, conversation) = files(GEMMA3, dir.path());
    let run = |absence: &str| {
        Command::new(env!("CARGO_BIN_EXE_lmhost"))
            .args(["-q", "explain", "--config"])
            .arg(&config)
            .arg("--conversation")
            .arg(&conversation)
            .args([
                "--reply",
                "It is red.",
                "--image-players",
                "grid",
                "--grid",
                "4x4",
            ])
            .args(["--estimator", "loo", "--absence", absence])
            .output()
            .expect("lmhost runs")
    };
    let hidden = run("hide");
    let stderr = String::from_utf8_lossy(&hidden.stderr);
    assert!(!hidden.status.success());
    assert!(
        stderr.contains("cover the same 1 image tokens") && stderr.contains("fewer `grid` cells"),
        "{stderr}"
    );
    let painted = run("delete");
    assert!(
        painted.status.success(),
        "{}",
        String::from_utf8_lossy(&painted.stderr)
    );
}

/// Image players on the default text-only model (a GGUF file) are refused before any work,
/// naming the setting and the backends that see images.
#[test]
fn image_players_on_a_text_only_model_are_refused_by_setting() {
    let dir = tempfile::tempdir().unwrap();
    let (_, conversation) = files(GEMMA3, dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .current_dir(repo())
        .args([
            "-q",
            "explain",
            "--config",
            "configs/default.toml",
            "--conversation",
        ])
        .arg(&conversation)
        .args(["--reply", "It is red.", "--image-players", "grid"])
        .output()
        .expect("lmhost runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("`image_players = \"grid\"` needs a backend that sees images (candle with Gemma 3 or SmolVLM"),
        "{stderr}"
    );
}

#[test]
fn serve_answers_a_chat_with_an_image_url() {
    for vlm in [GEMMA3, IDEFICS3] {
        answer_a_chat_with_an_image_url(vlm);
    }
}

fn answer_a_chat_with_an_image_url(vlm: &str) {
    let server = TestServer::start(&config(vlm), |_| {});
    let png = std::fs::read(model(vlm).join("flat.png")).unwrap();
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    let content = json!([
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is this?"},
    ]);
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
    });
    let answer = post(&server.url("/v1/chat/completions"), &body.to_string());
    assert_eq!(answer.status, 200, "{vlm}: {}", answer.body);
    let reply = answer.json();
    assert!(
        reply["choices"][0]["message"]["content"].is_string(),
        "{reply}"
    );
    assert!(
        reply["usage"]["prompt_tokens"].as_u64().unwrap() > 10,
        "{reply}"
    );
}
