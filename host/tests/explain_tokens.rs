//! Per-answer-token attributions on the real default model (SmolLM2; run
//! `scripts/fetch-models`): the JSON matrix, and the HTML page's token map as headless
//! Chromium renders it (Debian's `chromium`, which `scripts/setup-system` installs).

use std::path::{Path, PathBuf};

use lmhost::report::html::shade;
use serde_json::Value;

mod common;

use common::{explain_json, require};

/// Exact Shapley of `answer_logprob` over the example's five user messages, as JSON and HTML.
fn explain(dir: &Path) -> (Value, PathBuf) {
    require("models/smollm2", "fetch-models");
    let (json, html) = (dir.join("e.json"), dir.join("e.html"));
    let args = [
        "--config".as_ref(),
        "configs/default.toml".as_ref(),
        "--conversation".as_ref(),
        "examples/conversation.json".as_ref(),
        "--roles".as_ref(),
        "user".as_ref(),
        "--estimator".as_ref(),
        "exact".as_ref(),
        "--value".as_ref(),
        "answer_logprob".as_ref(),
        "--html".as_ref(),
        html.as_os_str(),
    ];
    (explain_json::<&std::ffi::OsStr>(&json, &args), html)
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The page's DOM after its scripts ran, opened at `fragment`.
fn rendered(page: &Path, fragment: &str) -> String {
    let url = format!("file://{}{fragment}", page.display());
    common::chromium(&url, &["--dump-dom"])
}

/// Each player span's background as Chromium serializes it, `(r, g, b, alpha)`, by `data-p`.
fn backgrounds(dom: &str) -> Vec<(usize, [f64; 4])> {
    dom.split("<span class=\"p\" data-p=\"")
        .skip(1)
        .map(|span| {
            let player = span[..span.find('"').unwrap()].parse().unwrap();
            let start = span.find("rgba(").expect("an rgba background") + 5;
            let end = start + span[start..].find(')').unwrap();
            let channels: Vec<f64> = span[start..end]
                .split(',')
                .map(|c| c.trim().parse().unwrap())
                .collect();
            (player, channels.try_into().unwrap())
        })
        .collect()
}

/// What [`shade`] gives for each value of `column`, as `(r, g, b, alpha)`.
fn expected(column: &[f64]) -> Vec<[f64; 4]> {
    let max = column.iter().map(|v| v.abs()).fold(0.0, f64::max);
    column
        .iter()
        .map(|&v| {
            let css = shade(v, max);
            let inner = &css["rgba(".len()..css.len() - 1];
            let c: Vec<f64> = inner.split(',').map(|c| c.parse().unwrap()).collect();
            c.try_into().unwrap()
        })
        .collect()
}

#[test]
fn per_token_attributions_sum_to_each_players_value_and_the_page_shades_by_token() {
    let dir = tempfile::tempdir().unwrap();
    let (doc, page) = explain(dir.path());
    let per_token = &doc["per_token"];
    let tokens: Vec<&str> = per_token["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let reply = doc["reply"].as_str().unwrap();
    assert!(tokens.len() > 3, "{tokens:?}");
    assert!(
        tokens.concat().starts_with(reply.trim_end()),
        "the tokens {tokens:?} spell the reply {reply:?}"
    );
    let matrix: Vec<Vec<f64>> = per_token["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(numbers)
        .collect();
    let players = doc["players"].as_array().unwrap();
    assert_eq!(matrix.len(), players.len());
    for (row, player) in matrix.iter().zip(players) {
        assert_eq!(row.len(), tokens.len());
        let value = player["value"].as_f64().unwrap();
        let sum: f64 = row.iter().sum();
        assert!(
            (sum - value).abs() <= 1e-6 * value.abs().max(1.0),
            "{sum} vs {value}"
        );
    }

    // The token whose column differs most from the totals' shading, pinned by the address.
    let totals: Vec<f64> = players
        .iter()
        .map(|p| p["value"].as_f64().unwrap())
        .collect();
    let column = |t: usize| matrix.iter().map(|row| row[t]).collect::<Vec<f64>>();
    let t = (0..tokens.len())
        .max_by(|&a, &b| {
            let gap = |t| {
                let (e, total) = (expected(&column(t)), expected(&totals));
                e.iter()
                    .zip(&total)
                    .map(|(x, y)| (x[3] - y[3]).abs())
                    .sum::<f64>()
            };
            gap(a).total_cmp(&gap(b))
        })
        .unwrap();
    for (fragment, want) in [
        ("", expected(&totals)),
        (&*format!("#token={t}"), expected(&column(t))),
    ] {
        let dom = rendered(&page, fragment);
        let got = backgrounds(&dom);
        assert_eq!(got.len(), players.len(), "one shaded span per player");
        for (player, rgba) in got {
            let close = rgba
                .iter()
                .zip(want[player])
                .all(|(a, b)| (a - b).abs() < 0.01);
            assert!(
                close,
                "{fragment:?} player {player}: page {rgba:?}, expected {:?}",
                want[player]
            );
        }
        let pinned = format!("class=\"tok on\" data-t=\"{t}\"");
        assert_eq!(
            dom.contains(&pinned),
            !fragment.is_empty(),
            "token {t} pinned"
        );
    }
}
