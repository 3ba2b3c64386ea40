//! `lmhost explain` end to end through the real binary and the mock plugin library.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{repo, values};

const BIN: &str = env!("CARGO_BIN_EXE_lmhost");

fn example() -> PathBuf {
    repo().join("examples/conversation.json")
}

/// A mock config in `dir`, with extra backend options (one file per set of options).
fn config(dir: &Path, backend_options: &str) -> PathBuf {
    let name: String = backend_options
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let path = dir.join(format!("mock{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[backend]\nkind = \"mock\"\nmodel_id = \"mock-model\"\n[backend.options]\n\
             reply_words = 8\n{backend_options}\n[generation]\nmax_new_tokens = 32\n"
        ),
    )
    .unwrap();
    path
}

fn explain(config: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["-q", "explain", "--config"])
        .arg(config)
        .arg("--conversation")
        .arg(example())
        .args(extra)
        .output()
        .unwrap()
}

fn ok(output: Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "lmhost failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn exact_explanation_writes_every_json_field_and_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let table = ok(explain(
        &config(dir.path(), ""),
        &["--json", json.to_str().unwrap()],
    ));
    let doc = read_json(&json);
    for key in [
        "lmhost_version",
        "backend",
        "model_id",
        "reply",
        "reply_source",
        "settings",
        "conversation",
        "players",
        "v_all",
        "v_none",
        "efficiency",
        "coalitions",
        "tokens",
        "kv_cache",
        "wall_time_s",
    ] {
        assert!(doc.get(key).is_some(), "missing {key}: {doc}");
    }
    assert_eq!(doc["backend"], "mock");
    assert_eq!(doc["reply_source"], "generated");
    assert_eq!(doc["settings"]["estimator"], "exact");
    let players = doc["players"].as_array().unwrap();
    assert_eq!(players.len(), 8);
    for (i, p) in players.iter().enumerate() {
        assert_eq!(p["id"], format!("m{i}"));
        for key in [
            "text",
            "role",
            "turn",
            "message",
            "value",
            "std_error",
            "rank",
        ] {
            assert!(p.get(key).is_some(), "player missing {key}: {p}");
        }
        assert!(p["std_error"].is_null(), "exact has no standard error");
    }
    assert_eq!(doc["coalitions"]["planned"], 256);
    assert_eq!(
        doc["coalitions"]["evaluated"],
        doc["coalitions"]["unique_prompts"]
    );
    assert!(
        doc["efficiency"]["gap"].as_f64().unwrap().abs() < 1e-9,
        "{doc}"
    );
    let sum: f64 = values(&doc).iter().sum();
    let expected = doc["v_all"].as_f64().unwrap() - doc["v_none"].as_f64().unwrap();
    assert!((sum - expected).abs() < 1e-9);
    assert!(doc["kv_cache"]["enabled"].as_bool().unwrap());
    assert!(doc["tokens"]["prompt_tokens_reused"].as_u64().unwrap() > 0);
    // The terminal table: one row per player, nothing wider than 100 columns.
    assert!(
        table.contains("m7") && table.contains("efficiency"),
        "{table}"
    );
    for line in table.lines() {
        assert!(line.chars().count() <= 100, "too wide: {line}");
    }
}

#[test]
fn sampling_over_words_reports_standard_errors() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let args = [
        "--players",
        "words",
        "--turns=-1",
        "--roles",
        "user",
        "--estimator",
        "antithetic",
        "--budget",
        "200",
        "--seed",
        "3",
        "--absence",
        "pad",
        "--json",
        json.to_str().unwrap(),
    ];
    ok(explain(&config(dir.path(), ""), &args));
    let doc = read_json(&json);
    let players = doc["players"].as_array().unwrap();
    // The last turn: the user messages after the last assistant message.
    assert!(players
        .iter()
        .all(|p| p["message"].as_u64().unwrap() >= 5 && p["role"] == "user"));
    assert!(players
        .iter()
        .all(|p| p["id"].as_str().unwrap().contains(".w")));
    assert!(players.iter().all(|p| p["std_error"].as_f64().is_some()));
    assert!(doc["efficiency"].is_null());
    assert_eq!(doc["settings"]["absence"], "pad");
}

