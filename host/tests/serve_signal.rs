//! The `lmhost serve` binary: SIGTERM stops it gracefully, finishing the request in flight, and
//! after the grace period stops the generations still running.
#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{post, MODEL};

#[test]
fn sigterm_finishes_the_request_in_flight_then_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("slow.toml");
    std::fs::write(&config, common::mock_config(1500)).unwrap();
    let (mut child, base, _stderr) = start(&config, &[]);
    let url = format!("{base}/v1/chat/completions");
    let body =
        serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "stay"}]});
    let request = std::thread::spawn(move || post(&url, &body.to_string()));
    await_metric(
        &base,
        "lmhost_queue_in_flight 1",
        "the request never reached the queue",
    );
    sigterm(&child);
    let answer = request.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        child.wait().unwrap().success(),
        "lmhost serve exits 0 after SIGTERM"
    );
}

/// `lmhost serve` on `config` with `args`, its base URL and its stderr (kept open: a closed
/// pipe would fail the server's log writes).
fn start(
    config: &std::path::Path,
    args: &[&str],
) -> (
    std::process::Child,
    String,
    BufReader<std::process::ChildStderr>,
) {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .args(["serve", "--port", "0", "--config"])
        .arg(config)
        .args(args)
        .env("LMHOST_PLUGIN_PATH", &deps)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    let base = banner
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .trim_end_matches("/v1")
        .to_string();
    (child, base, stderr)
}

#[test]
fn after_the_grace_period_running_generations_are_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("decoding.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"mock\"\nmodel_id = \"{MODEL}\"\n\
             [backend.options]\nreply_words = 400\ntoken_latency_ms = 20\n"
        ),
    )
    .unwrap();
    let (mut child, base, _stderr) = start(&config, &["--grace-s", "0"]);
    let url = format!("{base}/v1/chat/completions");
    let body = serde_json::json!({
        "model": MODEL,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "a b c d"}],
    });
    let request = std::thread::spawn(move || post(&url, &body.to_string()));
    await_metric(
        &base,
        "lmhost_requests_running 1",
        "the request never started",
    );
    sigterm(&child);
    let answer = request.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json();
    assert_eq!(json["choices"][0]["finish_reason"], "length");
    let words = json["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(words < 400, "the generation ran to its end ({words} words)");
    assert!(child.wait().unwrap().success(), "lmhost serve exits 0");
}

/// Polls `/metrics` until it shows `line`.
fn await_metric(base: &str, line: &str, never: &str) {
    let metrics = format!("{base}/metrics");
    let seen = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        common::get(&metrics).body.contains(line)
    });
    assert!(seen, "{never}");
}

fn sigterm(child: &std::process::Child) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}
