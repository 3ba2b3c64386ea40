//! `lmhost serve` over mock, through real HTTP on loopback: every endpoint, errors, auth,
//! queueing, timeouts and graceful shutdown.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{get, get_with, post, post_with, TestServer, MODEL};
use lmhost::ConversationSnapshot;
use serde_json::{json, Value};

fn chat_body(prompt: &str, extra: Value) -> String {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8,
    });
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        body.extend(extra.clone());
    }
    body.to_string()
}

#[test]
fn chat_completion_matches_the_backend_with_logprobs_and_usage() {
    let server = TestServer::mock(0, |_| {});
    let answer = post(
        &server.url("/v1/chat/completions"),
        &chat_body("the cat sat on the mat", json!({"logprobs": true})),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json();
    let expected = common::open(&common::mock_config(0))
        .generate(
            &ConversationSnapshot::from_prompt("the cat sat on the mat"),
            &lmhost::GenerationConfig {
                max_new_tokens: 8,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        json["choices"][0]["message"]["content"],
        expected.text.as_str()
    );
    let logprobs: Vec<f32> = json["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(logprobs, expected.logprobs.as_slice());
    assert_eq!(
        json["choices"][0]["logprobs"]["content"][0]["token"],
        format!("token_id:{}", expected.token_ids[0])
    );
    assert_eq!(json["usage"]["prompt_tokens"], expected.prompt_tokens);
    assert_eq!(json["usage"]["completion_tokens"], expected.token_ids.len());
    assert_eq!(json["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(json["object"], "chat.completion");
}

#[test]
fn repeated_prompt_reports_cached_tokens_and_metrics_count_them() {
    let server = TestServer::mock(0, |_| {});
    let body = chat_body("one two three four", json!({}));
    let first = post(&server.url("/v1/chat/completions"), &body).json();
    let second = post(&server.url("/v1/chat/completions"), &body).json();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt_tokens = second["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached,
        prompt_tokens - 1,
        "mock reuses all but the last token"
    );
    let metrics = get(&server.url("/metrics"));
    assert_eq!(metrics.status, 200);
    assert!(metrics.content_type.starts_with("text/plain"));
    let text = metrics.body;
    for line in [
        "lmhost_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2".to_string(),
        format!("lmhost_cached_prompt_tokens_total {cached}"),
        "lmhost_prefix_cache_hits_total 1".to_string(),
        format!("lmhost_prefix_cache_reused_tokens_total {cached}"),
        format!("lmhost_prompt_tokens_total {}", 2 * prompt_tokens),
        "lmhost_request_duration_seconds_count 2".to_string(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in\n{text}"
        );
    }
}

#[test]
fn streamed_chat_carries_the_same_text_usage_and_done() {
    let server = TestServer::mock(0, |_| {});
    let plain = post(
        &server.url("/v1/chat/completions"),
        &chat_body("a b c d e", json!({})),
    );
    let text = plain.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let streamed = post(
        &server.url("/v1/chat/completions"),
        &chat_body(
            "a b c d e",
            json!({"stream": true, "stream_options": {"include_usage": true}, "logprobs": true}),
        ),
    );
    assert_eq!(streamed.status, 200);
    assert!(streamed.content_type.starts_with("text/event-stream"));
    let events: Vec<&str> = streamed
        .body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is a data line")
        })
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, text);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let finish: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    let logprobs: usize = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .map(Vec::len)
        .sum();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"].as_u64(), Some(logprobs as u64));
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
}

/// `echo` scores every token of the literal prompt after the first, as vLLM does; the tokens
/// past a prompt are its continuation's, scored as the backend scores that continuation.
#[test]
fn completions_echo_scores_every_token_of_the_literal_prompt() {
    let server = TestServer::mock(0, |_| {});
    let text = "red green blue red";
    let answer = post(
        &server.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": text, "echo": true, "logprobs": 1, "max_tokens": 1})
            .to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json();
    let lp = &json["choices"][0]["logprobs"];
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    let scored: Vec<f32> = lp["token_logprobs"].as_array().unwrap()[1..]
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let local = common::open(&common::mock_config(0));
    let whole = local
        .score(&ConversationSnapshot::raw("red "), "green blue red")
        .unwrap();
    assert_eq!(scored, whole.logprobs.as_slice());
    let continuation = local
        .score(&ConversationSnapshot::raw("red green "), "blue red")
        .unwrap();
    assert_eq!(&scored[1..], continuation.logprobs.as_slice());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [0, 4, 10, 15]);
    assert_eq!(json["choices"][0]["text"], text);
    assert_eq!(json["usage"]["prompt_tokens"], 4);
    assert_eq!(json["usage"]["completion_tokens"], 0);
}

#[test]
fn text_completion_generates_from_a_plain_prompt() {
    let server = TestServer::mock(0, |_| {});
    let answer = post(
        &server.url("/v1/completions"),
        &json!({"model": MODEL, "prompt": "alpha beta gamma", "max_tokens": 3, "logprobs": 0})
            .to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json();
    assert_eq!(json["object"], "text_completion");
    // The prompt reaches the backend literally: no chat template, no role markers.
    let config = lmhost::GenerationConfig {
        max_new_tokens: 3,
        ..Default::default()
    };
    let local = common::open(&common::mock_config(0))
        .generate(&ConversationSnapshot::raw("alpha beta gamma"), &config)
        .unwrap();
    assert_eq!(json["choices"][0]["text"], local.text.as_str());
    let words = json["choices"][0]["text"]
        .as_str()
        .unwrap()
        .split(' ')
        .count();
    assert_eq!(words, 3);
    assert_eq!(json["choices"][0]["finish_reason"], "length");
    assert_eq!(
        json["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn embeddings_models_props_and_health() {
    let server = TestServer::mock(0, |_| {});
    let answer = post(
        &server.url("/v1/embeddings"),
        &json!({"model": MODEL, "input": ["one text", "another text"]}).to_string(),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json = answer.json();
    assert_eq!(json["data"].as_array().unwrap().len(), 2);
    assert_eq!(json["data"][1]["index"], 1);
    assert_eq!(json["data"][0]["embedding"].as_array().unwrap().len(), 16);
    assert_ne!(
        json["data"][0]["embedding"], json["data"][1]["embedding"],
        "each input is embedded"
    );
    assert_eq!(json["usage"]["prompt_tokens"], 4);
    let models = get(&server.url("/v1/models")).json();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["owned_by"], "lmhost");
    let props = get(&server.url("/props")).json();
    assert_eq!(props["server"], "lmhost");
    assert!(
        props.get("chat_template").is_none(),
        "completions take prompts literally; no template is published"
    );
    let health = get(&server.url("/health"));
    assert_eq!(
        (health.status, health.json()["status"].clone()),
        (200, json!("ok"))
    );
}

/// Every malformed request gets a 400 (or the documented status) with an OpenAI error body
/// whose `param` names the field.
#[test]
fn malformed_requests_get_openai_errors_naming_the_field() {
    let server = TestServer::mock(0, |_| {});
    let chat = server.url("/v1/chat/completions");
    let completions = server.url("/v1/completions");
    let detokenize = server.url("/detokenize");
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (&chat, "{\"model\": ".into(), 400, "body"),
        (&chat, "not json at all".into(), 400, "body"),
        (&chat, json!({"model": MODEL}).to_string(), 400, "messages"),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "temprature": 1}).to_string(),
            400,
            "temprature",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "temperature": "hot"}).to_string(),
            400,
            "temperature",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "max_tokens": -1}).to_string(),
            400,
            "max_tokens",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "max_tokens": 0}).to_string(),
            400,
            "max_tokens",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "temperature": 3.5}).to_string(),
            400,
            "temperature",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "top_p": 0}).to_string(),
            400,
            "top_p",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "stop": ["ok", ""]}).to_string(),
            400,
            "stop[1]",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "n": 2}).to_string(),
            400,
            "n",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": user, "stream": "yes"}).to_string(),
            400,
            "stream",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": []}).to_string(),
            400,
            "messages",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}).to_string(),
            400,
            "messages[0].role",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user"}]}).to_string(),
            400,
            "messages[0].content",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x", "mood": 1}]})
                .to_string(),
            400,
            "messages[0].mood",
        ),
        (
            &chat,
            json!({"model": "gpt-9", "messages": user}).to_string(),
            404,
            "model",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": 7}).to_string(),
            400,
            "prompt",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": "x", "logprobs": 5}).to_string(),
            400,
            "logprobs",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": " ", "echo": true, "logprobs": 1}).to_string(),
            400,
            "prompt",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": ["a", "b"]}).to_string(),
            400,
            "prompt",
        ),
        (&chat, json!({"": 1}).to_string(), 400, "body"),
        // What the backend cannot do at all is the served model's limit.
        (
            &detokenize,
            json!({"tokens": [1]}).to_string(),
            400,
            "model",
        ),
    ];
    for (url, body, status, param) in cases {
        let answer = post(url, &body);
        assert_eq!(answer.status, status, "{body}: {}", answer.body);
        let error = &answer.json()["error"];
        assert_eq!(error["param"], param, "{body}: {}", answer.body);
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(error["type"].is_string());
    }
}

