//! Text tokenizers for every text backend: built from a GGUF file's `tokenizer.ggml.*` metadata
//! so that they give the ids llama.cpp gives, or wrapped around a Hugging Face tokenizer.json.
//!
//! GGUF files carry no tokenizer.json: the vocabulary, token types, scores and merges are
//! metadata arrays, and llama.cpp's `llama-vocab.cpp`
//! (<https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp>) decides how they
//! are used. Each vocabulary type is rebuilt here as a `tokenizers` pipeline: byte-level BPE
//! ([`bpe`], with llama.cpp's pre-tokenizer table in [`pre`]), SentencePiece BPE ([`spm`]) and
//! WordPiece ([`wpm`]). Control and user-defined tokens become added tokens, so chat markers
//! encode to one id; a model or pre-tokenizer this crate does not know is refused, never guessed.

mod bpe;
mod pre;
mod spm;
mod vocab;
mod wpm;

pub use vocab::TOKENS;

use std::ops::Range;
use std::sync::OnceLock;

use tokenizers::models::bpe::Vocab as TextIds;
use tokenizers::{AddedToken, Tokenizer};

use crate::gguf::Metadata;
use vocab::{Attr, Defaults, Specials, Vocab};

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";
const STRIP_ACCENTS: &str = "tokenizer.ggml.normalizer.strip_accents";

/// The `tokenizer.ggml.model` values this crate rebuilds.
const MODELS: &[&str] = &["gpt2", "gemma4", "llama", "bert"];

/// Why a tokenizer could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("metadata `{key}` is missing, expected {expected}")]
    Missing { key: String, expected: &'static str },
    #[error("metadata `{key}` is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("metadata `{key}` has {len} entries, expected one per token ({tokens})")]
    Length {
        key: String,
        len: usize,
        tokens: usize,
    },
    #[error("metadata `tokenizer.ggml.merges` entry {index} ({merge:?}): {reason}")]
    BadMerge {
        index: usize,
        merge: String,
        reason: String,
    },
    #[error("metadata `{MODEL}` is {found:?}, which is not supported; supported: {}", MODELS.join(", "))]
    UnknownModel { found: String },
    #[error("metadata `{PRE}` is {found:?}, which is not supported; supported: {}", pre::names().join(", "))]
    UnknownPre { found: String },
    #[error("building {what}: {reason}")]
    Build { what: &'static str, reason: String },
    #[error("token id {id} is outside the vocabulary ({size} tokens)")]
    IdOutOfRange { id: u32, size: usize },
    #[error("tokenizing: {0}")]
    Encode(String),
    #[error("detokenizing: {0}")]
    Decode(String),
}

/// What `encode(add_special = true)` puts around the text.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// The tokenizer's own post-processor decides (tokenizer.json).
    PostProcessor,
    /// llama.cpp's rule: these ids, when the vocabulary asks for them.
    Around {
        prefix: Option<u32>,
        suffix: Option<u32>,
    },
}

/// A text tokenizer: a `tokenizers::Tokenizer` plus llama.cpp's special-token rules.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// `inner` with special tokens read as plain text (built on first use).
    plain: OnceLock<Tokenizer>,
    /// `inner` without SentencePiece's space prefix, where it has one: for continuations.
    continuation: Option<Tokenizer>,
    kind: String,
    tokens: Vec<String>,
    /// Ids below this decode. Computed once: `Tokenizer::get_vocab_size` looks every added
    /// token up in the model's vocabulary, too slow to repeat per streamed token.
    decodable: usize,
    ids: TextIds,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    framing: Framing,
}

