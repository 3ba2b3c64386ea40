//! The `openai` plugin over real HTTP on loopback: against `lmhost serve` running mock (so its
//! answers can be compared with mock's own), and against a scripted server for retries,
//! timeouts and client errors.

mod common;

use common::{chat_answer, open, ScriptServer, TestServer, MODEL};
use lmhost::{ConversationSnapshot, Error, GenerationConfig};
use lmhost_plugin_api::{ErrorKind, Message, Role};

fn openai_config(base_url: &str, options: &str) -> String {
    format!(
        "[backend]\nkind = \"openai\"\nmodel_id = \"{MODEL}\"\n\
         [backend.options]\nbase_url = \"{base_url}\"\nbackoff_ms = 1\n{options}\n\
         [kv_cache]\nenabled = true\n"
    )
}

fn kind(err: &Error) -> Option<ErrorKind> {
    err.plugin_kind()
}

/// `lmhost serve` takes completion prompts literally and publishes no template, so scoring
/// through it renders chat with this one, as it would with the model's own.
const LINES_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:\n{% endif %}";

/// The openai config for `lmhost serve` at `url`, with [`LINES_TEMPLATE`] written into `dir`.
fn lmhost_config(url: &str, dir: &tempfile::TempDir, options: &str) -> String {
    let path = dir.path().join("lines.jinja");
    std::fs::write(&path, LINES_TEMPLATE).unwrap();
    openai_config(
        url,
        &format!("chat_template = \"{}\"\n{options}", path.display()),
    )
}

fn conversation() -> ConversationSnapshot {
    ConversationSnapshot::new(lmhost::conversation::group_turns([
        Message::text(Role::System, "Answer with colours."),
        Message::text(Role::User, "red green blue red green"),
    ]))
    .unwrap()
}