/// A chat's `image_url` parts are decoded from `data:` URLs and reach the backend (the mock
/// sees a blue image as `blue`, which its answer then repeats); a web URL, another scheme or
/// bytes that are no image get a 400 naming the part.
#[test]
fn image_urls_are_read_inline_and_web_urls_are_refused_by_name() {
    use base64::Engine as _;
    let server = TestServer::mock(0, |_| {});
    let chat = server.url("/v1/chat/completions");
    let mut png = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_pixel(8, 8, image::Rgb([9, 20, 230]))
        .write_to(&mut png, image::ImageFormat::Png)
        .unwrap();
    let png = base64::engine::general_purpose::STANDARD.encode(png.get_ref());
    let ask = |url: String| {
        let content = json!([
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
        ]);
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": content}]});
        post(&chat, &body.to_string())
    };
    let answer = ask(format!("data:image/png;base64,{png}"));
    assert_eq!(answer.status, 200, "{}", answer.body);
    let reply = answer.json()["choices"][0]["message"]["content"].to_string();
    assert!(reply.contains("blue"), "{reply}");
    let field = "messages[0].content[1].image_url.url";
    for (url, expected) in [
        ("https://example.com/cat.png", "does not fetch images"),
        ("ftp://example.com/cat.png", "must be a data URL"),
        ("data:image/png;base64,aGVsbG8=", "PNG, JPEG, WebP or GIF"),
    ] {
        let answer = ask(url.into());
        assert_eq!(answer.status, 400, "{url}: {}", answer.body);
        let error = &answer.json()["error"];
        assert_eq!(error["param"], field, "{url}: {}", answer.body);
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(expected), "{url}: {message}");
    }
}

