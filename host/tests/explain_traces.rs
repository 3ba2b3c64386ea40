//! `lmhost explain` over an agent's trace (`examples/agent.json`) and a retrieval
//! (`examples/rag.json`) through the real binary and the mock plugin, which reads a tool call's
//! name and arguments and the documents' words: each call is a player that takes its answer
//! with it, each document a player, `roles` picks the answers or the documents, `hide` refuses
//! both, and the HTML page shows them as Chromium renders it (Debian's `chromium`, which
//! `scripts/setup-system` installs).

use serde_json::Value;

mod common;

use common::explain_json;

const RUN: [&str; 4] = [
    "--config",
    "configs/mock.toml",
    "--conversation",
    "examples/agent.json",
];

fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    RUN.iter().chain(extra).copied().collect()
}

fn ids(doc: &Value) -> Vec<&str> {
    (doc["players"].as_array().unwrap().iter())
        .map(|p| p["id"].as_str().unwrap())
        .collect()
}

#[test]
fn each_tool_call_is_a_player_that_takes_its_answer_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let doc = explain_json(&dir.path().join("e.json"), &with(&[]));
    assert_eq!(
        ids(&doc),
        ["m0", "m1", "m2.call0", "m2.call1", "m3", "m4", "m5.call0", "m6"]
    );
    assert_eq!(
        doc["players"][2]["text"],
        r#"get_weather({"city": "Lyon", "date": "2026-12-08"})"#
    );
    // Three calls, each with its answer: without the call the answer is gone too, so each
    // call and answer make 3 prompts, not 4 (2 x 2 x 3^3 = 108 of 256 coalitions).
    assert_eq!(doc["coalitions"]["unique_prompts"], 108);
    let values: f64 = common::values(&doc).iter().sum();
    let whole = doc["v_all"].as_f64().unwrap() - doc["v_none"].as_f64().unwrap();
    assert!((values - whole).abs() < 1e-9, "{values} vs {whole}");
    // The mock reads the calls: they move the answer.
    assert!(common::values(&doc)[2].abs() > 0.0, "{doc}");

    let answers = explain_json(&dir.path().join("a.json"), &with(&["--roles", "tool"]));
    assert_eq!(ids(&answers), ["m3", "m4", "m6"]);
}

#[test]
fn hide_refuses_a_tool_call_before_any_model_call() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .current_dir(common::repo())
        .args(["-q", "explain"])
        .args(with(&["--absence", "hide"]))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("player m2.call0 is a tool call, which `absence = \"hide\"` cannot hide"),
        "{stderr}"
    );
}

#[test]
fn the_page_shows_each_call_shaded_as_a_player_and_what_each_answer_answers() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("e.html");
    let doc = explain_json(
        &dir.path().join("e.json"),
        &with(&["--html", page.to_str().unwrap()]),
    );
    let dom = common::chromium(&format!("file://{}", page.display()), &["--dump-dom"]);
    let value = doc["players"][6]["value"].as_f64().unwrap();
    let max = common::values(&doc)
        .iter()
        .map(|v| v.abs())
        .fold(0.0, f64::max);
    let search = format!(
        "<div class=\"call\">call_search → <span class=\"p\" data-p=\"6\" style=\"background:{}\"",
        lmhost::report::html::shade(value, max)
    );
    assert!(dom.contains(&search), "{search} not in the page");
    assert!(dom.contains(
        "web_search({\"query\": \"Lyon bike lanes Part-Dieu closed December\"})</span></div>"
    ));
    assert!(dom.contains("<div class=\"role\">tool · answers call_weather</div>"));
}

const RAG: [&str; 4] = [
    "--config",
    "configs/mock.toml",
    "--conversation",
    "examples/rag.json",
];

#[test]
fn each_document_is_a_player_left_out_or_stood_in_for() {
    let dir = tempfile::tempdir().unwrap();
    let rag = |extra: &[&'static str]| -> Vec<&'static str> {
        RAG.iter().chain(extra).copied().collect()
    };
    let doc = explain_json(&dir.path().join("e.json"), &rag(&[]));
    assert_eq!(
        ids(&doc),
        ["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "m0", "m1"]
    );
    assert_eq!(doc["players"][1]["role"], "document");
    assert_eq!(
        doc["players"][1]["text"],
        "On Saturdays and Sundays the museum opens at 11 am and closes at 6 pm."
    );
    // Every coalition keeps other documents: all distinct prompts.
    assert_eq!(doc["coalitions"]["unique_prompts"], 1024);
    let documents = explain_json(&dir.path().join("d.json"), &rag(&["--roles", "document"]));
    assert_eq!(ids(&documents).len(), 8);
    let values = common::values(&documents);
    let whole = documents["v_all"].as_f64().unwrap() - documents["v_none"].as_f64().unwrap();
    assert!((values.iter().sum::<f64>() - whole).abs() < 1e-9);
    assert!(
        values.iter().any(|v| v.abs() > 0.0),
        "the mock reads the documents"
    );
    // Padded, a document keeps its place and its title; its text becomes the placeholder.
    let padded = explain_json(
        &dir.path().join("p.json"),
        &rag(&["--roles", "document", "--absence", "pad"]),
    );
    assert_ne!(common::values(&padded), values);
}

#[test]
fn hide_refuses_a_document_and_the_page_shows_the_documents() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .current_dir(common::repo())
        .args(["-q", "explain"])
        .args(RAG)
        .args(["--absence", "hide"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("player d0 is a document"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("e.html");
    let args: Vec<&str> = RAG
        .iter()
        .copied()
        .chain(["--roles", "document", "--html", page.to_str().unwrap()])
        .collect();
    let doc = explain_json(&dir.path().join("e.json"), &args);
    let dom = common::chromium(&format!("file://{}", page.display()), &["--dump-dom"]);
    let max = common::values(&doc)
        .iter()
        .map(|v| v.abs())
        .fold(0.0, f64::max);
    let value = doc["players"][2]["value"].as_f64().unwrap();
    let shown = format!(
        "<div class=\"role\">document d2</div><div class=\"text\"><span class=\"p\" data-p=\"2\" \
         style=\"background:{}\"",
        lmhost::report::html::shade(value, max)
    );
    assert!(dom.contains("<h2>Documents</h2>"));
    assert!(dom.contains(&shown), "{shown} not in the page");
    assert!(dom.contains("The museum is closed on Mondays and on 25 December.</span>"));
}
