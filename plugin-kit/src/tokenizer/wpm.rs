//! WordPiece vocabularies (`tokenizer.ggml.model` = `bert`) rebuilt as a `tokenizers` WordPiece.
//!
//! llama.cpp's GGUF keeps BERT's vocabulary in "phantom space" form: a word-initial piece is
//! written `▁piece` and a continuation piece is written bare, without `##`. Its WPM tokenizer
//! (`llm_tokenizer_wpm_session` in
//! <https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp>) lowercases and strips
//! accents, splits at whitespace, punctuation and CJK characters, and matches the longest piece
//! greedily, the whole word becoming `[UNK]` when a position has no match. That is BERT's own
//! normalizer, pre-tokenizer and WordPiece once the vocabulary is written back in `##` form.

use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::bpe::Vocab as TextIds;
use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::Tokenizer;

use super::bpe::build_error;
use super::vocab::Vocab;
use super::TokenizerError;

const PHANTOM_SPACE: char = '▁';
const CONTINUATION: &str = "##";

/// How BERT's normalizer is configured (`tokenizer.ggml.normalizer.*`, both default true).
#[derive(Debug, Clone, Copy)]
pub(super) struct Normalization {
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// The tokenizer for a `bert` vocabulary; `unk` is the text of the unknown token.
pub(super) fn build(
    vocab: &Vocab,
    unk: &str,
    norm: Normalization,
) -> Result<Tokenizer, TokenizerError> {
    let model = WordPiece::builder()
        .vocab(hf_vocab(vocab))
        .unk_token(unk.to_string())
        .continuing_subword_prefix(CONTINUATION.into())
        .max_input_chars_per_word(usize::MAX)
        .build()
        .map_err(|e| build_error("the WordPiece model", e))?;
    let mut tokenizer = Tokenizer::new(model);
    let normalizer = BertNormalizer::new(true, true, Some(norm.strip_accents), norm.lowercase);
    tokenizer
        .with_normalizer(Some(normalizer))
        .map_err(|e| build_error("the normalizer", e))?;
    tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
    tokenizer.with_decoder(Some(WordPieceDecoder::new(CONTINUATION.into(), true)));
    Ok(tokenizer)
}

/// The vocabulary in `##` form: `▁word` becomes `word`, a bare piece `##piece`, and special
/// tokens keep their text.
fn hf_vocab(vocab: &Vocab) -> TextIds {
    vocab
        .tokens
        .iter()
        .zip(&vocab.attrs)
        .enumerate()
        .map(|(id, (token, attr))| {
            let text = match token.strip_prefix(PHANTOM_SPACE) {
                _ if attr.is_added() => token.clone(),
                Some(word) => word.to_string(),
                None => format!("{CONTINUATION}{token}"),
            };
            (text, id as u32)
        })
        .collect()
}