#[test]
fn oversized_bodies_unknown_routes_and_methods_get_error_bodies() {
    let server = TestServer::mock(0, |o| o.body_limit = 1024);
    let big = chat_body(&"word ".repeat(1000), json!({}));
    let answer = post(&server.url("/v1/chat/completions"), &big);
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(answer.json()["error"]["message"].is_string());
    let answer = get(&server.url("/v1/chat/completions"));
    assert_eq!(answer.status, 405);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("GET /v1/chat/completions"));
    let answer = get(&server.url("/v2/nothing"));
    assert_eq!(answer.status, 404);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v2/nothing"));
}

/// Every route the OpenAPI document lists, and the document itself, refuses a missing or
/// wrong key; `/health` alone answers without one.
#[test]
fn bearer_auth_guards_every_route_but_health() {
    let key = "s3cret";
    let server = TestServer::mock(0, |o| o.api_key = Some(key.into()));
    let document = get_with(&server.url("/openapi.json"), Some(key)).json();
    let mut routes: Vec<(String, String)> = document["paths"]
        .as_object()
        .expect("the document has paths")
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("a path item is an object");
            methods.keys().map(move |m| (path.clone(), m.clone()))
        })
        .collect();
    assert!(routes.len() >= 9, "{routes:?}");
    routes.push(("/openapi.json".into(), "get".into()));
    let body = chat_body("hello", json!({}));
    let call = |path: &str, method: &str, bearer: Option<&str>| match method {
        "post" => post_with(&server.url(path), &body, bearer),
        _ => get_with(&server.url(path), bearer),
    };
    for (path, method) in &routes {
        let open = call(path, method, None);
        if path == "/health" {
            assert_eq!(open.status, 200, "{path}");
            assert!(document["paths"][path][method].get("security").is_none());
            continue;
        }
        assert_eq!(open.status, 401, "{method} {path} without a key");
        let wrong = call(path, method, Some("s3cre7"));
        assert_eq!(wrong.status, 401, "{method} {path} with a wrong key");
        assert_eq!(wrong.json()["error"]["code"], "invalid_api_key");
        assert_ne!(call(path, method, Some(key)).status, 401, "{method} {path}");
    }
    let chat = &document["paths"]["/v1/chat/completions"]["post"];
    assert_eq!(chat["security"], json!([{"bearer": []}]));
    assert!(chat["responses"]["401"].is_object());
}

