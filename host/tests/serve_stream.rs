//! `lmhost serve` streams tokens as the backend generates them, and stops a generation whose
//! client went away or whose time ran out. Over mock with `token_latency_ms`, which hands out
//! its reply a word at a time as a decoding model would; every check reads what arrived and the
//! server's own gauges and counters, never a clock.

mod common;

use std::time::Duration;

use common::{metric, post, wait_until_idle, EventStream, TestServer, MODEL};
use serde_json::{json, Value};

/// Mock replies of `words` words, one every `ms` milliseconds.
fn slow_mock(words: usize, ms: u64) -> String {
    format!(
        "[backend]\nkind = \"mock\"\nmodel_id = \"{MODEL}\"\n\
         [backend.options]\nreply_words = {words}\ntoken_latency_ms = {ms}\n"
    )
}

fn chat(words: usize, stream: bool) -> String {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "one two three four five six seven eight"}],
        "max_tokens": words,
        "stream": stream,
    })
    .to_string()
}

/// The text a content chunk adds, if it is one.
fn content(event: &str) -> Option<String> {
    let chunk: Value = serde_json::from_str(event).ok()?;
    chunk["choices"][0]["delta"]["content"]
        .as_str()
        .filter(|c| !c.is_empty())
        .map(String::from)
}

#[test]
fn chunks_arrive_while_the_reply_is_still_being_generated() {
    let server = TestServer::start(&slow_mock(12, 100), |_| {});
    let url = server.url("/v1/chat/completions");
    let mut events = EventStream::open(&url, &chat(12, true));
    let first = std::iter::from_fn(|| events.next_event())
        .find_map(|e| content(&e))
        .expect("a content chunk");
    // The first word is here and the request is still running: it was not written at the end.
    assert_eq!(metric(&server, "lmhost_requests_running"), 1.0);
    assert_eq!(metric(&server, "lmhost_completion_tokens_total"), 0.0);
    assert_eq!(
        metric(&server, "lmhost_time_to_first_token_seconds_count"),
        1.0
    );
    let mut text = first;
    let mut last = String::new();
    while let Some(event) = events.next_event() {
        text.extend(content(&event));
        last = event;
    }
    assert_eq!(last, "[DONE]");
    let plain = post(&url, &chat(12, false)).json();
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(text.split_whitespace().count(), 12);
    // Two generations: two first tokens, and 11 gaps after each.
    assert_eq!(
        metric(&server, "lmhost_time_to_first_token_seconds_count"),
        2.0
    );
    assert_eq!(
        metric(&server, "lmhost_inter_token_latency_seconds_count"),
        22.0
    );
    assert_eq!(metric(&server, "lmhost_requests_waiting"), 0.0);
}

#[test]
fn a_client_that_goes_away_stops_its_generation_and_frees_its_slot() {
    let server = TestServer::start(&slow_mock(60, 50), |o| o.workers = 1);
    let url = server.url("/v1/chat/completions");
    let mut events = EventStream::open(&url, &chat(60, true));
    std::iter::from_fn(|| events.next_event())
        .find_map(|e| content(&e))
        .expect("a content chunk");
    drop(events);
    wait_until_idle(&server);
    let generated = metric(&server, "lmhost_completion_tokens_total");
    assert!(
        generated < 60.0,
        "generated {generated} of 60 words for a client that left"
    );
    // The one worker serves the next request.
    let answer = post(&url, &chat(2, false));
    assert_eq!(answer.status, 200, "{}", answer.body);
}

#[test]
fn a_request_past_its_time_stops_generating() {
    let server = TestServer::start(&slow_mock(60, 50), |o| {
        o.request_timeout = Duration::from_millis(300)
    });
    let url = server.url("/v1/chat/completions");
    let answer = post(&url, &chat(60, false));
    assert_eq!(answer.status, 504, "{}", answer.body);
    wait_until_idle(&server);
    let generated = metric(&server, "lmhost_completion_tokens_total");
    assert!(
        generated < 60.0,
        "generated {generated} of 60 words after the timeout"
    );
}

#[test]
fn requests_beyond_the_servers_limits_get_400s_naming_them() {
    let server = TestServer::start(&slow_mock(4, 0), |o| {
        o.limits.max_tokens = 16;
        o.limits.max_embedding_inputs = 2;
        o.limits.max_embedding_bytes = 20;
    });
    let answer = post(&server.url("/v1/chat/completions"), &chat(17, false));
    assert_eq!(answer.status, 400, "{}", answer.body);
    let error = &answer.json()["error"];
    assert_eq!(error["param"], "max_tokens");
    assert!(
        error["message"].as_str().unwrap().contains("at most 16"),
        "{error}"
    );
    assert_eq!(
        post(&server.url("/v1/chat/completions"), &chat(16, false)).status,
        200
    );
    let embeddings = server.url("/v1/embeddings");
    for (input, limit) in [
        (json!(["a", "b", "c"]), "at most 2 per request"),
        (json!(["twenty-one bytes long"]), "at most 20 per request"),
    ] {
        let answer = post(
            &embeddings,
            &json!({"model": MODEL, "input": input}).to_string(),
        );
        assert_eq!(answer.status, 400, "{}", answer.body);
        let error = &answer.json()["error"];
        assert_eq!(error["param"], "input");
        assert!(
            error["message"].as_str().unwrap().contains(limit),
            "{error}"
        );
    }
    let fits = json!({"model": MODEL, "input": ["a", "b"]}).to_string();
    assert_eq!(post(&embeddings, &fits).status, 200);
}
