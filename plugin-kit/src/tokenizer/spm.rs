//! SentencePiece BPE vocabularies (`tokenizer.ggml.model` = `llama`: Llama 2, Mistral, Phi-3)
//! rebuilt as a `tokenizers` BPE.
//!
//! llama.cpp's SPM tokenizer (`llm_tokenizer_spm_session` in
//! <https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp>) has no merge list:
//! it starts from characters and repeatedly joins the adjacent pair whose concatenation is the
//! token of highest score (the leftmost among equals), then spells characters outside the
//! vocabulary as `<0xXX>` byte tokens. The same result comes from a BPE whose merges are every
//! split of every token into two tokens, ranked by the joined token's score, with byte fallback.
//! Spaces become `▁`, and a `▁` is prepended to each text run when `add_space_prefix` is set.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::{Prepend, Sequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper, Tokenizer};

use super::bpe::{build_error, escape_spaces, unescape_spaces};
use super::vocab::{Vocab, SCORES};
use super::TokenizerError;

/// The tokenizer for a `llama` vocabulary; `add_space_prefix` as llama.cpp reads it.
pub(super) fn build(
    vocab: &Vocab,
    unk: Option<&str>,
    add_space_prefix: bool,
) -> Result<Tokenizer, TokenizerError> {
    let scores = vocab
        .scores
        .as_ref()
        .ok_or_else(|| TokenizerError::Missing {
            key: SCORES.to_string(),
            expected: "an array of numbers (SentencePiece scores)",
        })?;
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab.ids.clone(), merges(vocab, scores))
        .byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk.to_string());
    }
    let model = builder
        .build()
        .map_err(|e| build_error("the SentencePiece model", e))?;
    let mut tokenizer = Tokenizer::new(model);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new("▁".into()).into());
    }
    normalizers.push(escape_spaces()?.into());
    tokenizer
        .with_normalizer(Some(Sequence::new(normalizers)))
        .map_err(|e| build_error("the normalizer", e))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        unescape_spaces()?,
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Every way of writing a token as two tokens, best joined score first.
fn merges(vocab: &Vocab, scores: &[f32]) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, &str, &str)> = Vec::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        // Only the token this text looks up to can be the product of a merge.
        if vocab.id(token) != Some(id as u32) {
            continue;
        }
        for (at, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(at);
            if vocab.id(left).is_some() && vocab.id(right).is_some() {
                ranked.push((scores[id], id as u32, left, right));
            }
        }
    }
    // Higher score first; ties by id keep the order stable.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked
        .into_iter()
        .map(|(_, _, left, right)| (left.to_string(), right.to_string()))
        .collect()
}

/// `tokenizer` without the `▁` it prepends to a text: how a text that continues another reads
/// (llama.cpp adds the prefix only at the start of a text and after special tokens).
pub(super) fn without_space_prefix(tokenizer: &Tokenizer) -> Result<Tokenizer, TokenizerError> {
    let mut continuation = tokenizer.clone();
    let normalizers: Vec<NormalizerWrapper> = vec![escape_spaces()?.into()];
    continuation
        .with_normalizer(Some(Sequence::new(normalizers)))
        .map_err(|e| build_error("the normalizer", e))?;
    Ok(continuation)
}