/// The document describes the server it came from: every routed operation, the served model
/// as the only `model` a request may name, the errors with their body.
#[test]
fn the_openapi_document_lists_every_route_and_the_served_model() {
    let server = TestServer::mock(0, |_| {});
    let answer = get(&server.url("/openapi.json"));
    assert_eq!(answer.status, 200);
    let document = answer.json();
    assert!(document["openapi"].as_str().unwrap().starts_with("3."));
    let paths = document["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/embeddings", "post"),
        ("/v1/models", "get"),
        ("/tokenize", "post"),
        ("/detokenize", "post"),
        ("/props", "get"),
        ("/metrics", "get"),
        ("/health", "get"),
    ] {
        let operation = &paths[path][method];
        assert!(operation["responses"]["200"].is_object(), "{method} {path}");
        if method == "post" {
            assert_eq!(
                operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody"
            );
        }
    }
    let schemas = &document["components"]["schemas"];
    assert_eq!(
        schemas["ChatRequest"]["properties"]["model"]["enum"],
        json!([MODEL])
    );
    assert_eq!(
        schemas["TokenizeRequest"]["properties"]["model"]["enum"],
        json!([MODEL, null])
    );
    assert_eq!(schemas["ChatRequest"]["additionalProperties"], false);
    assert!(document["components"].get("securitySchemes").is_none());
    let streamed = &paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"];
    assert!(streamed["text/event-stream"].is_object());
}

/// A body that stops arriving is answered 408 once the request's time is up.
#[test]
fn a_trickled_body_times_out_with_408() {
    use std::io::{Read, Write};
    let server = TestServer::mock(0, |o| o.request_timeout = Duration::from_millis(300));
    let mut client = std::net::TcpStream::connect(server.addr).unwrap();
    client
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"model\"",
        )
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = vec![0; 4096];
    let n = client
        .read(&mut answer)
        .expect("an answer before the client's own timeout");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""param":"body""#), "{answer}");
}

#[test]
fn slow_requests_time_out_with_504() {
    let server = TestServer::mock(3000, |o| o.request_timeout = Duration::from_millis(200));
    let answer = post(
        &server.url("/v1/chat/completions"),
        &chat_body("slow", json!({})),
    );
    assert_eq!(answer.status, 504, "{}", answer.body);
    assert_eq!(answer.json()["error"]["code"], "timeout");
}

/// One worker, one waiting place, a slow backend and eight clients at once: the first are
/// served, the rest are refused at once with 503 and Retry-After.
#[test]
fn full_queue_refuses_with_503_and_retry_after() {
    let server = TestServer::mock(1500, |o| {
        o.workers = 1;
        o.queue_depth = 1;
    });
    let url = server.url("/v1/chat/completions");
    let barrier = std::sync::Barrier::new(8);
    let answers: Vec<common::Answer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (url, barrier) = (&url, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    post(url, &chat_body(&format!("client{i}"), json!({})))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.status == 503).collect();
    assert_eq!(ok + refused.len(), 8);
    assert!(ok >= 1, "the first requests are served");
    assert!(!refused.is_empty());
    for answer in refused {
        assert_eq!(answer.retry_after.as_deref(), Some("1"));
        assert_eq!(answer.json()["error"]["code"], "overloaded");
    }
}

