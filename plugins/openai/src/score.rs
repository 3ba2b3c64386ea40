//! `score`: teacher-forced logprobs of a reply, by the route the server offers, with the reply
//! found by tokens, never by text offsets (servers count offsets in characters or bytes, of
//! texts that may leave special tokens out, or of `token_id:N` strings).
//!
//! - Echo (vLLM, llama-cpp-python): the server's own tokenizer gives the prompt's and prompt +
//!   reply's tokens (the first must be a prefix of the second); then `/v1/completions` with
//!   `echo` and `logprobs` on prompt + reply, whose echoed tokens past the prompt's are the
//!   reply's. Without a tokenizer endpoint, a prompt-only echo request counts the prompt's
//!   tokens.
//! - SGLang and `lmhost serve`: native `/generate` with `return_logprob` and
//!   `logprob_start_len` = the prompt's length in tokens (learned from a first, generation-free
//!   call on the prompt alone, which also warms SGLang's prefix cache for the second), so only
//!   the reply's logprobs are computed and the server's prefix cache serves the prompt.
//! - Token ids (the `tokenizer` option, servers that take them): prompt and prompt + reply
//!   tokenized here, one request: SGLang's and `lmhost serve`'s `/generate` with `input_ids`
//!   and `logprob_start_len`, or vLLM's echo of the ids.
//! - OpenAI and llama.cpp's server return no prompt logprobs: `Unsupported`, naming the server.

use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{ConversationSnapshot, PluginError, ScoreRecord};
use lmhost_plugin_kit::prompt::{Prompt, PromptFormat};
use lmhost_plugin_kit::tokenizer::TextTokenizer;

use crate::abilities::{Abilities, Scoring};
use crate::chat::{short, token_id, UNKNOWN_TOKEN};
use crate::client::Client;
use crate::flavor::Flavor;

pub struct Scorer<'a> {
    pub client: &'a Client,
    pub flavor: Flavor,
    pub abilities: Abilities,
    pub format: &'a PromptFormat,
    pub model: &'a str,
    /// The model's tokenizer, where the server takes ids.
    pub ids: Option<&'a TextTokenizer>,
}

