//! Which server is on the other end. The OpenAI API is common ground, but the extras differ:
//! `top_k` and token ids (vLLM, SGLang), prompt logprobs (vLLM's `echo`, SGLang's `/generate`,
//! `lmhost serve`'s `/generate`), a published chat template (llama.cpp, `lmhost serve`).

use std::fmt;

use lmhost_plugin_api::serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Vllm,
    Sglang,
    LlamaCpp,
    Lmhost,
}

/// The option's choices; `auto` asks the server.
pub const CHOICES: [&str; 6] = ["auto", "openai", "vllm", "sglang", "llamacpp", "lmhost"];

impl Flavor {
    pub fn parse(name: &str) -> Option<Flavor> {
        Some(match name {
            "openai" => Flavor::OpenAi,
            "vllm" => Flavor::Vllm,
            "sglang" => Flavor::Sglang,
            "llamacpp" => Flavor::LlamaCpp,
            "lmhost" => Flavor::Lmhost,
            _ => return None,
        })
    }

    /// From a `/v1/models` answer: each server fills `owned_by` with its own name.
    pub fn from_models(models: &Value) -> Option<Flavor> {
        let owner = models.pointer("/data/0/owned_by")?.as_str()?;
        Some(match owner {
            "vllm" => Flavor::Vllm,
            "sglang" => Flavor::Sglang,
            "llamacpp" | "llama.cpp" => Flavor::LlamaCpp,
            "lmhost" => Flavor::Lmhost,
            _ => Flavor::OpenAi,
        })
    }

    /// Takes `top_k` as an extra sampling parameter.
    pub fn takes_top_k(self) -> bool {
        self != Flavor::OpenAi
    }

    /// Scores a prompt given as token ids: vLLM's `/v1/completions`, SGLang's and
    /// `lmhost serve`'s `/generate`.
    pub fn takes_token_ids(self) -> bool {
        matches!(self, Flavor::Vllm | Flavor::Sglang | Flavor::Lmhost)
    }

    /// Answers `return_tokens_as_token_ids` (vLLM's extension).
    pub fn returns_token_ids_on_request(self) -> bool {
        self == Flavor::Vllm
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavor::OpenAi => "openai",
            Flavor::Vllm => "vllm",
            Flavor::Sglang => "sglang",
            Flavor::LlamaCpp => "llamacpp",
            Flavor::Lmhost => "lmhost",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::serde_json::json;

    #[test]
    fn detects_servers_by_owner() {
        let models = |owner: &str| json!({"data": [{"id": "m", "owned_by": owner}]});
        assert_eq!(Flavor::from_models(&models("vllm")), Some(Flavor::Vllm));
        assert_eq!(Flavor::from_models(&models("sglang")), Some(Flavor::Sglang));
        assert_eq!(
            Flavor::from_models(&models("llamacpp")),
            Some(Flavor::LlamaCpp)
        );
        assert_eq!(Flavor::from_models(&models("lmhost")), Some(Flavor::Lmhost));
        assert_eq!(Flavor::from_models(&models("system")), Some(Flavor::OpenAi));
        assert_eq!(Flavor::from_models(&json!({"data": []})), None);
        for name in &CHOICES[1..] {
            assert_eq!(
                Flavor::parse(name).map(|f| f.to_string()).as_deref(),
                Some(*name)
            );
        }
    }
}
