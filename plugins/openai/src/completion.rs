//! `generate` from raw text over `/v1/completions`: the prompt goes to the model literally, with
//! no chat template (base models, raw continuations).

use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{ConversationSnapshot, GenerationConfig, GenerationRecord, PluginError};

use crate::chat::{finish_reason, short, token_id};
use crate::flavor::Flavor;

/// The request body: `chat::request`'s sampling fields, with `prompt` for `messages`.
pub fn request(
    model: &str,
    flavor: Flavor,
    snapshot: &ConversationSnapshot,
    config: &GenerationConfig,
) -> Value {
    let mut body = crate::chat::request(model, flavor, snapshot, config);
    if let Some(fields) = body.as_object_mut() {
        fields.remove("messages");
        fields.insert("prompt".into(), json!(snapshot.raw_text()));
        // Legacy completions take how many alternatives per token, not a flag.
        fields.insert("logprobs".into(), json!(1));
    }
    body
}

/// Reads `choices[0].text` and the legacy `logprobs.{tokens, token_logprobs}`.
pub fn record(answer: &Value, url: &str) -> Result<GenerationRecord, PluginError> {
    let bad = |what: &str| {
        PluginError::unavailable(format!("{url} answered without {what}: {}", short(answer)))
    };
    let choice = answer
        .pointer("/choices/0")
        .ok_or_else(|| bad("`choices[0]`"))?;
    let text = choice
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a string `choices[0].text`"))?;
    let (mut token_ids, mut logprobs) = (Vec::new(), Vec::new());
    if let Some(tokens) = choice.pointer("/logprobs/tokens").and_then(Value::as_array) {
        let values = choice
            .pointer("/logprobs/token_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("`logprobs.token_logprobs`"))?;
        for (token, value) in tokens.iter().zip(values) {
            let logprob = value
                .as_f64()
                .ok_or_else(|| bad("a number logprob for each token"))?;
            token_ids.push(token_id(Some(token)));
            logprobs.push(logprob as f32);
        }
    }
    let count = |pointer: &str| answer.pointer(pointer).and_then(Value::as_u64).unwrap_or(0) as u32;
    Ok(GenerationRecord {
        text: text.into(),
        token_ids: token_ids.into(),
        logprobs: logprobs.into(),
        embedding: None.into(),
        contextual_embedding: None.into(),
        prompt_tokens: count("/usage/prompt_tokens"),
        cached_prompt_tokens: count("/usage/prompt_tokens_details/cached_tokens"),
        finish_reason: finish_reason(choice),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::FinishReason;

    #[test]
    fn raw_text_is_the_prompt_and_no_messages_are_sent() {
        let snapshot = ConversationSnapshot::raw("The capital of France is");
        let body = request("m", Flavor::Vllm, &snapshot, &GenerationConfig::default());
        assert_eq!(body["prompt"], "The capital of France is");
        assert!(body.get("messages").is_none());
        assert_eq!(body["logprobs"], 1);
    }

    #[test]
    fn record_reads_text_and_legacy_logprobs() {
        let answer = json!({
            "choices": [{"text": " Paris", "finish_reason": "length",
                "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.25]}}],
            "usage": {"prompt_tokens": 6, "completion_tokens": 1}
        });
        let record = record(&answer, "u").unwrap();
        assert_eq!(record.text.as_str(), " Paris");
        assert_eq!(record.token_ids.as_slice(), &[5]);
        assert_eq!(record.logprobs.as_slice(), &[-0.25]);
        assert_eq!(record.finish_reason, FinishReason::Length);
        let err = super::record(&json!({"choices": [{}]}), "u").unwrap_err();
        assert!(err.message.contains("choices[0].text"), "{err}");
    }
}
