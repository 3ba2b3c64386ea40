//! `score`: teacher-forced logprobs of a reply, by the best route the server offers.
//!
//! - vLLM and `lmhost serve`: `/v1/completions` with the rendered prompt + reply, `echo` and
//!   `logprobs`; the reply's tokens are the echoed ones at or past the reply's text offset.
//! - SGLang: native `/generate` with `return_logprob` and `logprob_start_len` = the prompt's
//!   length in tokens (learned from a first, generation-free call on the prompt alone, which also
//!   warms SGLang's prefix cache for the second), so only the reply's logprobs are computed.
//! - OpenAI and llama.cpp return no prompt logprobs: `Unsupported`, naming the server.

use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{ConversationSnapshot, PluginError, ScoreRecord};

use crate::chat::{short, token_id};
use crate::client::Client;
use crate::flavor::Flavor;
use lmhost_plugin_kit::prompt::PromptFormat;

pub struct Scorer<'a> {
    pub client: &'a Client,
    pub flavor: Flavor,
    pub format: &'a PromptFormat,
    pub model: &'a str,
}

impl Scorer<'_> {
    pub fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        if !self.flavor.scores() {
            return Err(PluginError::unsupported(format!(
                "the {} server at {} cannot return prompt logprobs, so it cannot score replies; \
                 use vLLM, SGLang or `lmhost serve` (option `flavor`)",
                self.flavor,
                self.client.base_url()
            )));
        }
        // Chat prompts are written here with the model's template; raw text needs none.
        let prompt = self.format.render(snapshot, self.model)?.text;
        match self.flavor {
            Flavor::Sglang => self.sglang(&prompt, reply),
            _ => self.echo(&prompt, reply),
        }
    }

    fn echo(&self, prompt: &str, reply: &str) -> Result<ScoreRecord, PluginError> {
        let mut body = json!({
            "model": self.model,
            "prompt": format!("{prompt}{reply}"),
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": true,
            "logprobs": 1,
        });
        if self.flavor.returns_token_ids_on_request() {
            body["return_tokens_as_token_ids"] = json!(true);
        }
        let answer = self.client.post("/completions", &body)?;
        echo_record(&answer, prompt.len(), self.client.base_url())
    }

    fn sglang(&self, prompt: &str, reply: &str) -> Result<ScoreRecord, PluginError> {
        let url = format!("{}/generate", self.client.root_url());
        let probe = json!({"text": prompt, "sampling_params": {"max_new_tokens": 0}});
        let answer = self.client.post_root("/generate", &probe)?;
        let prompt_tokens = answer
            .pointer("/meta_info/prompt_tokens")
            .and_then(Value::as_u64)
            .ok_or_else(|| missing(&url, "`meta_info.prompt_tokens`", &answer))?;
        let body = json!({
            "text": format!("{prompt}{reply}"),
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
            "return_logprob": true,
            "logprob_start_len": prompt_tokens,
        });
        let answer = self.client.post_root("/generate", &body)?;
        sglang_record(&answer, prompt_tokens as u32, &url)
    }
}

