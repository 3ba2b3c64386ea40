//! Crash consistency of the run directory: `lmhost explain --run-dir` killed with SIGKILL at
//! many moments (most of a run is spent committing values, so many kills land mid-commit) and
//! resumed each time. The store must never be corrupt, never lose a value it held, never hold
//! a value other than the one an uninterrupted run computes for the same coalition, and the
//! resumed run must end with the uninterrupted run's explanation.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::Value;

mod common;

use common::repo;

/// The explanation of the mock's answer over the example's words, into `run_dir` and `json`.
fn explain(run_dir: &Path, json: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lmhost"));
    command
        .current_dir(repo())
        .args(["-q", "explain", "--config", "configs/mock.toml"])
        .args([
            "--conversation",
            "examples/conversation.json",
            "--players",
            "words",
        ])
        .args([
            "--estimator",
            "permutation",
            "--budget",
            "3000",
            "--batch-size",
            "2",
        ])
        .arg("--run-dir")
        .arg(run_dir)
        .arg("--json")
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Every stored value by (run key, prompt key), after SQLite's own integrity check.
fn stored(run_dir: &Path) -> HashMap<(String, String), f64> {
    let path = run_dir.join("values.sqlite");
    if !path.exists() {
        return HashMap::new();
    }
    let conn = Connection::open(&path).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "the store is corrupt");
    let mut rows = conn
        .prepare("SELECT run_key, prompt_key, value FROM coalition_values")
        .unwrap();
    rows.query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn values(json: &Path) -> Vec<f64> {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (report["players"].as_array().unwrap().iter())
        .map(|p| p["value"].as_f64().unwrap())
        .collect()
}

#[test]
fn a_run_killed_at_any_moment_resumes_losing_and_changing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (reference_dir, reference_json) = (dir.path().join("reference"), dir.path().join("r.json"));
    assert!(explain(&reference_dir, &reference_json)
        .status()
        .unwrap()
        .success());
    let reference = stored(&reference_dir);

    let (run_dir, json) = (dir.path().join("killed"), dir.path().join("k.json"));
    let mut held = HashMap::new();
    let mut kills = 0;
    // Kill moments from 20 to 800 ms, spread by a fixed linear congruential sequence.
    let mut state: u64 = 0x9E37_79B9;
    while kills < 24 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let delay = 20 + (state >> 33) % 780;
        let mut child = explain(&run_dir, &json).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        if child.try_wait().unwrap().is_some() {
            // Finished before the kill: start over, so every kill lands in a run.
            std::fs::remove_dir_all(&run_dir).unwrap();
            held.clear();
            continue;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        let now = stored(&run_dir);
        for (key, value) in &held {
            assert_eq!(
                now.get(key),
                Some(value),
                "kill {kills}: a stored value was lost"
            );
        }
        for (key, value) in &now {
            assert_eq!(
                reference.get(key),
                Some(value),
                "kill {kills}: a value differs"
            );
        }
        held = now;
    }
    assert!(explain(&run_dir, &json).status().unwrap().success());
    assert_eq!(stored(&run_dir), reference);
    assert_eq!(values(&json), values(&reference_json));
}