#[test]
fn generate_and_score_through_lmhost_serve_match_the_backend() {
    let server = TestServer::mock(0, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let remote = open(&lmhost_config(&server.url("/v1"), &dir, ""));
    assert!(
        remote.capabilities().scores_continuations,
        "flavor lmhost detected, template given"
    );
    let local = open(&common::mock_config(0));
    let config = GenerationConfig {
        max_new_tokens: 5,
        ..Default::default()
    };
    let snapshot = conversation();
    let want = local.generate(&snapshot, &config).unwrap();
    let got = remote.generate(&snapshot, &config).unwrap();
    assert_eq!(got.text, want.text);
    assert_eq!(got.token_ids, want.token_ids);
    assert_eq!(got.logprobs, want.logprobs);
    assert_eq!(got.finish_reason, want.finish_reason);
    assert_eq!(got.prompt_tokens, want.prompt_tokens);

    // Scoring sends the rendered prompt literally: the server scores that text's continuation.
    let rendered = "system: Answer with colours.\nuser: red green blue red green\nassistant:\n";
    let scored = remote.score(&snapshot, &got.text).unwrap();
    let want = local
        .score(&ConversationSnapshot::raw(rendered), &got.text)
        .unwrap();
    assert_eq!(scored.token_ids, got.token_ids);
    assert_eq!(
        (&scored.token_ids, &scored.logprobs, scored.prompt_tokens),
        (&want.token_ids, &want.logprobs, want.prompt_tokens)
    );
}

#[test]
fn score_batch_sends_every_prompt_and_keeps_their_order() {
    let server = TestServer::mock(0, |_| {});
    let dir = tempfile::tempdir().unwrap();
    let remote = open(&lmhost_config(&server.url("/v1"), &dir, "concurrency = 3"));
    let local = open(&common::mock_config(0));
    let prompts: Vec<_> = (0..8)
        .map(|i| format!("red {}", "green ".repeat(i)))
        .collect();
    let chats: Vec<_> = prompts
        .iter()
        .map(|p| ConversationSnapshot::from_prompt(p.as_str()))
        .collect();
    let got = remote.score_batch(&chats, "green red").unwrap();
    assert_eq!(got.len(), prompts.len());
    for (prompt, got) in prompts.iter().zip(&got) {
        let rendered = ConversationSnapshot::raw(format!("user: {prompt}\nassistant:\n"));
        let want = local.score(&rendered, "green red").unwrap();
        assert_eq!(
            (&got.token_ids, &got.logprobs),
            (&want.token_ids, &want.logprobs)
        );
    }
    assert_ne!(got[0].logprobs, got[7].logprobs, "prompts must matter");
}

#[test]
fn raw_text_generates_and_tokenizes_through_lmhost_serve() {
    let server = TestServer::mock(0, |_| {});
    let remote = open(&openai_config(&server.url("/v1"), ""));
    let local = open(&common::mock_config(0));
    let raw = ConversationSnapshot::raw("alpha beta gamma delta");
    let config = GenerationConfig {
        max_new_tokens: 3,
        ..Default::default()
    };
    let want = local.generate(&raw, &config).unwrap();
    let got = remote.generate(&raw, &config).unwrap();
    assert_eq!((&got.text, &got.logprobs), (&want.text, &want.logprobs));
    // Raw text needs no template to score.
    let want = local.score(&raw, " alpha beta").unwrap();
    let got = remote.score(&raw, " alpha beta").unwrap();
    assert_eq!(
        (&got.token_ids, &got.logprobs),
        (&want.token_ids, &want.logprobs)
    );
    let tokens = remote.tokenize(&raw, true).unwrap();
    assert_eq!(tokens, local.tokenize(&raw, true).unwrap());
    // The server's own words come back: mock's ids are hashes it cannot turn back into text.
    let err = remote.detokenize(&[1]).unwrap_err();
    assert!(err.to_string().contains("cannot detokenize"), "{err}");
}

#[test]
fn the_servers_prefix_cache_shows_as_cached_prompt_tokens() {
    let server = TestServer::mock(0, |_| {});
    let remote = open(&openai_config(&server.url("/v1"), ""));
    let snapshot = conversation();
    let config = GenerationConfig::default();
    let first = remote.generate(&snapshot, &config).unwrap();
    let second = remote.generate(&snapshot, &config).unwrap();
    assert_eq!(first.cached_prompt_tokens, 0);
    assert_eq!(second.cached_prompt_tokens, second.prompt_tokens - 1);
    let stats = remote.stats();
    assert_eq!(stats.kv_cache_hits, 1);
    assert_eq!(
        stats.kv_cache_reused_tokens,
        u64::from(second.cached_prompt_tokens)
    );
}

#[test]
fn stop_strings_and_sampling_settings_reach_the_server() {
    let server = TestServer::mock(0, |_| {});
    let remote = open(&openai_config(&server.url("/v1"), ""));
    let snapshot = ConversationSnapshot::from_prompt("alpha beta gamma delta");
    let config = GenerationConfig {
        temperature: 0.7,
        seed: 11,
        top_k: 4,
        ..Default::default()
    };
    let want = open(&common::mock_config(0))
        .generate(&snapshot, &config)
        .unwrap();
    let got = remote.generate(&snapshot, &config).unwrap();
    assert_eq!(got.text, want.text, "seeded sampling follows the seed");
    let stop = want.text.split(' ').nth(1).unwrap().to_string();
    let config = GenerationConfig {
        stop: vec![stop.into()].into(),
        ..config
    };
    let got = remote.generate(&snapshot, &config).unwrap();
    assert_eq!(
        got.finish_reason,
        lmhost_plugin_api::FinishReason::StopString
    );
}

#[test]
fn retries_503_then_succeeds() {
    let script = ScriptServer::start(vec![
        (503, r#"{"error": {"message": "warming up"}}"#.into()),
        (503, "busy".into()),
        (200, chat_answer("finally")),
    ]);
    let backend = open(&openai_config(
        &script.base_url(),
        "flavor = \"openai\"\nmax_retries = 3",
    ));
    let record = backend
        .generate(
            &ConversationSnapshot::from_prompt("hi"),
            &GenerationConfig::default(),
        )
        .unwrap();
    assert_eq!(record.text.as_str(), "finally");
    assert_eq!(record.prompt_tokens, 3);
    assert_eq!(script.count(), 3);
}

#[test]
fn gives_up_after_max_retries_with_the_status_and_message() {
    let script = ScriptServer::start(vec![(
        503,
        r#"{"error": {"message": "overloaded"}}"#.into(),
    )]);
    let backend = open(&openai_config(
        &script.base_url(),
        "flavor = \"openai\"\nmax_retries = 2",
    ));
    let err = backend
        .generate(
            &ConversationSnapshot::from_prompt("hi"),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::BackendUnavailable));
    let text = err.to_string();
    assert!(
        text.contains("503") && text.contains("overloaded"),
        "{text}"
    );
    assert_eq!(script.count(), 3, "one try and two retries");
}

#[test]
fn client_errors_are_not_retried_and_keep_the_servers_words() {
    let script = ScriptServer::start(vec![(
        400,
        r#"{"error": {"message": "max_tokens is too large: 99999"}}"#.into(),
    )]);
    let backend = open(&openai_config(
        &script.base_url(),
        "flavor = \"openai\"\nmax_retries = 5",
    ));
    let err = backend
        .generate(
            &ConversationSnapshot::from_prompt("hi"),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::InvalidInput));
    let text = err.to_string();
    assert!(
        text.contains("HTTP 400") && text.contains("max_tokens is too large"),
        "{text}"
    );
    assert_eq!(script.count(), 1);
}

