//! `generate` over `/v1/chat/completions`: the request body for a snapshot and config, and the
//! answer read back into a `GenerationRecord`. Every field of the answer is checked; a missing
//! or mistyped one is an error naming it, never a panic.

use lmhost_plugin_api::serde_json::{json, Map, Value};
use lmhost_plugin_api::{
    ConversationSnapshot, FinishReason, GenerationConfig, GenerationRecord, Message, PluginError,
    TokenDelta,
};

use crate::flavor::Flavor;

/// The id recorded for a token when the server gave only its text.
pub const UNKNOWN_TOKEN: u32 = u32::MAX;

pub fn request(
    model: &str,
    flavor: Flavor,
    snapshot: &ConversationSnapshot,
    config: &GenerationConfig,
) -> Value {
    let messages: Vec<Value> = snapshot.messages().map(message).collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    // `documents` is vLLM's extension; a server without it is not sent one unasked.
    for (key, texts) in [
        ("tools", &snapshot.tools),
        ("documents", &snapshot.documents),
    ] {
        if !texts.is_empty() {
            let values = texts.iter().map(|t| json_text(t)).collect();
            body.insert(key.into(), Value::Array(values));
        }
    }
    body.insert("max_tokens".into(), json!(config.max_new_tokens));
    body.insert("temperature".into(), json!(config.temperature));
    body.insert("top_p".into(), json!(config.top_p));
    body.insert("logprobs".into(), json!(true));
    // llama-cpp-python returns logprobs only when top_logprobs asks for some; `lmhost serve`
    // returns the chosen token's alone and refuses top_logprobs.
    if flavor != Flavor::Lmhost {
        body.insert("top_logprobs".into(), json!(1));
    }
    if config.temperature > 0.0 {
        body.insert("seed".into(), json!(config.seed));
    }
    if config.top_k > 0 && flavor.takes_top_k() {
        body.insert("top_k".into(), json!(config.top_k));
    }
    if !config.stop.is_empty() {
        let stop: Vec<&str> = config.stop.iter().map(|s| s.as_str()).collect();
        body.insert("stop".into(), json!(stop));
    }
    if flavor.returns_token_ids_on_request() {
        body.insert("return_tokens_as_token_ids".into(), json!(true));
    }
    Value::Object(body)
}

/// A message in OpenAI's shape: its calls with their arguments as JSON text, a tool's answer
/// with the id of its call, and no `content` for a message of calls alone.
fn message(m: &Message) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), json!(m.role.as_str()));
    let calls_alone = m.parts.is_empty() && !m.tool_calls.is_empty();
    let content = match calls_alone {
        true => Value::Null,
        false => json!(m.text_content()),
    };
    out.insert("content".into(), content);
    if !m.tool_calls.is_empty() {
        let calls = (m.tool_calls.iter())
            .map(|c| {
                json!({"id": c.id.as_str(), "type": "function",
                       "function": {"name": c.name.as_str(), "arguments": c.arguments.as_str()}})
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = m.tool_call_id.as_ref().into_option() {
        out.insert("tool_call_id".into(), json!(id.as_str()));
    }
    Value::Object(out)
}

/// A tool or document as the JSON it holds (checked to be an object when the snapshot was
/// made). Its keys
/// reach the server sorted, as serde_json keeps them; the prompt lmhost scores itself renders
/// them in their own order.
fn json_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| json!(text))
}

pub fn record(answer: &Value, url: &str) -> Result<GenerationRecord, PluginError> {
    let bad = |what: &str| {
        PluginError::unavailable(format!("{url} answered without {what}: {}", short(answer)))
    };
    let choice = answer
        .pointer("/choices/0")
        .ok_or_else(|| bad("`choices[0]`"))?;
    let text = match choice.pointer("/message/content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(_) => return Err(bad("a string `choices[0].message.content`")),
    };
    let mut token_ids = Vec::new();
    let mut logprobs = Vec::new();
    if let Some(Value::Array(tokens)) = choice.pointer("/logprobs/content") {
        for token in tokens {
            let logprob = token
                .get("logprob")
                .and_then(Value::as_f64)
                .ok_or_else(|| bad("a number `logprob` for each token"))?;
            logprobs.push(logprob as f32);
            token_ids.push(token_id(token.get("token")));
        }
    }
    let finish_reason = finish_reason(choice);
    let usage = answer.get("usage");
    let count = |pointer: &str| {
        usage
            .and_then(|u| u.pointer(pointer))
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32
    };
    Ok(GenerationRecord {
        text: text.into(),
        token_ids: token_ids.into(),
        logprobs: logprobs.into(),
        embedding: None.into(),
        contextual_embedding: None.into(),
        prompt_tokens: count("/prompt_tokens"),
        cached_prompt_tokens: count("/prompt_tokens_details/cached_tokens"),
        finish_reason,
    })
}

