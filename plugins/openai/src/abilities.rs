//! What the server can do, found by asking it (`flavor = "auto"`) or known from the flavor a
//! config names: how it counts tokens and how it returns a prompt's logprobs. A server that can
//! score is used for scoring whatever its `owned_by` says.

use std::fmt;

use lmhost_plugin_api::serde_json::{json, Value};

use crate::client::Client;
use crate::flavor::Flavor;
use crate::tokens::Tokenizer;

/// How a server returns a prompt's logprobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// `/v1/completions` with `echo` and `logprobs` (vLLM, llama-cpp-python).
    Echo,
    /// The native `/generate` with `return_logprob` and `logprob_start_len` (SGLang,
    /// `lmhost serve`).
    SglangGenerate,
    /// None: OpenAI, llama.cpp's server.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abilities {
    pub tokenizer: Option<Tokenizer>,
    pub scoring: Scoring,
}

impl Abilities {
    /// What a named flavor is known to offer, without asking.
    pub fn of(flavor: Flavor) -> Abilities {
        let (tokenizer, scoring) = match flavor {
            Flavor::Vllm => (Some(Tokenizer::Vllm), Scoring::Echo),
            Flavor::Sglang | Flavor::Lmhost => (Some(Tokenizer::Vllm), Scoring::SglangGenerate),
            Flavor::LlamaCpp => (Some(Tokenizer::LlamaCpp), Scoring::None),
            Flavor::OpenAi => (None, Scoring::None),
        };
        Abilities { tokenizer, scoring }
    }

    /// Asks the server: each tokenizer shape in turn, then an echo request on a short prompt.
    /// `hint` (from `owned_by`) only chooses the native `/generate` route of SGLang (which
    /// answers no echo) and `lmhost serve` (whose prefix cache serves it, not an echo).
    pub fn probe(client: &Client, model: &str, hint: Flavor) -> Abilities {
        let tokenizer = [
            Tokenizer::Vllm,
            Tokenizer::LlamaCpp,
            Tokenizer::LlamaCppPython,
        ]
        .into_iter()
        .find(|&t| {
            crate::tokens::tokenize(client, t, model, "Hello", true)
                .is_ok_and(|r| !r.token_ids.is_empty())
        });
        let scoring = if matches!(hint, Flavor::Sglang | Flavor::Lmhost) {
            Scoring::SglangGenerate
        } else if echoes(client, model) {
            Scoring::Echo
        } else {
            Scoring::None
        };
        Abilities { tokenizer, scoring }
    }
}

/// Whether `/v1/completions` echoes a prompt with a logprob per token.
fn echoes(client: &Client, model: &str) -> bool {
    let body = json!({"model": model, "prompt": "Hello there", "max_tokens": 1,
                      "temperature": 0.0, "echo": true, "logprobs": 1});
    client.post("/completions", &body).is_ok_and(|answer| {
        answer
            .pointer("/choices/0/logprobs/token_logprobs")
            .and_then(Value::as_array)
            .is_some_and(|l| l.iter().skip(1).any(Value::is_number))
    })
}

impl fmt::Display for Abilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tokenizer = match self.tokenizer {
            Some(Tokenizer::Vllm) => "/tokenize (vLLM's shape)",
            Some(Tokenizer::LlamaCpp) => "/tokenize (llama.cpp's shape)",
            Some(Tokenizer::LlamaCppPython) => "/extras/tokenize (llama-cpp-python)",
            None => "none",
        };
        let scoring = match self.scoring {
            Scoring::Echo => "/v1/completions echo",
            Scoring::SglangGenerate => "/generate (SGLang's shape)",
            Scoring::None => "unavailable",
        };
        write!(f, "tokenizer {tokenizer}, scoring {scoring}")
    }
}
