//! BPE vocabularies with merges (`tokenizer.ggml.model` = `gpt2` or `gemma4`) rebuilt as a
//! `tokenizers` pipeline.
//!
//! llama.cpp (`llm_tokenizer_bpe_session` in
//! <https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp>) splits text with the
//! pre-tokenizer's regexes in sequence, keeping matches and gaps alike, maps each word to GPT-2's
//! byte alphabet, and merges the pair of lowest rank first (the leftmost among equals). In
//! `tokenizers` that is a `Sequence` of isolated `Split`s, `ByteLevel` without its own regex, and
//! `BPE`, whose heap orders merges the same way. Gemma 4 instead escapes spaces as `▁`, splits
//! only at newlines and falls back to `<0xXX>` byte tokens.

use std::collections::HashSet;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use super::pre::Pre;
use super::vocab::{self, Vocab, MERGES};
use super::TokenizerError;
use crate::gguf::Metadata;

/// The BPE model, pre-tokenizer, normalizer and decoder for `pre`.
pub(super) fn build(meta: &Metadata, vocab: &Vocab, pre: Pre) -> Result<Tokenizer, TokenizerError> {
    let model = BPE::builder()
        .vocab_and_merges(vocab.ids.clone(), merges(meta)?)
        .ignore_merges(pre.ignore_merges)
        .byte_fallback(!pre.byte_encode)
        .build()
        .map_err(|e| {
            // Only a refused list is worth walking again to name the bad entry.
            let bad = merges(meta).ok().and_then(|m| unknown_merge(&m, vocab));
            bad.unwrap_or_else(|| build_error("the BPE model", e))
        })?;
    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    if pre.escape_whitespace {
        tokenizer
            .with_normalizer(Some(escape_spaces()?))
            .map_err(|e| build_error("the normalizer", e))?;
        tokenizer.with_decoder(Some(DecoderSequence::new(vec![
            unescape_spaces()?,
            ByteFallback::new().into(),
            Fuse::new().into(),
        ])));
    } else {
        tokenizer.with_decoder(Some(ByteLevel::default()));
    }
    Ok(tokenizer)
}

/// `tokenizer.ggml.merges`, each "left right" split as llama.cpp splits it, keeping the first
/// rank of a repeated pair.
fn merges(meta: &Metadata) -> Result<Vec<(String, String)>, TokenizerError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (index, merge) in vocab::strings(meta, MERGES)?.into_iter().enumerate() {
        let (left, right) = split_merge(merge).ok_or_else(|| TokenizerError::BadMerge {
            index,
            merge: merge.to_string(),
            reason: "it has no space between two tokens".into(),
        })?;
        if seen.insert(merge) {
            out.push((left.to_string(), right.to_string()));
        }
    }
    Ok(out)
}

/// The first merge naming a text that is not a token, once `tokenizers` refused the list.
fn unknown_merge(merges: &[(String, String)], vocab: &Vocab) -> Option<TokenizerError> {
    merges
        .iter()
        .enumerate()
        .find_map(|(index, (left, right))| {
            let joined = format!("{left}{right}");
            let unknown = [left.as_str(), right, &joined]
                .into_iter()
                .find(|t| vocab.id(t).is_none())?;
            Some(TokenizerError::BadMerge {
                index,
                merge: format!("{left} {right}"),
                reason: format!("{unknown:?} is not in {}", vocab::TOKENS),
            })
        })
}

/// "left right", split at the first space after the first byte, as llama.cpp splits it.
fn split_merge(merge: &str) -> Option<(&str, &str)> {
    let at = merge.bytes().skip(1).position(|b| b == b' ')? + 1;
    Some((&merge[..at], &merge[at + 1..]))
}

fn pre_tokenizer(pre: Pre) -> Result<PreTokenizerWrapper, TokenizerError> {
    let mut steps = pre
        .regexes
        .iter()
        .map(|regex| {
            Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(PreTokenizerWrapper::from)
            .map_err(|e| build_error("a pre-tokenizer regex", e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if pre.byte_encode {
        steps.push(ByteLevel::new(false, true, false).into());
    }
    Ok(Sequence::new(steps).into())
}

/// Spaces as `▁`, the SentencePiece way.
pub(super) fn escape_spaces() -> Result<Replace, TokenizerError> {
    Replace::new(" ", "▁").map_err(|e| build_error("the space escape", e))
}

pub(super) fn unescape_spaces() -> Result<DecoderWrapper, TokenizerError> {
    Replace::new("▁", " ")
        .map(DecoderWrapper::from)
        .map_err(|e| build_error("the space unescape", e))
}

pub(super) fn build_error(what: &'static str, e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build {
        what,
        reason: e.to_string(),
    }
}