/// nlp-shap's normalizers change what the reports show, never the values: the JSON keeps each
/// `value` as computed and adds the shown ones, which the table prints; `min_max`'s sum to one.
#[test]
fn normalizers_change_the_shown_values_only() {
    let dir = tempfile::tempdir().unwrap();
    let mock = config(dir.path(), "");
    let run = |normalize: &str| {
        let json = dir.path().join(format!("{normalize}.json"));
        let args = ["--normalize", normalize, "--json", json.to_str().unwrap()];
        let table = ok(explain(&mock, &args));
        (read_json(&json), table)
    };
    let (plain, _) = run("identity");
    assert!(plain["normalized"].is_null());
    let (doc, table) = run("abs_sum");
    assert_eq!(doc["players"], plain["players"]);
    let raw = values(&doc);
    let total: f64 = raw.iter().map(|v| v.abs()).sum();
    let shown: Vec<f64> = serde_json::from_value(doc["normalized"].clone()).unwrap();
    assert_eq!(shown.len(), raw.len());
    for (shown, raw) in shown.iter().zip(&raw) {
        assert!(
            (shown - raw / total).abs() < 1e-12,
            "{shown} vs {raw} / {total}"
        );
    }
    assert!(table.contains("· shown abs_sum"), "{table}");
    let (doc, table) = run("min_max");
    let shown: Vec<f64> = serde_json::from_value(doc["normalized"].clone()).unwrap();
    assert!((shown.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{shown:?}");
    assert!(shown.iter().all(|&v| v >= 0.0));
    assert!(table.contains("· shown min_max"), "{table}");
    let bad = explain(
        &mock,
        &["--normalize", "power_shift", "--normalize-power", "0"],
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("`normalize_power` must be a number > 0. Given: 0"),
        "{stderr}"
    );
}

#[test]
fn too_many_players_for_exact_fails_naming_the_sampling_estimator() {
    let dir = tempfile::tempdir().unwrap();
    let output = explain(&config(dir.path(), ""), &["--players", "words"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("antithetic") && stderr.contains("max_exact_players"),
        "{stderr}"
    );
}

#[test]
fn html_report_is_one_self_contained_page() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("out.html");
    ok(explain(
        &config(dir.path(), ""),
        &["--html", html.to_str().unwrap()],
    ));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("When does the museum open on Saturday?"));
    assert!(page.contains("class=\"p\""), "players are shaded");
    assert!(
        page.contains("id=\"per-token\""),
        "the token map's matrix is inline"
    );
    let lower = page.to_lowercase();
    for external in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "href='http",
        "<link",
        "<script src",
        "url(",
    ] {
        assert!(!lower.contains(external), "external asset: {external}");
    }
}

fn stored(run_dir: &Path) -> i64 {
    let db = run_dir.join("values.sqlite");
    if !db.exists() {
        return 0;
    }
    let Ok(conn) = rusqlite::Connection::open(&db) else {
        return 0;
    };
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.query_row("SELECT COUNT(*) FROM coalition_values", [], |r| r.get(0))
        .unwrap_or(0)
}

#[test]
fn a_killed_run_resumes_without_recomputing_and_matches_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let slow = config(dir.path(), "latency_ms = 25");
    let run_dir = dir.path().join("run");
    let mut child = Command::new(BIN)
        .args(["-q", "explain", "--config"])
        .arg(&slow)
        .arg("--conversation")
        .arg(example())
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until part of the run is stored, then kill it mid-run.
    let deadline = Instant::now() + Duration::from_secs(300);
    while stored(&run_dir) < 40 && Instant::now() < deadline {
        sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let done = stored(&run_dir);
    assert!(done >= 40, "the run never stored values");
    assert!(
        done < 256,
        "the run finished before the kill; nothing to resume"
    );

    let json = dir.path().join("resumed.json");
    let args = [
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ];
    ok(explain(&slow, &args));
    let resumed = read_json(&json);
    let unique = resumed["coalitions"]["unique_prompts"].as_i64().unwrap();
    assert_eq!(
        resumed["coalitions"]["reused_from_run_dir"]
            .as_i64()
            .unwrap(),
        done
    );
    assert_eq!(
        resumed["coalitions"]["evaluated"].as_i64().unwrap(),
        unique - done
    );
    assert_eq!(resumed["reply_source"], "run_dir");
    assert_eq!(stored(&run_dir), unique);

    let fresh = dir.path().join("fresh.json");
    ok(explain(
        &config(dir.path(), ""),
        &["--json", fresh.to_str().unwrap()],
    ));
    let fresh = read_json(&fresh);
    assert_eq!(values(&resumed), values(&fresh));
    assert_eq!(resumed["v_all"], fresh["v_all"]);

    // A third run computes nothing.
    ok(explain(&slow, &args));
    assert_eq!(read_json(&json)["coalitions"]["evaluated"], 0);
}

#[test]
fn bad_flags_and_files_fail_with_a_named_cause() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let output = explain(&cfg, &["--estimator", "lime"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr)
        .contains("exact, permutation, antithetic, msr, loo, kernel, lasso"));
    let output = explain(&cfg, &["--turns", "9"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("turn 9 does not exist"));
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "x").unwrap();
    let output = explain(&cfg, &["--run-dir", not_a_dir.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("run directory"));
}