impl Scorer<'_> {
    pub fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        if self.abilities.scoring == Scoring::None {
            return Err(PluginError::unsupported(format!(
                "the {} server at {} returns no prompt logprobs, so it cannot score replies; \
                 use vLLM, SGLang, llama-cpp-python or `lmhost serve`",
                self.flavor,
                self.client.base_url()
            )));
        }
        // Chat prompts are written here with the model's template; raw text needs none.
        let prompt = self.format.render(snapshot, self.model)?;
        let record = match (self.ids, self.abilities.scoring) {
            (Some(tokenizer), _) => self.by_ids(tokenizer, &prompt, reply)?,
            (None, Scoring::SglangGenerate) => self.sglang(&prompt.text, reply)?,
            (None, _) => self.echo(&prompt, reply)?,
        };
        if record.token_ids.is_empty() && !reply.is_empty() {
            return Err(PluginError::unavailable(format!(
                "the server at {} gave the non-empty reply {reply:?} no tokens to score",
                self.client.base_url()
            )));
        }
        Ok(record)
    }

    /// The reply's logprobs from one request of prompt + reply as ids: what follows
    /// `logprob_start_len` on `/generate`, or the echo's last tokens.
    fn by_ids(
        &self,
        tokenizer: &TextTokenizer,
        rendered: &Prompt,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        let encode = |text: &str| {
            (tokenizer.encode(text, rendered.add_special, true))
                .map_err(|e| PluginError::invalid_input(format!("option `tokenizer`: {e}")))
        };
        let mut head = encode(&rendered.text)?;
        let whole = encode(&format!("{}{reply}", rendered.text))?;
        if !whole.starts_with(&head) {
            return Err(split_token(reply, "the `tokenizer` option's tokenizer"));
        }
        let reply_ids = whole[head.len()..].to_vec();
        let reply_ids = reply_ids.as_slice();
        // An empty raw prompt starts from the model's BOS, as a local backend scores it.
        let whole =
            match (head.is_empty(), tokenizer.bos_id()) {
                (false, _) => whole,
                (true, Some(bos)) if rendered.add_special => {
                    head.push(bos);
                    [head.as_slice(), reply_ids].concat()
                }
                (true, _) => return Err(PluginError::invalid_input(
                    "the prompt is empty (0 tokens, and the model has no BOS token to start from)",
                )),
            };
        let record = match self.abilities.scoring {
            Scoring::SglangGenerate => {
                let body = json!({
                    "input_ids": whole,
                    "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
                    "return_logprob": true,
                    "logprob_start_len": head.len(),
                });
                let answer = self.client.post_root("/generate", &body)?;
                let url = format!("{}/generate", self.client.root_url());
                sglang_record(&answer, head.len() as u32, &url)?
            }
            _ => self.echo_ids(&whole, head.len())?,
        };
        if record.token_ids.as_slice() != reply_ids {
            return Err(PluginError::unavailable(format!(
                "the server at {} scored the reply's tokens as {:?}, not the {reply_ids:?}                  sent",
                self.client.root_url(),
                record.token_ids.as_slice()
            )));
        }
        Ok(record)
    }

    /// The logprobs of `ids[start..]` from vLLM's echo of `ids`.
    fn echo_ids(&self, ids: &[u32], start: usize) -> Result<ScoreRecord, PluginError> {
        let body = json!({
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": true,
            "logprobs": 1,
            "return_tokens_as_token_ids": true,
        });
        let answer = self.client.post("/completions", &body)?;
        let url = format!("{}/completions", self.client.base_url());
        let (echoed, logprobs, tokens) = self.echoed(&answer)?;
        if echoed != ids.len() {
            return Err(missing(
                &url,
                &format!("the {} prompt ids sent, echoed", ids.len()),
                &answer,
            ));
        }
        let mut record = ScoreRecord {
            token_ids: Default::default(),
            logprobs: Default::default(),
            prompt_tokens: start as u32,
            cached_prompt_tokens: usage(&answer, "/usage/prompt_tokens_details/cached_tokens"),
        };
        for (i, &id) in ids.iter().enumerate().skip(start) {
            let logprob = echoed_logprob(logprobs, i, &url, &answer)?;
            let named = token_id(tokens.get(i));
            record
                .token_ids
                .push(if named == UNKNOWN_TOKEN { id } else { named });
            record.logprobs.push(logprob);
        }
        Ok(record)
    }

    /// The reply's ids and logprobs from an echo of prompt + reply.
    fn echo(&self, rendered: &Prompt, reply: &str) -> Result<ScoreRecord, PluginError> {
        let (prompt, special) = (rendered.text.as_str(), self.add_special(rendered));
        let whole = format!("{prompt}{reply}");
        // The reply's length in tokens, and its ids where the server's tokenizer gives them.
        let (prompt_len, reply_ids) = match self.abilities.tokenizer {
            Some(tokenizer) => {
                let count = |text: &str| {
                    crate::tokens::tokenize(self.client, tokenizer, self.model, text, special)
                        .map(|r| r.token_ids.into_vec())
                };
                let (head, mut ids) = (count(prompt)?, count(&whole)?);
                if !ids.starts_with(&head) {
                    let server = format!("the server at {}", self.client.root_url());
                    return Err(split_token(reply, &server));
                }
                (head.len(), Some(ids.split_off(head.len())))
            }
            None => (self.echoed(&self.echo_request(prompt, special)?)?.0, None),
        };
        let answer = self.echo_request(&whole, special)?;
        let (echoed, logprobs, tokens) = self.echoed(&answer)?;
        let url = format!("{}/completions", self.client.base_url());
        // The reply is the last of the echoed prompt tokens: counting from the end holds where
        // a server leaves tokens out of its echo (llama-cpp-python skips every BOS id).
        let reply_len = match &reply_ids {
            Some(ids) => ids.len(),
            None => echoed.saturating_sub(prompt_len),
        };
        let first = echoed.checked_sub(reply_len).ok_or_else(|| {
            missing(
                &url,
                &format!("at least the reply's {reply_len} echoed tokens"),
                &answer,
            )
        })?;
        let mut record = ScoreRecord {
            token_ids: Default::default(),
            logprobs: Default::default(),
            prompt_tokens: prompt_len as u32,
            cached_prompt_tokens: usage(&answer, "/usage/prompt_tokens_details/cached_tokens"),
        };
        for (n, i) in (first..echoed).enumerate() {
            let logprob = echoed_logprob(logprobs, i, &url, &answer)?;
            let named = token_id(tokens.get(i));
            let id = match &reply_ids {
                Some(ids) if named != UNKNOWN_TOKEN && named != ids[n] => {
                    return Err(PluginError::unavailable(format!(
                        "{url} echoed token {named} where its tokenizer has {} for the reply's \
                         token {n}: {}",
                        ids[n],
                        short(&answer)
                    )))
                }
                Some(ids) => ids[n],
                None => named,
            };
            record.token_ids.push(id);
            record.logprobs.push(logprob);
        }
        Ok(record)
    }

    /// Whether the server adds its BOS to the prompt: a chat template writes its own, and vLLM
    /// can be told not to add a second (others always add what the model asks for).
    fn add_special(&self, prompt: &Prompt) -> bool {
        prompt.add_special || self.flavor != Flavor::Vllm
    }

    fn echo_request(&self, prompt: &str, add_special: bool) -> Result<Value, PluginError> {
        let mut body = json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": true,
            "logprobs": 1,
        });
        if self.flavor == Flavor::Vllm {
            body["return_tokens_as_token_ids"] = json!(true);
            body["add_special_tokens"] = json!(add_special);
        }
        self.client.post("/completions", &body)
    }

    /// How many prompt tokens an echo answer holds (its tokens less the generated ones), with
    /// its logprob and token arrays.
    fn echoed<'v>(
        &self,
        answer: &'v Value,
    ) -> Result<(usize, &'v [Value], &'v [Value]), PluginError> {
        let url = format!("{}/completions", self.client.base_url());
        let array = |key: &str| {
            answer
                .pointer(&format!("/choices/0/logprobs/{key}"))
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .ok_or_else(|| missing(&url, &format!("`choices[0].logprobs.{key}`"), answer))
        };
        let (logprobs, tokens) = (array("token_logprobs")?, array("tokens")?);
        if logprobs.len() != tokens.len() {
            return Err(missing(
                &url,
                "as many `token_logprobs` as `tokens`",
                answer,
            ));
        }
        let generated = usage(answer, "/usage/completion_tokens") as usize;
        let echoed = tokens
            .len()
            .checked_sub(generated)
            .ok_or_else(|| missing(&url, "at least `usage.completion_tokens` tokens", answer))?;
        Ok((echoed, logprobs, tokens))
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

/// The error for a prompt whose last token runs on into the reply.
fn split_token(reply: &str, tokenizer: &str) -> PluginError {
    PluginError::invalid_input(format!(
        "{tokenizer} tokenizes the prompt's end and the reply's start into one token (the \
         prompt's tokens are not a prefix of prompt + reply's), so the reply's tokens are not \
         its own; end the prompt at a token boundary. Reply: {reply:?}"
    ))
}

/// The logprob of echoed token `i`, which must be a number.
fn echoed_logprob(
    logprobs: &[Value],
    i: usize,
    url: &str,
    answer: &Value,
) -> Result<f32, PluginError> {
    let logprob = logprobs.get(i).and_then(Value::as_f64);
    let what = || format!("a number logprob for echoed token {i}");
    logprob
        .map(|l| l as f32)
        .ok_or_else(|| missing(url, &what(), answer))
}

fn usage(answer: &Value, pointer: &str) -> u32 {
    answer.pointer(pointer).and_then(Value::as_u64).unwrap_or(0) as u32
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