/// 64 clients × 20 requests: every request gets exactly its own answer or a 503.
#[test]
fn concurrent_load_loses_and_duplicates_nothing() {
    let server = TestServer::mock(0, |o| {
        o.workers = 4;
        o.queue_depth = 32;
    });
    let url = server.url("/v1/chat/completions");
    let results: Vec<(String, common::Answer)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..64)
            .map(|c| {
                let url = &url;
                s.spawn(move || {
                    (0..20)
                        .map(|r| {
                            let word = format!("c{c}r{r}");
                            let answer = post(url, &chat_body(&word, json!({})));
                            (word, answer)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(results.len(), 64 * 20);
    let mut ids = HashSet::new();
    let mut served = 0;
    for (word, answer) in &results {
        match answer.status {
            200 => {
                let json = answer.json();
                assert!(
                    ids.insert(json["id"].as_str().unwrap().to_string()),
                    "duplicate id"
                );
                // Mock replies with words of the prompt, so the answer proves whose it is.
                let text = json["choices"][0]["message"]["content"].as_str().unwrap();
                assert!(
                    !text.is_empty() && text.split(' ').all(|w| w == word),
                    "{word}: {text}"
                );
                served += 1;
            }
            503 => assert_eq!(answer.retry_after.as_deref(), Some("1")),
            other => panic!("{word}: status {other}: {}", answer.body),
        }
    }
    assert!(served > 0);
    let metrics = get(&server.url("/metrics")).body;
    let counted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("lmhost_requests_total{route=\"/v1/chat/completions\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, 64 * 20, "every request is counted once");
}

#[test]
fn graceful_shutdown_finishes_in_flight_requests() {
    let mut server = TestServer::mock(800, |_| {});
    let url = server.url("/v1/chat/completions");
    let in_flight = std::thread::spawn(move || post(&url, &chat_body("finish me", json!({}))));
    // Wait until the request is admitted (the metrics endpoint is not queued).
    let metrics = server.url("/metrics");
    let admitted = (0..1000).any(|_| {
        std::thread::sleep(Duration::from_millis(5));
        get(&metrics).body.contains("lmhost_queue_in_flight 1")
    });
    assert!(admitted, "the request never reached the queue");
    server.shutdown();
    let answer = in_flight.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("finish"));
}

/// `/tokenize` answers vLLM's shape and llama.cpp's; `/detokenize` names what the backend
/// cannot do; both refuse bad requests naming the field.
#[test]
fn tokenize_in_vllm_and_llama_cpp_shapes() {
    let server = TestServer::mock(0, |_| {});
    let local = common::open(&common::mock_config(0));
    let want = local
        .tokenize(&ConversationSnapshot::raw("alpha beta"), true)
        .unwrap();
    let vllm = post(
        &server.url("/tokenize"),
        &json!({"model": MODEL, "prompt": "alpha beta", "return_token_strs": true}).to_string(),
    );
    assert_eq!(vllm.status, 200, "{}", vllm.body);
    let vllm = vllm.json();
    assert_eq!(vllm["count"], 2);
    assert_eq!(vllm["tokens"], json!(want.token_ids.as_slice()));
    assert_eq!(vllm["token_strs"], json!(["alpha ", "beta"]));
    let llama = post(
        &server.url("/tokenize"),
        &json!({"content": "alpha beta", "with_pieces": true}).to_string(),
    )
    .json();
    assert_eq!(llama["tokens"][1]["id"], want.token_ids[1]);
    assert_eq!(llama["tokens"][1]["piece"], "beta");
    let chat = post(
        &server.url("/tokenize"),
        &json!({"messages": [{"role": "user", "content": "alpha"}]}).to_string(),
    )
    .json();
    assert_eq!(chat["count"], 2, "role marker and word: {chat}");
    for (body, param) in [
        (json!({"prompt": "a", "content": "a"}), "prompt"),
        (json!({"prompt": "a", "colour": 1}), "colour"),
        (
            json!({"prompt": "a", "add_generation_prompt": false}),
            "add_generation_prompt",
        ),
    ] {
        let answer = post(&server.url("/tokenize"), &body.to_string());
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        assert_eq!(answer.json()["error"]["param"], param, "{}", answer.body);
    }
    let answer = post(
        &server.url("/detokenize"),
        &json!({"tokens": [1, 2]}).to_string(),
    );
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cannot detokenize"));
}

/// A chat request may carry an agent's trace: `tools`, an assistant message of `tool_calls`
/// (content null) and `tool` messages; and vLLM's `documents`. They reach the backend (the mock reads a call's name
/// and arguments); a reply is the model's text, never parsed into calls. A trace whose answer
/// names no call is refused naming `messages`.
#[test]
fn chat_requests_carry_tool_calls_answers_and_documents() {
    let server = TestServer::mock(0, |_| {});
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let trace = |answers: &str| {
        json!([
            {"role": "user", "content": "Umbrella?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": answers, "content": "Rain."}
        ])
    };
    let tokens = post(
        &server.url("/tokenize"),
        &json!({"messages": trace("c1"), "tools": tools, "return_token_strs": true}).to_string(),
    );
    assert_eq!(tokens.status, 200, "{}", tokens.body);
    let pieces = tokens.json()["token_strs"].to_string();
    for word in ["get_weather", "Paris", "tool:", "Rain."] {
        assert!(pieces.contains(word), "{word} missing from {pieces}");
    }
    let chat = post(
        &server.url("/v1/chat/completions"),
        &json!({"model": MODEL, "messages": trace("c1"), "tools": tools, "max_tokens": 4})
            .to_string(),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);
    let message = &chat.json()["choices"][0]["message"];
    assert!(message["content"].is_string(), "{message}");
    // vLLM's `documents` reach the backend too.
    let grounded = post(
        &server.url("/tokenize"),
        &json!({"messages": [{"role": "user", "content": "Open?"}],
                "documents": [{"title": "Hours", "text": "Opens at nine."}],
                "return_token_strs": true})
        .to_string(),
    );
    assert_eq!(grounded.status, 200, "{}", grounded.body);
    assert!(grounded.json()["token_strs"].to_string().contains("nine."));
    let untexted = post(
        &server.url("/tokenize"),
        &json!({"messages": [{"role": "user", "content": "Open?"}], "documents": [{"title": "Hours"}]})
            .to_string(),
    );
    assert_eq!(untexted.status, 400, "{}", untexted.body);
    assert!(untexted
        .body
        .contains("documents[0] is not a JSON object with a string `text`"));
    let orphan = post(
        &server.url("/v1/chat/completions"),
        &json!({"model": MODEL, "messages": trace("c9"), "max_tokens": 4}).to_string(),
    );
    assert_eq!(orphan.status, 400, "{}", orphan.body);
    let error = &orphan.json()["error"];
    assert_eq!(error["param"], "messages", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("messages[2]: the tool message answers call \"c9\""),
        "{error}"
    );
}

/// `/generate` (SGLang's shape) scores from `logprob_start_len` on as the backend scores that
/// continuation after the tokens before it, and refuses what it cannot do by field.
#[test]
fn generate_scores_from_the_start_position_and_names_bad_fields() {
    let server = TestServer::mock(0, |_| {});
    let url = server.url("/generate");
    let text = "red green blue red";
    let body = json!({"text": text, "return_logprob": true, "logprob_start_len": 2,
                      "sampling_params": {"max_new_tokens": 0, "temperature": 0.0}});
    let answer = post(&url, &body.to_string());
    assert_eq!(answer.status, 200, "{}", answer.body);
    let meta = &answer.json()["meta_info"];
    assert_eq!(meta["prompt_tokens"], 4);
    assert_eq!(meta["completion_tokens"], 0);
    let entries = meta["input_token_logprobs"].as_array().unwrap();
    let local = common::open(&common::mock_config(0));
    let want = local
        .score(&ConversationSnapshot::raw("red green "), "blue red")
        .unwrap();
    let got: Vec<f32> = entries
        .iter()
        .map(|e| e[0].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got, want.logprobs.as_slice());
    let ids: Vec<u32> = entries
        .iter()
        .map(|e| e[1].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want.token_ids.as_slice());
    // From 0: the first token has no logprob; without `return_logprob`, the count alone.
    let from_zero = json!({"text": text, "return_logprob": true, "logprob_start_len": 0});
    let answer = post(&url, &from_zero.to_string()).json();
    let entries = answer["meta_info"]["input_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[0][0], Value::Null);
    let count = post(&url, &json!({"text": text}).to_string()).json();
    assert_eq!(count["meta_info"]["prompt_tokens"], 4);
    assert!(count["meta_info"].get("input_token_logprobs").is_none());
    let refused = [
        (
            json!({"text": text, "sampling_params": {"max_new_tokens": 8}}),
            "sampling_params.max_new_tokens",
        ),
        (json!({"text": text, "input_ids": [1, 2]}), "text"),
        (
            json!({"text": text, "return_logprob": true, "logprob_start_len": 4}),
            "logprob_start_len",
        ),
        (json!({"text": "", "return_logprob": true}), "text"),
        // mock's ids are hashes: it cannot read ids back into text, and says so.
        (
            json!({"input_ids": [1, 2, 3], "return_logprob": true}),
            "model",
        ),
        (json!({"text": text, "stream": true}), ""),
    ];
    for (body, param) in refused {
        let answer = post(&url, &body.to_string());
        assert_eq!(answer.status, 400, "{body}: {}", answer.body);
        let error = &answer.json()["error"];
        if !param.is_empty() {
            assert_eq!(error["param"], param, "{body}: {error}");
        }
    }
}