#[test]
fn sampled_runs_report_trust_on_held_out_coalitions_and_exact_runs_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let run = |extra: &[&str]| {
        let json = dir.path().join("trust.json");
        let mut args = vec!["--json", json.to_str().unwrap()];
        args.extend_from_slice(extra);
        let table = ok(explain(&cfg, &args));
        (read_json(&json), table)
    };
    let sampled = ["--estimator", "antithetic", "--budget", "64"];
    let (doc, table) = run(&sampled);
    let trust = &doc["trust"];
    assert_eq!(trust["holdout"], 16, "{doc}");
    assert_eq!(doc["settings"]["holdout"], 16);
    let spearman = trust["spearman"].as_f64().unwrap();
    assert!((-1.0..=1.0).contains(&spearman), "{trust}");
    assert!(trust["r_squared"].as_f64().unwrap() <= 1.0, "{trust}");
    assert!(
        table.contains("trust on 16 held-out coalitions: Spearman (LDS)"),
        "{table}"
    );
    let html = dir.path().join("trust.html");
    ok(explain(
        &cfg,
        &[&sampled[..], &["--html", html.to_str().unwrap()]].concat(),
    ));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<p class=\"meta\" id=\"trust\">trust on 16"),
        "{page}"
    );

    // Held-out coalitions are evaluated with the rest; without them the estimate is the same.
    let (off, table) = run(&[&sampled[..], &["--holdout", "0"]].concat());
    assert!(off["trust"].is_null(), "{off}");
    assert!(!table.contains("trust"), "{table}");
    assert_eq!(values(&off), values(&doc));
    assert!(
        off["coalitions"]["unique_prompts"].as_u64()
            <= doc["coalitions"]["unique_prompts"].as_u64()
    );

    let (exact, table) = run(&["--holdout", "32"]);
    assert!(exact["trust"].is_null(), "{exact}");
    assert!(!table.contains("trust"), "{table}");

    let output = explain(&cfg, &["--estimator", "kernel", "--holdout", "2"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("`holdout` must be 0 (off) or >= 3"));
}

/// `--players auto`: the messages, then the strongest player refined level by level down to
/// words, each level's players parts of one player of the level before (exact: each level
/// efficient); `--reanalyze` replays the same levels from the run directory.
#[test]
fn auto_players_refine_the_strongest_down_to_words_and_reanalyze_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let (json, again) = (dir.path().join("auto.json"), dir.path().join("again.json"));
    let run_dir = dir.path().join("run");
    let mock = config(dir.path(), "");
    let args = |json: &Path| {
        vec![
            "--players".to_string(),
            "auto".into(),
            "--run-dir".into(),
            run_dir.to_string_lossy().into_owned(),
            "--json".into(),
            json.to_string_lossy().into_owned(),
        ]
    };
    let table = ok(explain(
        &mock,
        &args(&json).iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert!(table.contains("refined m"), "{table}");
    let doc = read_json(&json);
    let levels = doc["refinements"].as_array().unwrap();
    assert!(levels.len() >= 2, "{doc}");
    let mut previous = doc["players"].as_array().unwrap().clone();
    for level in levels {
        let refined = level["refined"].as_array().unwrap();
        assert_eq!(refined.len(), 1, "one player refined a level by default");
        let parent = previous
            .iter()
            .find(|p| p["id"] == refined[0])
            .expect("the refined player is one of the level before");
        let players = level["players"].as_array().unwrap();
        assert!((2..=4).contains(&players.len()), "{level}");
        for p in players {
            assert_eq!(p["parent"], parent["id"]);
            assert_eq!(p["message"], parent["message"]);
            let (part, whole) = (
                p["text"].as_str().unwrap(),
                parent["text"].as_str().unwrap(),
            );
            assert!(whole.contains(part), "{part:?} is not part of {whole:?}");
        }
        let sum: f64 = players.iter().map(|p| p["value"].as_f64().unwrap()).sum();
        let effect = level["v_all"].as_f64().unwrap() - level["v_none"].as_f64().unwrap();
        assert!((sum - effect).abs() < 1e-9, "{sum} vs {effect}");
        previous = players.clone();
    }
    assert!(previous
        .iter()
        .all(|p| p["id"].as_str().unwrap().contains(".w")));

    let mut replay = args(&again);
    replay.push("--reanalyze".into());
    ok(explain(
        &mock,
        &replay.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    assert_eq!(read_json(&again)["refinements"], doc["refinements"]);
}
