//! The `tokenizer.ggml.*` vocabulary as llama.cpp reads it: tokens, their types and scores, the
//! special ids with llama.cpp's per-model defaults, and the token attributes llama.cpp derives
//! from token text (end-of-generation markers, phi-3's right-stripping specials).
//!
//! Reference: `llama_vocab::impl::load` in
//! <https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp>.

use std::collections::BTreeSet;

use tokenizers::models::bpe::Vocab as TextIds;

use crate::gguf::{Metadata, Value};

use super::TokenizerError;

/// The GGUF key of the vocabulary: its tokens, one an id.
pub const TOKENS: &str = "tokenizer.ggml.tokens";
pub(super) const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(super) const SCORES: &str = "tokenizer.ggml.scores";
pub(super) const MERGES: &str = "tokenizer.ggml.merges";

/// What llama.cpp makes of a token: its GGUF type plus the flags it adds by text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Attr {
    pub control: bool,
    pub user_defined: bool,
    pub unknown: bool,
    pub lstrip: bool,
    pub rstrip: bool,
}

impl Attr {
    fn from_type(ty: i128) -> Attr {
        Attr {
            unknown: ty == 2,
            control: ty == 3,
            user_defined: ty == 4,
            ..Attr::default()
        }
    }

    /// Matched in the text before the model runs (llama.cpp's special-token cache).
    pub fn is_added(self) -> bool {
        self.control || self.user_defined || self.unknown
    }

    /// Matched only with `parse_special` and dropped by a decode that skips specials.
    pub fn is_special(self) -> bool {
        self.control || self.unknown
    }
}

/// The vocabulary of a GGUF file, checked.
#[derive(Debug)]
pub(super) struct Vocab {
    pub tokens: Vec<String>,
    pub attrs: Vec<Attr>,
    pub scores: Option<Vec<f32>>,
    pub ids: TextIds,
}

impl Vocab {
    pub fn read(meta: &Metadata) -> Result<Vocab, TokenizerError> {
        let tokens: Vec<String> = strings(meta, TOKENS)?
            .iter()
            .enumerate()
            // llama.cpp renames empty tokens so that every id has a distinct text.
            .map(|(i, t)| match t.is_empty() {
                true => format!("[EMPTY_{i}]"),
                false => t.to_string(),
            })
            .collect();
        let attrs = match meta.get(TOKEN_TYPE) {
            None => vec![Attr::from_type(1); tokens.len()],
            Some(_) => {
                let types = integers(meta, TOKEN_TYPE)?;
                same_length(TOKEN_TYPE, types.len(), tokens.len())?;
                types.into_iter().map(Attr::from_type).collect()
            }
        };
        let scores = match meta.get(SCORES) {
            None => None,
            Some(_) => {
                let scores = floats(meta, SCORES)?;
                same_length(SCORES, scores.len(), tokens.len())?;
                Some(scores)
            }
        };
        let ids = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        Ok(Vocab {
            tokens,
            attrs,
            scores,
            ids,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    fn set(&mut self, text: &str, change: impl Fn(&mut Attr)) {
        if let Some(id) = self.id(text) {
            change(&mut self.attrs[id as usize]);
        }
    }
}

/// An array of strings under `key`.
pub(super) fn strings<'m>(meta: &'m Metadata, key: &str) -> Result<Vec<&'m str>, TokenizerError> {
    array(meta, key, "an array of strings")?
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.as_str()),
            other => Err(wrong_type(key, "an array of strings", other)),
        })
        .collect()
}

fn integers(meta: &Metadata, key: &str) -> Result<Vec<i128>, TokenizerError> {
    array(meta, key, "an array of integers")?
        .iter()
        .map(|v| {
            v.as_i128()
                .ok_or_else(|| wrong_type(key, "an array of integers", v))
        })
        .collect()
}

fn floats(meta: &Metadata, key: &str) -> Result<Vec<f32>, TokenizerError> {
    array(meta, key, "an array of numbers")?
        .iter()
        .map(|v| {
            v.as_f32()
                .or_else(|| v.as_i128().map(|i| i as f32))
                .ok_or_else(|| wrong_type(key, "an array of numbers", v))
        })
        .collect()
}

fn array<'m>(
    meta: &'m Metadata,
    key: &str,
    expected: &'static str,
) -> Result<&'m [Value], TokenizerError> {
    match meta.get(key) {
        None => Err(TokenizerError::Missing {
            key: key.to_string(),
            expected,
        }),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(wrong_type(key, expected, other)),
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name(),
    }
}

fn same_length(key: &str, len: usize, tokens: usize) -> Result<(), TokenizerError> {
    if len == tokens {
        return Ok(());
    }
    Err(TokenizerError::Length {
        key: key.to_string(),
        len,
        tokens,
    })
}

/// The special ids of a vocabulary, after llama.cpp's defaults, metadata and text detection.
#[derive(Debug, Clone, Default)]
pub(super) struct Specials {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub eog: Vec<u32>,
}

/// Per-model defaults llama.cpp starts from before reading `*_token_id` keys.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Defaults {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
}

const KEY_PREFIX: &str = "tokenizer.ggml.";

/// End-of-turn texts llama.cpp recognises when `eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts llama.cpp treats as end of generation, whatever the metadata says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Whether llama.cpp ends generation at a token with this text.
pub(super) fn is_eog_text(text: &str) -> bool {
    EOG_TEXTS.contains(&text)
}