impl TextTokenizer {
    /// The tokenizer llama.cpp would build from this GGUF metadata.
    pub fn from_gguf(meta: &Metadata) -> Result<Self, TokenizerError> {
        let model = meta.str(MODEL).ok_or_else(|| TokenizerError::Missing {
            key: MODEL.into(),
            expected: "a string such as \"gpt2\" or \"llama\"",
        })?;
        let mut vocab = Vocab::read(meta)?;
        match model {
            "gpt2" => Self::bpe(meta, vocab, bpe_pre(meta)?),
            "gemma4" => {
                let pre = pre::lookup("gemma4").map(|p| (p, p.name.to_string()));
                Self::bpe(meta, vocab, pre.ok_or_else(|| unknown_pre("gemma4"))?)
            }
            "llama" => {
                let defaults = Defaults {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    sep: None,
                };
                let specials = vocab::specials(meta, &mut vocab, defaults);
                let unk = specials.unk.map(|id| vocab.tokens[id as usize].clone());
                let space = meta.bool(ADD_SPACE_PREFIX).unwrap_or(true);
                let inner = spm::build(&vocab, unk.as_deref(), space)?;
                let framing = llama_framing(meta, &specials, true, false);
                let mut tokenizer =
                    Self::assemble(inner, "llama".into(), vocab, specials, framing)?;
                if space {
                    tokenizer.continuation = Some(spm::without_space_prefix(&tokenizer.inner)?);
                }
                Ok(tokenizer)
            }
            "bert" => {
                let defaults = Defaults {
                    bos: Some(101),
                    eos: None,
                    unk: Some(100),
                    sep: Some(102),
                };
                let specials = vocab::specials(meta, &mut vocab, defaults);
                let unk = specials.unk.ok_or_else(|| TokenizerError::Missing {
                    key: "tokenizer.ggml.unknown_token_id".into(),
                    expected: "the id of WordPiece's unknown token",
                })?;
                let lowercase = meta.bool(LOWERCASE).unwrap_or(true);
                let norm = wpm::Normalization {
                    lowercase,
                    strip_accents: meta.bool(STRIP_ACCENTS).unwrap_or(lowercase),
                };
                let inner = wpm::build(&vocab, &vocab.tokens[unk as usize], norm)?;
                let framing = Framing::Around {
                    prefix: specials.bos,
                    suffix: specials.sep,
                };
                Self::assemble(inner, "bert".into(), vocab, specials, framing)
            }
            other => Err(TokenizerError::UnknownModel {
                found: other.to_string(),
            }),
        }
    }

    /// A Hugging Face tokenizer.json tokenizer (safetensors checkpoints); add_bos/add_eos come
    /// from its own post-processor there. End of generation is `eos` plus the special tokens
    /// whose text llama.cpp treats as an end of generation.
    pub fn from_hf(tokenizer: Tokenizer, bos: Option<u32>, eos: Option<u32>) -> Self {
        let vocab = tokenizer.get_vocab(true);
        let size = vocab.values().max().map_or(0, |&max| max as usize + 1);
        let mut tokens = vec![String::new(); size];
        for (text, &id) in &vocab {
            tokens[id as usize] = text.clone();
        }
        let specials = tokenizer.get_added_tokens_decoder();
        let mut eog: Vec<u32> = specials
            .iter()
            .filter(|(_, t)| t.special && vocab::is_eog_text(&t.content))
            .map(|(&id, _)| id)
            .chain(eos)
            .collect();
        eog.sort_unstable();
        eog.dedup();
        TextTokenizer {
            decodable: tokenizer.get_vocab_size(true).max(tokens.len()),
            inner: tokenizer,
            plain: OnceLock::new(),
            continuation: None,
            kind: "tokenizer.json".into(),
            tokens,
            ids: vocab.into_iter().collect(),
            bos,
            eos,
            eog,
            framing: Framing::PostProcessor,
        }
    }

    fn bpe(
        meta: &Metadata,
        mut vocab: Vocab,
        (pre, kind): (pre::Pre, String),
    ) -> Result<Self, TokenizerError> {
        let defaults = Defaults {
            bos: Some(11),
            eos: Some(11),
            unk: None,
            sep: None,
        };
        let specials = vocab::specials(meta, &mut vocab, defaults);
        let inner = bpe::build(meta, &vocab, pre)?;
        let mut framing = llama_framing(meta, &specials, pre.add_bos, false);
        // llama.cpp always adds BOS for Gemma 4.
        if let (true, Framing::Around { prefix, .. }) = (pre.name == "gemma4", &mut framing) {
            *prefix = specials.bos;
        }
        Self::assemble(inner, kind, vocab, specials, framing)
    }

    fn assemble(
        mut inner: Tokenizer,
        kind: String,
        vocab: Vocab,
        specials: Specials,
        framing: Framing,
    ) -> Result<Self, TokenizerError> {
        let added = |special: bool| {
            vocab
                .tokens
                .iter()
                .zip(&vocab.attrs)
                .filter(move |(_, a)| a.is_added() && a.is_special() == special)
                .map(|(t, a)| added_token(t, *a))
                .collect::<Vec<_>>()
        };
        inner
            .add_special_tokens(added(true))
            .map_err(|e| bpe::build_error("the special tokens", e))?;
        inner
            .add_tokens(added(false))
            .map_err(|e| bpe::build_error("the user-defined tokens", e))?;
        Ok(TextTokenizer {
            decodable: inner.get_vocab_size(true).max(vocab.tokens.len()),
            inner,
            plain: OnceLock::new(),
            continuation: None,
            kind,
            tokens: vocab.tokens,
            ids: vocab.ids,
            bos: specials.bos,
            eos: specials.eos,
            eog: specials.eog,
            framing,
        })
    }