/// Reads a `/v1/completions` echo answer: the reply is what starts at or after `prompt_len`
/// among the echoed tokens (the last `completion_tokens` entries were generated, not echoed).
pub fn echo_record(
    answer: &Value,
    prompt_len: usize,
    url: &str,
) -> Result<ScoreRecord, PluginError> {
    let logprobs = answer
        .pointer("/choices/0/logprobs")
        .ok_or_else(|| missing(url, "`choices[0].logprobs`", answer))?;
    let array = |key: &str| {
        logprobs
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| missing(url, &format!("`logprobs.{key}`"), answer))
    };
    let (tokens, values, offsets) = (
        array("tokens")?,
        array("token_logprobs")?,
        array("text_offset")?,
    );
    let usage = |key: &str| answer.pointer(key).and_then(Value::as_u64).unwrap_or(0) as usize;
    let generated = usage("/usage/completion_tokens");
    let echoed = tokens.len().saturating_sub(generated);
    let mut record = ScoreRecord {
        token_ids: Default::default(),
        logprobs: Default::default(),
        prompt_tokens: 0,
        cached_prompt_tokens: usage("/usage/prompt_tokens_details/cached_tokens") as u32,
    };
    for i in 0..echoed {
        let offset = offsets.get(i).and_then(Value::as_u64);
        let offset = offset.ok_or_else(|| missing(url, "a `text_offset` per token", answer))?;
        if (offset as usize) < prompt_len {
            continue;
        }
        let logprob = values.get(i).and_then(Value::as_f64);
        let logprob =
            logprob.ok_or_else(|| missing(url, "a logprob for each reply token", answer))?;
        record.token_ids.push(token_id(tokens.get(i)));
        record.logprobs.push(logprob as f32);
    }
    record.prompt_tokens =
        (usage("/usage/prompt_tokens") as u32).saturating_sub(record.token_ids.len() as u32);
    Ok(record)
}

/// Reads SGLang's `meta_info.input_token_logprobs`: `[logprob, token_id, text]` per token
/// from `logprob_start_len` on.
pub fn sglang_record(
    answer: &Value,
    prompt_tokens: u32,
    url: &str,
) -> Result<ScoreRecord, PluginError> {
    let entries = answer
        .pointer("/meta_info/input_token_logprobs")
        .and_then(Value::as_array)
        .ok_or_else(|| missing(url, "`meta_info.input_token_logprobs`", answer))?;
    let mut record = ScoreRecord {
        token_ids: Default::default(),
        logprobs: Default::default(),
        prompt_tokens,
        cached_prompt_tokens: answer
            .pointer("/meta_info/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32,
    };
    for entry in entries {
        let logprob = entry.get(0).and_then(Value::as_f64);
        let id = entry.get(1).and_then(Value::as_u64);
        let (Some(logprob), Some(id)) = (logprob, id) else {
            return Err(missing(url, "`[logprob, token_id, ...]` entries", answer));
        };
        record.token_ids.push(id as u32);
        record.logprobs.push(logprob as f32);
    }
    Ok(record)
}

fn missing(url: &str, what: &str, answer: &Value) -> PluginError {
    PluginError::unavailable(format!("{url} answered without {what}: {}", short(answer)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_keeps_reply_tokens_and_drops_the_generated_one() {
        // vLLM's shape: prompt tokens, reply tokens, then the one token max_tokens=1 generated.
        let answer = json!({
            "choices": [{"logprobs": {
                "tokens": ["token_id:1", "token_id:2", "token_id:3", "token_id:4", "token_id:5"],
                "token_logprobs": [null, -0.1, -0.2, -0.3, -0.4],
                "text_offset": [0, 3, 6, 8, 10]
            }}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 1,
                      "prompt_tokens_details": {"cached_tokens": 2}}
        });
        let record = echo_record(&answer, 6, "u").unwrap();
        assert_eq!(record.token_ids.as_slice(), &[3, 4]);
        assert_eq!(record.logprobs.as_slice(), &[-0.2, -0.3]);
        assert_eq!((record.prompt_tokens, record.cached_prompt_tokens), (2, 2));
    }

    #[test]
    fn sglang_entries_become_the_record() {
        let answer = json!({"meta_info": {
            "input_token_logprobs": [[-0.5, 11, null], [-1.5, 12, null]],
            "cached_tokens": 7
        }});
        let record = sglang_record(&answer, 9, "u").unwrap();
        assert_eq!(record.token_ids.as_slice(), &[11, 12]);
        assert_eq!(record.logprobs.as_slice(), &[-0.5, -1.5]);
        assert_eq!((record.prompt_tokens, record.cached_prompt_tokens), (9, 7));
        let err = sglang_record(&json!({"meta_info": {}}), 9, "u").unwrap_err();
        assert!(err.message.contains("input_token_logprobs"), "{err}");
    }
}