/// Reads the special ids and applies llama.cpp's text-based attribute fixes to `vocab`.
pub(super) fn specials(meta: &Metadata, vocab: &mut Vocab, defaults: Defaults) -> Specials {
    let n = vocab.len() as u32;
    let in_range = |id: Option<u32>| id.filter(|&id| id < n);
    // A metadata id out of range keeps the default, as llama.cpp does.
    let id = |name: &str, default: Option<u32>| {
        in_range(meta.u32(&format!("{KEY_PREFIX}{name}"))).or(in_range(default))
    };
    let bos = id("bos_token_id", defaults.bos);
    let eos = id("eos_token_id", defaults.eos);
    let unk = id("unknown_token_id", defaults.unk);
    let sep = id("seperator_token_id", defaults.sep);
    let eot = id("eot_token_id", None).or_else(|| detect(vocab, EOT_TEXTS));
    let eom = id("eom_token_id", None).or_else(|| detect(vocab, EOM_TEXTS));
    // Detected FIM markers become control tokens; pad, repo and separator end generation.
    for (key, texts, old_key) in [
        ("fim_pre_token_id", FIM_PRE_TEXTS, "prefix_token_id"),
        ("fim_suf_token_id", FIM_SUF_TEXTS, "suffix_token_id"),
        ("fim_mid_token_id", FIM_MID_TEXTS, "middle_token_id"),
    ] {
        if id(key, None).or(id(old_key, None)).is_none() {
            detect(vocab, texts);
        }
    }
    let mut eog: BTreeSet<u32> = [
        ("fim_pad_token_id", FIM_PAD_TEXTS),
        ("fim_rep_token_id", FIM_REP_TEXTS),
        ("fim_sep_token_id", FIM_SEP_TEXTS),
    ]
    .into_iter()
    .filter_map(|(key, texts)| id(key, None).or_else(|| detect(vocab, texts)))
    .collect();
    for text in EOG_TEXTS {
        if let Some(id) = vocab.id(text) {
            eog.insert(id);
            vocab.attrs[id as usize].control = true;
        }
    }
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        vocab.set(text, |a| {
            *a = Attr {
                user_defined: true,
                ..Attr::default()
            }
        });
    }
    eog.extend([eos, eot, eom].into_iter().flatten());
    drop_harmony_end(vocab, &mut eog);
    drop_normal_s(vocab, &mut eog);
    strip_flags(meta, vocab);
    Specials {
        bos,
        eos,
        unk,
        sep,
        eog: eog.into_iter().collect(),
    }
}

/// The lowest id whose text is one of `texts`, marked control as llama.cpp does.
fn detect(vocab: &mut Vocab, texts: &[&str]) -> Option<u32> {
    let id = texts.iter().filter_map(|t| vocab.id(t)).min()?;
    vocab.attrs[id as usize].control = true;
    Some(id)
}

fn text_of(vocab: &Vocab, id: u32) -> &str {
    &vocab.tokens[id as usize]
}

/// o200k_harmony and solar-open: `<|end|>` is not an end of generation there.
fn drop_harmony_end(vocab: &mut Vocab, eog: &mut BTreeSet<u32>) {
    let has = |t: &str| eog.iter().any(|&id| text_of(vocab, id) == t);
    let call = has("<|call|>") || has("<|calls|>");
    let end = eog
        .iter()
        .copied()
        .find(|&id| text_of(vocab, id) == "<|end|>");
    if let Some(end) = end {
        if call && (has("<|return|>") || has("<|flush|>")) {
            eog.remove(&end);
            vocab.attrs[end as usize] = Attr {
                user_defined: true,
                ..Attr::default()
            };
        }
    }
}

/// gemma4 and plamo: `</s>` is a normal token there.
fn drop_normal_s(vocab: &mut Vocab, eog: &mut BTreeSet<u32>) {
    let marker = eog
        .iter()
        .any(|&id| matches!(text_of(vocab, id), "<|tool_response>" | "<|plamo:eos|>"));
    let s = eog.iter().copied().find(|&id| text_of(vocab, id) == "</s>");
    if let (true, Some(s)) = (marker, s) {
        eog.remove(&s);
        vocab.attrs[s as usize] = Attr::default();
    }
}

/// llama.cpp's per-model whitespace stripping around special tokens.
fn strip_flags(meta: &Metadata, vocab: &mut Vocab) {
    let name = meta.str("general.name").unwrap_or("").to_lowercase();
    let pre = meta.str("tokenizer.ggml.pre").unwrap_or("");
    let arch = meta.str("general.architecture").unwrap_or("");
    let jina = ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
        .iter()
        .any(|p| pre.contains(p));
    let masked = ["nomic-bert-moe", "jina-bert-v3"]
        .iter()
        .any(|a| arch.contains(a));
    if jina || masked {
        vocab.set("<mask>", |a| a.lstrip = true);
    } else if name.contains("phi-3") || name.contains("phi3") {
        for attr in vocab.attrs.iter_mut().filter(|a| a.is_added()) {
            attr.rstrip = true;
        }
        vocab.set("</s>", |a| a.rstrip = true);
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            vocab.set(text, |a| a.rstrip = false);
        }
    } else if name.contains("modern-bert") {
        vocab.set("[MASK]", |a| a.lstrip = true);
    }
}