/// A streamed chat reply put together from its chunks (`stream: true` with usage).
#[derive(Default)]
pub struct Streamed {
    text: String,
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
    prompt_tokens: u32,
    cached_prompt_tokens: u32,
}

impl Streamed {
    /// Takes one chunk; returns the tokens and text it adds.
    pub fn take(&mut self, chunk: &Value) -> TokenDelta {
        let mut delta = TokenDelta::default();
        if let Some(choice) = chunk.pointer("/choices/0") {
            let text = choice.pointer("/delta/content").and_then(Value::as_str);
            delta.text = text.unwrap_or_default().into();
            if let Some(Value::Array(tokens)) = choice.pointer("/logprobs/content") {
                for token in tokens {
                    let logprob = token.get("logprob").and_then(Value::as_f64);
                    delta.logprobs.push(logprob.unwrap_or(f64::NAN) as f32);
                    delta.token_ids.push(token_id(token.get("token")));
                }
            }
            if choice.get("finish_reason").is_some_and(Value::is_string) {
                self.finish = Some(finish_reason(choice));
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
            self.prompt_tokens = count("/prompt_tokens").unwrap_or(0) as u32;
            self.cached_prompt_tokens =
                count("/prompt_tokens_details/cached_tokens").unwrap_or(0) as u32;
        }
        self.text.push_str(&delta.text);
        self.token_ids.extend(delta.token_ids.iter());
        self.logprobs.extend(delta.logprobs.iter());
        delta
    }

    /// The reply so far; a stream that ended without a finish reason was cut short.
    pub fn record(self) -> GenerationRecord {
        GenerationRecord {
            text: self.text.into(),
            token_ids: self.token_ids.into(),
            logprobs: self.logprobs.into(),
            embedding: None.into(),
            contextual_embedding: None.into(),
            prompt_tokens: self.prompt_tokens,
            cached_prompt_tokens: self.cached_prompt_tokens,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
        }
    }
}

/// Why a choice ended; vLLM and lmhost say which stop string ended generation (a stop token
/// is a number).
pub fn finish_reason(choice: &Value) -> FinishReason {
    match choice.get("finish_reason").and_then(Value::as_str) {
        Some("length") => FinishReason::Length,
        _ if choice.get("stop_reason").is_some_and(Value::is_string) => FinishReason::StopString,
        _ => FinishReason::Eos,
    }
}

/// `token_id:N` (vLLM's `return_tokens_as_token_ids`, and `lmhost serve`) gives the id.
pub fn token_id(token: Option<&Value>) -> u32 {
    token
        .and_then(Value::as_str)
        .and_then(|t| t.strip_prefix("token_id:"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(UNKNOWN_TOKEN)
}

/// An answer cut short for an error message.
pub fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_sends_top_k_and_ids_only_where_taken() {
        let snapshot = ConversationSnapshot::from_prompt("hi");
        let config = GenerationConfig {
            top_k: 5,
            ..GenerationConfig::default()
        };
        let vllm = request("m", Flavor::Vllm, &snapshot, &config);
        assert_eq!(vllm["top_k"], 5);
        assert_eq!(vllm["return_tokens_as_token_ids"], true);
        assert_eq!(vllm["messages"][0]["content"], "hi");
        let openai = request("m", Flavor::OpenAi, &snapshot, &config);
        assert!(openai.get("top_k").is_none());
        assert!(openai.get("return_tokens_as_token_ids").is_none());
        assert!(openai.get("seed").is_none(), "greedy requests need no seed");
    }

    #[test]
    fn record_reads_logprobs_usage_and_stop_reason() {
        let answer = json!({
            "choices": [{
                "message": {"role": "assistant", "content": "a b"},
                "logprobs": {"content": [
                    {"token": "token_id:7", "logprob": -0.5},
                    {"token": "b", "logprob": -1.0}
                ]},
                "finish_reason": "stop",
                "stop_reason": "END"
            }],
            "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                      "prompt_tokens_details": {"cached_tokens": 4}}
        });
        let record = record(&answer, "u").unwrap();
        assert_eq!(record.text.as_str(), "a b");
        assert_eq!(record.token_ids.as_slice(), &[7, UNKNOWN_TOKEN]);
        assert_eq!(record.logprobs.as_slice(), &[-0.5, -1.0]);
        assert_eq!((record.prompt_tokens, record.cached_prompt_tokens), (9, 4));
        assert_eq!(record.finish_reason, FinishReason::StopString);
    }

    #[test]
    fn malformed_answers_are_errors_naming_the_field() {
        let err = record(&json!({"choices": []}), "u").unwrap_err();
        assert!(err.message.contains("choices[0]"), "{err}");
        let answer = json!({"choices": [{"message": {"content": "x"},
            "logprobs": {"content": [{"token": "x", "logprob": "high"}]}}]});
        let err = record(&answer, "u").unwrap_err();
        assert!(err.message.contains("logprob"), "{err}");
    }
}