    /// The tokens of `text` as it reads after other text (a reply, a continuation): no BOS or
    /// EOS, no SentencePiece space prefix, special-token text parsed. So a continuation has the
    /// same tokens after every prompt, and the ones it has in the whole text wherever the
    /// boundary between the two is a token boundary.
    pub fn encode_continuation(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match &self.continuation {
            Some(tokenizer) => tokenizer
                .encode(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
            None => self.encode(text, false, true),
        }
    }

    /// `add_special`: add BOS/EOS as the model's metadata asks (add_bos_token /
    /// add_eos_token), as llama.cpp's `llama_tokenize(add_special)`.
    /// `parse_special`: text like "<|im_start|>" becomes that control token's id; when false it
    /// is tokenized as plain text (llama.cpp's parse_special=false). User-defined tokens are
    /// matched either way, as in llama.cpp.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let tokenizer = match parse_special {
            true => &self.inner,
            false => self.plain.get_or_init(|| {
                let mut plain = self.inner.clone();
                plain.set_encode_special_tokens(true);
                plain
            }),
        };
        let own_framing = matches!(self.framing, Framing::PostProcessor) && add_special;
        let encoding = tokenizer
            .encode(text, own_framing)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = encoding.get_ids().to_vec();
        if let (true, Framing::Around { prefix, suffix }) = (add_special, self.framing) {
            ids.splice(0..0, prefix);
            ids.extend(suffix);
        }
        Ok(ids)
    }

    /// [`TextTokenizer::encode`] (special-token text parsed) with each id's byte range in
    /// `text`; ids the framing adds (BOS) have an empty range at the start or end.
    pub fn encode_with_offsets(
        &self,
        text: &str,
        add_special: bool,
    ) -> Result<(Vec<u32>, Vec<Range<usize>>), TokenizerError> {
        let own_framing = matches!(self.framing, Framing::PostProcessor) && add_special;
        let encoding = self
            .inner
            .encode(text, own_framing)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = encoding.get_ids().to_vec();
        let mut offsets: Vec<Range<usize>> =
            encoding.get_offsets().iter().map(|&(a, b)| a..b).collect();
        if let (true, Framing::Around { prefix, suffix }) = (add_special, self.framing) {
            ids.splice(0..0, prefix.iter().copied());
            offsets.splice(0..0, prefix.iter().map(|_| 0..0));
            ids.extend(suffix);
            offsets.extend(suffix.iter().map(|_| text.len()..text.len()));
        }
        Ok((ids, offsets))
    }

    /// Text of `ids`; `skip_special` drops control tokens (as llama.cpp detokenize with
    /// remove_special/unparse_special=false).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let size = self.decodable;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= size) {
            return Err(TokenizerError::IdOutOfRange { id, size });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The vocabulary text of `id` (for GGUF, as the file spells it).
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id whose vocabulary text is `token`.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-generation ids: eos, eot, eom, and for GGUF the tokens llama.cpp's EOG list names
    /// (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, FIM pad/repo/separator, ...), sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The vocabulary type, e.g. "gpt2/llama-bpe", "llama", "bert", "tokenizer.json".
    pub fn kind(&self) -> &str {
        &self.kind
    }

    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}

/// The pre-tokenizer of a `gpt2` vocabulary and the `kind()` that names it. A missing key means
/// `default`, as in llama.cpp (which warns that quality degrades).
fn bpe_pre(meta: &Metadata) -> Result<(pre::Pre, String), TokenizerError> {
    match meta.str(PRE) {
        None => {
            let pre = pre::lookup("default").ok_or_else(|| unknown_pre("default"))?;
            Ok((pre, format!("gpt2/default (no {PRE}: degraded)")))
        }
        Some(name) => {
            let pre = pre::lookup(name).ok_or_else(|| unknown_pre(name))?;
            Ok((pre, format!("gpt2/{name}")))
        }
    }
}

fn unknown_pre(name: &str) -> TokenizerError {
    TokenizerError::UnknownPre {
        found: name.to_string(),
    }
}

/// BOS/EOS as llama.cpp adds them: the model type's defaults, then the metadata flags.
fn llama_framing(meta: &Metadata, specials: &Specials, add_bos: bool, add_eos: bool) -> Framing {
    let add_bos = meta.bool(ADD_BOS).unwrap_or(add_bos);
    let add_eos = meta.bool(ADD_EOS).unwrap_or(add_eos);
    Framing::Around {
        prefix: specials.bos.filter(|_| add_bos),
        suffix: specials.eos.filter(|_| add_eos),
    }
}

fn added_token(text: &str, attr: Attr) -> AddedToken {
    AddedToken::from(text.to_string(), attr.is_special())
        .normalized(false)
        .lstrip(attr.lstrip)
        .rstrip(attr.rstrip)
}

#[cfg(test)]
mod tests;
