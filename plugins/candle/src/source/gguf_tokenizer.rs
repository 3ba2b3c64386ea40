//! A `tokenizers` tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! GGUF files carry no tokenizer.json: the vocabulary, merges and token types are metadata
//! arrays. For GPT-2-style byte-level BPE (`tokenizer.ggml.model = "gpt2"`, as SmolLM2 uses) this
//! rebuilds the same pipeline Hugging Face's tokenizer.json describes: digits split one by one,
//! the byte-level regex split, BPE, and a byte-level decoder; control tokens (type 3) are added
//! as special tokens so chat markers like `<|im_start|>` encode to one id.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

/// GGUF token type of control tokens.
const CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens.
const USER_DEFINED: i32 = 4;

fn strings(meta: &HashMap<String, Value>, key: &str) -> Result<Vec<String>, String> {
    let values = meta
        .get(key)
        .ok_or_else(|| format!("metadata `{key}` is missing"))?
        .to_vec()
        .map_err(|e| format!("metadata `{key}`: {e}"))?;
    values
        .iter()
        .map(|v| {
            v.to_string()
                .cloned()
                .map_err(|e| format!("metadata `{key}`: {e}"))
        })
        .collect()
}

fn token_types(meta: &HashMap<String, Value>, n: usize) -> Vec<i32> {
    let types = meta
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.to_vec().ok())
        .map(|v| {
            v.iter()
                .map(|t| t.to_i32().unwrap_or(1))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if types.len() == n {
        types
    } else {
        vec![1; n]
    }
}

/// Builds the tokenizer; the error says which metadata key is missing or unsupported.
pub fn build(meta: &HashMap<String, Value>) -> Result<Tokenizer, String> {
    let model = meta
        .get("tokenizer.ggml.model")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .unwrap_or_default();
    if model != "gpt2" {
        return Err(format!(
            "tokenizer.ggml.model {model:?} is not supported (only \"gpt2\" byte-level BPE)"
        ));
    }
    let tokens = strings(meta, "tokenizer.ggml.tokens")?;
    let merges = strings(meta, "tokenizer.ggml.merges")?
        .into_iter()
        .filter_map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
        })
        .collect::<Vec<_>>();
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| format!("building the BPE model from GGUF metadata: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre: Vec<PreTokenizerWrapper> = vec![
        Digits::new(true).into(),
        ByteLevel::new(false, true, true).into(),
    ];
    tokenizer.with_pre_tokenizer(Some(Sequence::new(pre)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let types = token_types(meta, tokens.len());
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, &t)| t == CONTROL || t == USER_DEFINED)
        .map(|(tok, &t)| AddedToken::from(tok.clone(), t == CONTROL))
        .collect();
    tokenizer
        .add_special_tokens(special)
        .map_err(|e| format!("adding special tokens: {e}"))?;
    Ok(tokenizer)
}

/// The id stored under a `tokenizer.ggml.*_token_id` key.
pub fn token_id(meta: &HashMap<String, Value>, key: &str) -> Option<u32> {
    meta.get(key).and_then(|v| v.to_u32().ok())
}
