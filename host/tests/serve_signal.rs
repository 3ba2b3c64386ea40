//! The `lmhost serve` binary: SIGTERM stops it gracefully, finishing the request in flight.
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
    // The mock cdylib sits next to this test executable (target/*/deps).
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .args(["serve", "--port", "0", "--config"])
        .arg(&config)
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
    let url = format!("{base}/v1/chat/completions");
    let body =
        serde_json::json!({"model": MODEL, "messages": [{"role": "user", "content": "stay"}]});
    let request = std::thread::spawn(move || post(&url, &body.to_string()));
    let metrics = format!("{base}/metrics");
    let admitted = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        common::get(&metrics)
            .body
            .contains("lmhost_queue_in_flight 1")
    });
    assert!(admitted, "the request never reached the queue");
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let answer = request.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        child.wait().unwrap().success(),
        "lmhost serve exits 0 after SIGTERM"
    );
}
