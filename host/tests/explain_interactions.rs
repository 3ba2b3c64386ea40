//! `lmhost explain --interactions` through the real binary and the mock plugin: interaction
//! values from the same coalitions as the attributions (also from a run directory alone), the
//! errors for settings that cannot give them, and the HTML page's pair matrix and links as
//! headless Chromium renders them (Debian's `chromium`, which `scripts/setup-system` installs).

use std::path::Path;

use serde_json::Value;

mod common;

use common::explain_json;

/// The mock config and the example's user messages: 5 players, 32 coalitions.
const RUN: [&str; 6] = [
    "--config",
    "configs/mock.toml",
    "--conversation",
    "examples/conversation.json",
    "--roles",
    "user",
];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    RUN.iter().chain(extra).copied().collect()
}

/// `(player ids, value)` of each interaction in the document.
fn interactions(doc: &Value) -> Vec<(Vec<String>, f64)> {
    doc["interactions"]
        .as_array()
        .expect("an interactions list")
        .iter()
        .map(|i| {
            let ids = i["players"].as_array().unwrap();
            let ids = ids.iter().map(|p| p.as_str().unwrap().to_string());
            (ids.collect(), i["value"].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn pairs_come_with_the_attributions_and_from_a_run_directory_alone() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let run_dir = run_dir.to_str().unwrap();
    let plain = explain_json(
        &dir.path().join("plain.json"),
        &with(&["--run-dir", run_dir]),
    );
    assert!(plain["interactions"].is_null());

    let pairs = ["--interactions", "pairs"];
    let fresh = explain_json(&dir.path().join("fresh.json"), &with(&pairs));
    let stored = explain_json(
        &dir.path().join("stored.json"),
        &with(&[&pairs[..], &["--run-dir", run_dir, "--reanalyze"]].concat()),
    );
    assert_eq!(stored["coalitions"]["evaluated"], 0);
    assert_eq!(interactions(&stored), interactions(&fresh));

    // Five players, then the ten pairs; k-SII's values of both orders sum to the whole effect.
    let found = interactions(&fresh);
    assert_eq!(found.len(), 5 + 10);
    let ids: Vec<String> = fresh["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(found[5].0, [ids[0].clone(), ids[1].clone()]);
    let total: f64 = found.iter().map(|(_, v)| v).sum();
    let whole = fresh["v_all"].as_f64().unwrap() - fresh["v_none"].as_f64().unwrap();
    assert!((total - whole).abs() < 1e-9, "{total} vs {whole}");
    // A player's k-SII is its Shapley value less half its pairs'.
    for (i, id) in ids.iter().enumerate() {
        let shapley = fresh["players"][i]["value"].as_f64().unwrap();
        let half_pairs: f64 = found[5..]
            .iter()
            .filter(|(players, _)| players.contains(id))
            .map(|(_, v)| v / 2.0)
            .sum();
        assert!((found[i].1 - (shapley - half_pairs)).abs() < 1e-9, "{id}");
    }
}

#[test]
fn a_lasso_run_reanalyzed_with_pairs_fits_its_surrogate_on_the_same_coalitions() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let lasso = ["--estimator", "lasso", "--budget", "64", "--seed", "3"];
    let run = ["--run-dir", run_dir.to_str().unwrap()];
    let plain = explain_json(
        &dir.path().join("plain.json"),
        &with(&[&lasso[..], &run].concat()),
    );
    let pairs = explain_json(
        &dir.path().join("pairs.json"),
        &with(
            &[
                &lasso[..],
                &run,
                &["--interactions", "pairs", "--reanalyze"],
            ]
            .concat(),
        ),
    );
    assert!(plain["interactions"].is_null());
    assert_eq!(pairs["coalitions"]["evaluated"], 0);
    assert_eq!(
        pairs["coalitions"]["planned"],
        plain["coalitions"]["planned"]
    );
    let found = interactions(&pairs);
    assert_eq!(found.len(), 5 + 10);
    assert!(pairs["interactions"][0]["std_error"].is_null());
    // The attributions are the surrogate's Shapley values: its own weight and half its pairs'.
    for (i, player) in pairs["players"].as_array().unwrap().iter().enumerate() {
        let id = player["id"].as_str().unwrap();
        let half_pairs: f64 = found[5..]
            .iter()
            .filter(|(players, _)| players.iter().any(|p| p == id))
            .map(|(_, v)| v / 2.0)
            .sum();
        let value = player["value"].as_f64().unwrap();
        assert!((value - (found[i].1 + half_pairs)).abs() < 1e-9, "{id}");
    }
}

#[test]
fn interactions_a_setting_cannot_give_are_refused_before_any_model_call() {
    for (flags, says) in [
        (
            vec!["--interactions", "pairs", "--estimator", "kernel"],
            "`interactions = \"pairs\"` needs `estimator = \"exact\"`",
        ),
        (
            vec!["--interactions", "pairs", "--estimand", "banzhaf"],
            "use `interaction_index = \"moebius\"`",
        ),
        (
            vec!["--interactions", "some"],
            "expected one of: none, pairs, all",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
            .current_dir(common::repo())
            .args(["-q", "explain"])
            .args(with(&flags))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

/// The page's DOM after its scripts ran, opened at `fragment`.
fn rendered(page: &Path, fragment: &str) -> String {
    common::chromium(
        &format!("file://{}{fragment}", page.display()),
        &["--dump-dom"],
    )
}

#[test]
fn the_page_draws_the_pair_matrix_and_outlines_a_pairs_parts() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("e.html");
    let doc = explain_json(
        &dir.path().join("e.json"),
        &with(&["--interactions", "pairs", "--html", page.to_str().unwrap()]),
    );
    let pairs: Vec<(Vec<String>, f64)> = interactions(&doc)
        .into_iter()
        .filter(|(players, _)| players.len() == 2)
        .collect();
    let ids: Vec<&str> = doc["players"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    let index = |id: &str| ids.iter().position(|i| *i == id).unwrap();
    let (top, value) = pairs
        .iter()
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        .unwrap();
    let (a, b) = (index(&top[0]), index(&top[1]));

    let dom = rendered(&page, "");
    // One cell per ordered pair, each shaded as the players are; the strongest listed first.
    assert_eq!(
        dom.matches("<td data-i=").count(),
        ids.len() * (ids.len() - 1)
    );
    let max = pairs.iter().map(|(_, v)| v.abs()).fold(0.0, f64::max);
    let cell = format!(
        "<td data-i=\"{a},{b}\" style=\"background:{}\"",
        lmhost::report::html::shade(*value, max)
    );
    assert!(dom.contains(&cell), "{cell} in {dom}");
    let strongest = &dom[dom.find("id=\"strongest\"").unwrap()..];
    assert!(strongest.contains(&format!("<tr data-i=\"{a},{b}\">")));
    assert!(strongest.find(&format!("{} × {}", top[0], top[1])).unwrap() < 400);
    assert!(!dom.contains("p linked"));

    // Opened at the pair: its two parts, and only they, are outlined.
    let dom = rendered(&page, &format!("#interaction={a},{b}"));
    let outlined: Vec<usize> = dom
        .split("<span class=\"p linked\" data-p=\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
        .collect();
    assert_eq!(outlined, [a, b]);
}
