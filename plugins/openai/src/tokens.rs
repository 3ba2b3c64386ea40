//! The server's own tokenizer: `/tokenize` and `/detokenize` in the shape each server takes
//! (see [`Tokenizer`]).

use lmhost_plugin_api::serde_json::{json, Value};
use lmhost_plugin_api::{PluginError, TokenizeRecord};

use crate::chat::short;
use crate::client::Client;

/// A server's tokenizer endpoint, by the shape it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// `POST /tokenize {model, prompt, add_special_tokens}` (vLLM, SGLang, `lmhost serve`).
    Vllm,
    /// `POST /tokenize {content, add_special, with_pieces}` (llama.cpp's server).
    LlamaCpp,
    /// `POST /extras/tokenize {model, input}` (llama-cpp-python's server).
    LlamaCppPython,
}

/// `text`'s ids as the server tokenizes a completions prompt (`add_special`: with its BOS).
pub fn tokenize(
    client: &Client,
    tokenizer: Tokenizer,
    model: &str,
    text: &str,
    add_special: bool,
) -> Result<TokenizeRecord, PluginError> {
    let (path, body) = match tokenizer {
        Tokenizer::Vllm => (
            "/tokenize",
            json!({"model": model, "prompt": text, "add_special_tokens": add_special,
                   "return_token_strs": true}),
        ),
        Tokenizer::LlamaCpp => (
            "/tokenize",
            json!({"content": text, "add_special": add_special, "with_pieces": true}),
        ),
        // It always tokenizes as its completions do (with BOS where the model adds one).
        Tokenizer::LlamaCppPython => ("/extras/tokenize", json!({"model": model, "input": text})),
    };
    let answer = client.post_root(path, &body)?;
    read_tokens(&answer, &format!("{}{path}", client.root_url()))
}

pub fn detokenize(
    client: &Client,
    tokenizer: Tokenizer,
    model: &str,
    ids: &[u32],
) -> Result<String, PluginError> {
    let path = match tokenizer {
        Tokenizer::LlamaCppPython => "/extras/detokenize",
        Tokenizer::Vllm | Tokenizer::LlamaCpp => "/detokenize",
    };
    let answer = client.post_root(path, &json!({"model": model, "tokens": ids}))?;
    ["prompt", "content", "text"]
        .iter()
        .find_map(|key| answer.get(key).and_then(Value::as_str))
        .map(str::to_string)
        .ok_or_else(|| {
            PluginError::unavailable(format!(
                "{}{path} answered without `prompt` or `content`: {}",
                client.root_url(),
                short(&answer)
            ))
        })
}

/// `tokens` as ids (with `token_strs` beside them) or as `{id, piece}` objects.
fn read_tokens(answer: &Value, url: &str) -> Result<TokenizeRecord, PluginError> {
    let bad = || {
        PluginError::unavailable(format!(
            "{url} answered without `tokens` as ids or {{id, piece}} objects: {}",
            short(answer)
        ))
    };
    let tokens = answer
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(bad)?;
    let strs = answer.get("token_strs").and_then(Value::as_array);
    let mut record = TokenizeRecord::text(Vec::new(), Vec::new());
    for (i, token) in tokens.iter().enumerate() {
        let (id, piece) = match token {
            Value::Number(n) => (n.as_u64(), strs.and_then(|s| s.get(i))),
            object => (
                object.get("id").and_then(Value::as_u64),
                object.get("piece"),
            ),
        };
        let id = id.and_then(|id| u32::try_from(id).ok()).ok_or_else(bad)?;
        record.token_ids.push(id);
        record
            .pieces
            .push(piece.and_then(Value::as_str).unwrap_or_default().into());
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_servers_shapes() {
        let vllm = json!({"count": 2, "tokens": [5, 6], "token_strs": ["a", "b"]});
        let record = read_tokens(&vllm, "u").unwrap();
        assert_eq!(record.token_ids.as_slice(), &[5, 6]);
        assert_eq!(record.pieces[1].as_str(), "b");
        let llama = json!({"tokens": [{"id": 7, "piece": "x"}]});
        let record = read_tokens(&llama, "u").unwrap();
        assert_eq!(record.token_ids.as_slice(), &[7]);
        assert_eq!(record.pieces[0].as_str(), "x");
        let err = read_tokens(&json!({"tokens": ["x"]}), "u").unwrap_err();
        assert!(err.message.contains("`tokens`"), "{err}");
    }
}
