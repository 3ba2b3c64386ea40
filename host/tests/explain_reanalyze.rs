//! `lmhost explain --reanalyze` through the real binary and the mock plugin: attributions from a
//! run directory's values alone, equal to a normal run's, or an error naming what is missing;
//! and runs that stop early, which reanalysis replays.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_lmhost");

/// The user messages of the example conversation: 5 players, 32 coalitions.
const PLAYERS: [&str; 2] = ["--roles", "user"];

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/conversation.json")
}

fn config(dir: &Path) -> PathBuf {
    let path = dir.join("mock.toml");
    std::fs::write(
        &path,
        "[backend]\nkind = \"mock\"\nmodel_id = \"mock-model\"\n[backend.options]\n\
         reply_words = 8\n[generation]\nmax_new_tokens = 32\n",
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
        .args(PLAYERS)
        .args(extra)
        .output()
        .unwrap()
}

/// Runs with `--json` into `dir/name.json` and returns the document.
fn explain_json(config: &Path, dir: &Path, name: &str, extra: &[&str]) -> Value {
    let json = dir.join(format!("{name}.json"));
    let mut args = extra.to_vec();
    args.extend(["--json", json.to_str().unwrap()]);
    let output = explain(config, &args);
    assert!(
        output.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn field(doc: &Value, key: &str) -> Vec<Value> {
    doc["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[key].clone())
        .collect()
}

fn stored(run_dir: &Path) -> i64 {
    let conn = rusqlite::Connection::open(run_dir.join("values.sqlite")).unwrap();
    conn.query_row("SELECT COUNT(*) FROM coalition_values", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn an_exact_run_reanalyzed_gives_banzhaf_and_antithetic_as_normal_runs_do_with_no_model_call() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let run_dir = dir.path().join("run");
    let run = ["--run-dir", run_dir.to_str().unwrap()];
    let exact = explain_json(&cfg, dir.path(), "exact", &run);
    assert_eq!(exact["coalitions"]["planned"], 32);
    let rows = stored(&run_dir);

    let reanalyze: Vec<&str> = run.iter().copied().chain(["--reanalyze"]).collect();
    for (name, flags) in [
        ("banzhaf", vec!["--estimand", "banzhaf"]),
        (
            "antithetic",
            vec!["--estimator", "antithetic", "--budget", "12", "--seed", "5"],
        ),
    ] {
        let normal = explain_json(&cfg, dir.path(), &format!("{name}-normal"), &flags);
        let args: Vec<&str> = reanalyze.iter().chain(&flags).copied().collect();
        let again = explain_json(&cfg, dir.path(), &format!("{name}-again"), &args);
        assert_eq!(field(&again, "value"), field(&normal, "value"), "{name}");
        assert_eq!(field(&again, "std_error"), field(&normal, "std_error"));
        assert_eq!(again["v_all"], normal["v_all"]);
        assert_eq!(again["efficiency"], normal["efficiency"]);
        assert_eq!(again["settings"], normal["settings"]);
        // Every value from the run directory, none from the model, nothing written.
        assert_eq!(again["coalitions"]["evaluated"], 0, "{name}");
        assert_eq!(
            again["coalitions"]["reused_from_run_dir"],
            normal["coalitions"]["unique_prompts"]
        );
        assert_eq!(again["reply_source"], "run_dir");
        assert_eq!(again["reply"], exact["reply"]);
        assert_eq!(stored(&run_dir), rows);
    }
    // Banzhaf is not Shapley here, so the reanalysis did recompute; the HTML page comes too.
    let html = dir.path().join("banzhaf.html");
    let flags = ["--estimand", "banzhaf", "--html", html.to_str().unwrap()];
    let banzhaf = explain_json(
        &cfg,
        dir.path(),
        "banzhaf-html",
        &[&reanalyze[..], &flags].concat(),
    );
    assert_ne!(field(&banzhaf, "value"), field(&exact, "value"));
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .starts_with("<!DOCTYPE html>"));
}

#[test]
fn a_small_sampled_run_is_refused_naming_the_missing_count_until_a_run_fills_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let run_dir = dir.path().join("run");
    let run = ["--run-dir", run_dir.to_str().unwrap()];
    let sampled = [
        "--estimator",
        "antithetic",
        "--budget",
        "6",
        "--seed",
        "1",
        "--holdout",
        "0",
    ];
    explain_json(
        &cfg,
        dir.path(),
        "sampled",
        &[&run[..], &sampled[..]].concat(),
    );
    let have = stored(&run_dir);
    assert!(have < 32, "the sampled run stored {have} of 32");

    let output = explain(&cfg, &[&run[..], &["--reanalyze"]].concat());
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let missing = format!("{} of 32 coalitions", 32 - have);
    assert!(
        stderr.contains(&missing) && stderr.contains("without --reanalyze"),
        "{stderr}"
    );
    assert_eq!(
        stored(&run_dir),
        have,
        "a refused reanalysis writes nothing"
    );

    // The run it suggests computes only the missing ones; then reanalysis works.
    let filled = explain_json(&cfg, dir.path(), "filled", &run);
    assert_eq!(filled["coalitions"]["evaluated"], 32 - have);
    let again = explain_json(
        &cfg,
        dir.path(),
        "again",
        &[&run[..], &["--reanalyze"]].concat(),
    );
    assert_eq!(field(&again, "value"), field(&filled, "value"));
}

#[test]
fn reanalyze_needs_an_existing_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let output = explain(&cfg, &["--reanalyze"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--run-dir"));

    let empty = dir.path().join("empty");
    let output = explain(&cfg, &["--reanalyze", "--run-dir", empty.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("holds no run store") && stderr.contains("without --reanalyze"),
        "{stderr}"
    );
    assert!(!empty.exists(), "no directory is created");
}

#[test]
fn a_run_that_settles_early_equals_a_run_of_the_budget_it_stopped_at_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let run_dir = dir.path().join("run");
    let run = ["--run-dir", run_dir.to_str().unwrap()];
    let sampled = ["--estimator", "kernel", "--seed", "3", "--holdout", "0"];
    let stopping = ["--budget", "800", "--settle-top", "2"];
    let early = explain_json(
        &cfg,
        dir.path(),
        "early",
        &[&run[..], &sampled[..], &stopping[..]].concat(),
    );
    let stopped = &early["stopped"];
    assert_eq!(stopped["of_rounds"], 4);
    assert_eq!(stopped["reason"]["rule"], "settled", "{stopped}");
    let rounds = stopped["rounds"].as_u64().unwrap();
    assert!((2..4).contains(&rounds), "{stopped}");
    let budget = stopped["budget"].as_u64().unwrap();
    assert_eq!(budget, 800 >> (4 - rounds));
    // It evaluated only what the budget it stopped at plans: the same explanation as a run of
    // that budget without a rule.
    let planned = early["coalitions"]["unique_prompts"].as_u64().unwrap();
    assert_eq!(early["coalitions"]["evaluated"].as_u64(), Some(planned));
    let plain = explain_json(
        &cfg,
        dir.path(),
        "plain",
        &[&sampled[..], &["--budget", &budget.to_string()]].concat(),
    );
    assert_eq!(field(&early, "value"), field(&plain, "value"));
    assert_eq!(plain["stopped"], Value::Null);

    // Reanalysis replays the rounds from the run directory to the same stop.
    let replayed = explain_json(
        &cfg,
        dir.path(),
        "replayed",
        &[&run[..], &sampled[..], &stopping[..], &["--reanalyze"]].concat(),
    );
    assert_eq!(&replayed["stopped"], stopped);
    assert_eq!(field(&replayed, "value"), field(&early, "value"));
    assert_eq!(replayed["coalitions"]["evaluated"], 0);

    // A target every estimate meets stops after the first round.
    let loose = explain_json(
        &cfg,
        dir.path(),
        "loose",
        &[&sampled[..], &["--budget", "800", "--target-se", "1e9"]].concat(),
    );
    assert_eq!(loose["stopped"]["rounds"], 1);
    assert_eq!(loose["stopped"]["reason"]["rule"], "target_se");

    // Exact has nothing to stop.
    let output = explain(&cfg, &["--settle-top", "2"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("`exact` evaluates a fixed set"));
}