#[test]
fn a_silent_server_times_out() {
    let script = ScriptServer::start(vec![(0, String::new())]);
    let backend = open(&openai_config(
        &script.base_url(),
        "flavor = \"openai\"\ntimeout_s = 1\nmax_retries = 3",
    ));
    let err = backend
        .generate(
            &ConversationSnapshot::from_prompt("hi"),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::BackendUnavailable));
    assert!(
        err.to_string().contains("did not answer within 1 s"),
        "{err}"
    );
    assert_eq!(script.count(), 1, "a timeout is not retried");
}

#[test]
fn the_api_key_is_sent_but_never_shown() {
    let script = ScriptServer::start(vec![(401, r#"{"error": {"message": "bad key"}}"#.into())]);
    std::env::set_var("LMHOST_TEST_OPENAI_KEY", "sk-very-secret");
    let backend = open(&openai_config(
        &script.base_url(),
        "flavor = \"openai\"\napi_key_env = \"LMHOST_TEST_OPENAI_KEY\"",
    ));
    let err = backend
        .generate(
            &ConversationSnapshot::from_prompt("hi"),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::Config));
    assert!(!format!("{err} {err:?}").contains("sk-very-secret"));
    assert!(err.to_string().contains("api_key_env"), "{err}");
    let requests = script.requests.lock().unwrap();
    assert!(
        requests[0].contains("Bearer sk-very-secret"),
        "{}",
        requests[0]
    );
}

#[test]
fn servers_without_prompt_logprobs_say_so_by_name() {
    let script = ScriptServer::start(vec![(200, chat_answer("x"))]);
    let backend = open(&openai_config(&script.base_url(), "flavor = \"llamacpp\""));
    assert!(!backend.capabilities().scores_continuations);
    let err = backend
        .score(&ConversationSnapshot::from_prompt("hi"), "there")
        .unwrap_err();
    assert_eq!(kind(&err), Some(ErrorKind::Unsupported));
    let text = err.to_string();
    assert!(
        text.contains("llamacpp") && text.contains(&script.base_url()),
        "{text}"
    );
}

/// The JSON body of a recorded request.
fn body_json(request: &str) -> serde_json::Value {
    let body = request.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {request}"))
}

/// A local chat template for the vLLM and SGLang routes, which publish none.
fn template_file(dir: &tempfile::TempDir) -> String {
    let path = dir.path().join("tokenizer_config.json");
    let config = serde_json::json!({
        "chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path.display().to_string()
}

/// vLLM's echo answer with `return_tokens_as_token_ids`, as `OpenAIServingCompletion.
/// _create_completion_logprobs` (vllm/entrypoints/openai/serving_completion.py) writes it: the
/// tokens are `token_id:N` strings, and `text_offset` adds up the lengths of those strings, not
/// of the prompt's text; the last token is the generated one.
fn vllm_echo(ids: &[u32], logprobs: &[Option<f64>], generated: u32) -> String {
    let tokens: Vec<String> = ids.iter().map(|id| format!("token_id:{id}")).collect();
    let mut offset = 0;
    let offsets: Vec<usize> = tokens
        .iter()
        .map(|t| {
            let at = offset;
            offset += t.len();
            at
        })
        .collect();
    serde_json::json!({
        "choices": [{"index": 0, "text": "", "logprobs": {
            "tokens": tokens, "token_logprobs": logprobs, "top_logprobs": null,
            "text_offset": offsets}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": ids.len() as u32 - generated, "completion_tokens": generated,
                  "total_tokens": ids.len(), "prompt_tokens_details": {"cached_tokens": 2}}
    })
    .to_string()
}

/// vLLM's `/tokenize` answer (serving_tokenization.py).
fn vllm_tokens(ids: &[u32]) -> String {
    serde_json::json!({"count": ids.len(), "max_model_len": 2048, "tokens": ids,
                       "token_strs": null})
    .to_string()
}

#[test]
fn vllm_scores_by_tokens_counted_with_its_own_tokenizer() {
    // Prompt "<user>hi<assistant>" is 3 tokens; prompt + reply is 5; the echo holds those 5
    // and one generated token.
    let script = ScriptServer::start(vec![
        (200, vllm_tokens(&[1, 2, 3])),
        (200, vllm_tokens(&[1, 2, 3, 30, 31])),
        (
            200,
            vllm_echo(
                &[1, 2, 3, 30, 31, 9],
                &[
                    None,
                    Some(-0.1),
                    Some(-0.2),
                    Some(-0.25),
                    Some(-0.5),
                    Some(-2.0),
                ],
                1,
            ),
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let backend = open(&openai_config(
        &script.base_url(),
        &format!(
            "flavor = \"vllm\"\nchat_template = \"{}\"",
            template_file(&dir)
        ),
    ));
    assert!(backend.capabilities().scores_continuations);
    let record = backend
        .score(&ConversationSnapshot::from_prompt("hi"), "schön, 世界")
        .unwrap();
    assert_eq!(record.token_ids.as_slice(), &[30, 31]);
    assert_eq!(record.logprobs.as_slice(), &[-0.25, -0.5]);
    assert_eq!((record.prompt_tokens, record.cached_prompt_tokens), (3, 2));
    let requests = script.requests.lock().unwrap().clone();
    assert!(requests[0].starts_with("POST /tokenize"), "{}", requests[0]);
    assert_eq!(body_json(&requests[0])["prompt"], "<user>hi<assistant>");
    assert_eq!(
        body_json(&requests[1])["prompt"],
        "<user>hi<assistant>schön, 世界"
    );
    assert!(
        requests[2].starts_with("POST /v1/completions"),
        "{}",
        requests[2]
    );
    let body = body_json(&requests[2]);
    assert_eq!(body["prompt"], "<user>hi<assistant>schön, 世界");
    assert_eq!(body["echo"], true);
    assert_eq!(body["return_tokens_as_token_ids"], true);
    // The template writes its own BOS: vLLM adds none, in tokenizing and in the echo alike.
    assert_eq!(body["add_special_tokens"], false);
    assert_eq!(body_json(&requests[0])["add_special_tokens"], false);
}

#[test]
fn a_merged_boundary_a_miscount_or_no_reply_tokens_is_an_error_naming_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let options = format!(
        "flavor = \"vllm\"\nchat_template = \"{}\"",
        template_file(&dir)
    );
    let echo = vllm_echo(
        &[1, 2, 3, 30, 9],
        &[None, Some(-0.1), Some(-0.2), Some(-0.3), Some(-1.0)],
        1,
    );
    let cases = [
        // The prompt's last token and the reply's first merge into one.
        (
            vec![
                (200, vllm_tokens(&[1, 2, 3])),
                (200, vllm_tokens(&[1, 2, 40])),
            ],
            "prefix",
        ),
        // The echo's tokens are not the ones the tokenizer counts.
        (
            vec![
                (200, vllm_tokens(&[1, 2, 3])),
                (200, vllm_tokens(&[1, 2, 3, 31])),
                (200, echo.clone()),
            ],
            "echoed token 30 where its tokenizer has 31",
        ),
        // The echo's logprob array is shorter than its token array.
        (
            vec![
                (200, vllm_tokens(&[1, 2, 3])),
                (200, vllm_tokens(&[1, 2, 3, 30])),
                (
                    200,
                    serde_json::json!({"choices": [{"text": "", "logprobs": {
                        "tokens": ["token_id:1", "token_id:2", "token_id:3", "token_id:30"],
                        "token_logprobs": [null, -0.1], "text_offset": [0, 10, 20, 30]}}],
                        "usage": {"prompt_tokens": 4, "completion_tokens": 0}})
                    .to_string(),
                ),
            ],
            "as many `token_logprobs` as `tokens`",
        ),
        // The reply has no tokens of its own.
        (
            vec![
                (200, vllm_tokens(&[1, 2, 3, 30])),
                (200, vllm_tokens(&[1, 2, 3, 30])),
                (200, echo),
            ],
            "no tokens to score",
        ),
    ];
    for (script, expected) in cases {
        let script = ScriptServer::start(script);
        let backend = open(&openai_config(&script.base_url(), &options));
        let err = backend
            .score(&ConversationSnapshot::from_prompt("hi"), "yes")
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains(expected), "{expected}: {text}");
        assert!(text.contains(&script.addr.to_string()), "{text}");
    }
}

/// SGLang's answers as `TokenizerManager` writes them (python/sglang/srt/managers/
/// tokenizer_manager.py, `convert_logprob_style`): `meta_info.input_token_logprobs` holds
/// `[logprob, token_id, null]` (no text unless `return_text_in_logprobs`) from
/// `logprob_start_len` on.
#[test]
fn sglang_scores_through_native_generate_from_the_prompt_length() {
    let script = ScriptServer::start(vec![
        (
            200,
            r#"{"text": "", "meta_info": {"prompt_tokens": 5}}"#.into(),
        ),
        (
            200,
            r#"{"text": "", "meta_info": {"prompt_tokens": 7, "cached_tokens": 5,
                "input_token_logprobs": [[-0.5, 11, null], [-1.5, 12, null]]}}"#
                .into(),
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let backend = open(&openai_config(
        &script.base_url(),
        &format!(
            "flavor = \"sglang\"\nchat_template = \"{}\"",
            template_file(&dir)
        ),
    ));
    let record = backend
        .score(&ConversationSnapshot::from_prompt("hi"), "yes no")
        .unwrap();
    assert_eq!(record.token_ids.as_slice(), &[11, 12]);
    assert_eq!(record.logprobs.as_slice(), &[-0.5, -1.5]);
    assert_eq!((record.prompt_tokens, record.cached_prompt_tokens), (5, 5));
    let requests = script.requests.lock().unwrap();
    assert!(requests[0].starts_with("POST /generate"), "{}", requests[0]);
    assert_eq!(body_json(&requests[0])["text"], "<user>hi<assistant>");
    let body = body_json(&requests[1]);
    assert_eq!(body["logprob_start_len"], 5);
    assert_eq!(body["text"], "<user>hi<assistant>yes no");
    assert_eq!(body["return_logprob"], true);
}

/// A chat streams through the server's own event stream, delta by delta, and a sink that says
/// stop drops the connection, so the server stops generating too.
#[test]
fn chat_relays_the_servers_event_stream_and_stops_it_when_told() {
    let upstream = TestServer::start(
        &format!(
            "[backend]\nkind = \"mock\"\nmodel_id = \"{MODEL}\"\n\
             [backend.options]\nreply_words = 30\ntoken_latency_ms = 20\n"
        ),
        |_| {},
    );
    let backend = open(&openai_config(&upstream.url("/v1"), ""));
    let snapshot = ConversationSnapshot::from_prompt("one two three four");
    let config = GenerationConfig {
        max_new_tokens: 30,
        ..GenerationConfig::default()
    };
    let mut deltas = Vec::new();
    let record = backend
        .generate_stream(&snapshot, &config, |d| {
            deltas.push(d.text.to_string());
            true
        })
        .unwrap();
    assert_eq!(
        deltas.iter().filter(|d| !d.is_empty()).count(),
        30,
        "{deltas:?}"
    );
    assert_eq!(deltas.concat(), record.text.as_str());
    assert_eq!(record.token_ids.len(), 30);
    assert_eq!(
        backend.generate(&snapshot, &config).unwrap().text,
        record.text
    );
    let mut seen = 0;
    let cut = backend
        .generate_stream(&snapshot, &config, |d| {
            seen += usize::from(!d.text.is_empty());
            seen < 3
        })
        .unwrap();
    assert_eq!(cut.finish_reason, lmhost_plugin_api::FinishReason::Length);
    assert!(cut.token_ids.len() < 30, "{} tokens", cut.token_ids.len());
    common::wait_until_idle(&upstream);
    let generated = common::metric(&upstream, "lmhost_completion_tokens_total");
    assert!(
        generated < 90.0,
        "the server went on generating: {generated} of 90 words"
    );
}

/// An agent's trace and its documents reach the server in OpenAI's shape (and vLLM's
/// `documents`): a message of calls alone has null content, each call its arguments as JSON
/// text, each answer the id of its call.
#[test]
fn a_trace_reaches_the_server_in_openais_shape() {
    let script = ScriptServer::start(vec![(200, chat_answer("x"))]);
    let backend = open(&openai_config(&script.base_url(), "flavor = \"vllm\""));
    let trace = lmhost::conversation::parse(
        r#"{"tools": [{"type": "function", "function": {"name": "get_weather"}}],
            "documents": [{"title": "Hours", "text": "Opens at nine."}],
            "messages": [
              {"role": "user", "content": "Umbrella?"},
              {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}]},
              {"role": "tool", "tool_call_id": "c1", "content": "Rain."}
            ]}"#,
        std::path::Path::new("trace.json"),
    )
    .unwrap();
    backend
        .generate(&trace, &GenerationConfig::default())
        .unwrap();
    let requests = script.requests.lock().unwrap();
    let body = body_json(requests.last().unwrap());
    assert_eq!(
        body["messages"],
        serde_json::json!([
            {"role": "user", "content": "Umbrella?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
            {"role": "tool", "content": "Rain.", "tool_call_id": "c1"}
        ])
    );
    assert_eq!(body["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(body["documents"][0]["text"], "Opens at nine.");
}
