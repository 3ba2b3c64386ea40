//! llama.cpp's BPE pre-tokenizer table: for each `tokenizer.ggml.pre` name, the regexes that
//! split text into words (applied in sequence, every match and every gap kept as its own piece)
//! and the flags that go with it.
//!
//! The regexes are llama.cpp's own (`llm_tokenizer_bpe` in
//! <https://github.com/ggml-org/llama.cpp/blob/master/src/llama-vocab.cpp>); where llama.cpp
//! rewrote a tokenizer.json regex for `std::regex` (`(?i:'s|...)` spelled as `'[sS]|...`), the
//! original is used, since Oniguruma handles it as Hugging Face does.

/// How a BPE vocabulary splits and encodes text.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pre {
    /// The canonical llama.cpp name, for `kind()`.
    pub name: &'static str,
    pub regexes: &'static [&'static str],
    /// Words are mapped to GPT-2's printable byte alphabet (false: raw UTF-8 with `<0xXX>` fallback).
    pub byte_encode: bool,
    /// A word that is itself a token is not merged (llama.cpp's `ignore_merges`).
    pub ignore_merges: bool,
    /// Spaces become `▁` before splitting (SPM-style BPE such as Gemma 4).
    pub escape_whitespace: bool,
    /// Overrides the BPE default of not adding BOS.
    pub add_bos: bool,
}

const CONTRACTIONS_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const NEWLINES: &str = r"[^\n]+|[\n]+";

const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];
const DEEPSEEK_LLM: &[&str] = &[
    r"[\r\n]",
    concat!(
        r"\s?[",
        r"A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}",
        r"\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}",
        r"\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}",
        r"\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}",
        r"\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}",
        r"\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}",
        r"\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}",
        r"\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}",
        r"\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}",
        r"\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}",
        r"\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}",
        r"\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}",
        r"\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}",
        r"\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}",
        r"\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}",
        r"\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}",
        r"\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}",
        r"\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}",
        r"\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}",
        r"]+",
    ),
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
];
const DEEPSEEK_CODER: &[&str] = &[
    r"[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}",
];
const DEEPSEEK3_LLM: &[&str] = &[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3];
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"];
const STARCODER: &[&str] = &[r"\p{N}", GPT2];
const BLOOM: &[&str] = &[r" ?[^(\s|.,!?…。，、।۔،)]+"];
const VIKING: &[&str] = &[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"];
const SEED_CODER: &[&str] = &[
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
];
const BAILINGMOE: &[&str] = &[
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
];
const MINICPM5: &[&str] = &[
    r"\p{N}{1,3}",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// A pre-tokenizer with the usual flags (byte-level, merges always applied, no BOS).
const fn plain(name: &'static str, regexes: &'static [&'static str]) -> Pre {
    Pre {
        name,
        regexes,
        byte_encode: true,
        ignore_merges: false,
        escape_whitespace: false,
        add_bos: false,
    }
}

const fn llama3(name: &'static str) -> Pre {
    Pre {
        ignore_merges: true,
        add_bos: true,
        ..plain(name, &[CONTRACTIONS_LLAMA3])
    }
}

const fn gemma4(name: &'static str) -> Pre {
    Pre {
        byte_encode: false,
        escape_whitespace: true,
        ..plain(name, &[NEWLINES])
    }
}

/// The pre-tokenizers this crate rebuilds, by every `tokenizer.ggml.pre` name llama.cpp gives
/// them. Names llama.cpp handles with hand-written splitters (kimi-k2, afmoe, tiny_aya,
/// superbpe) are left out rather than approximated.
const TABLE: &[(&[&str], Pre)] = &[
    (&["default"], plain("default", DEFAULT)),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        llama3("llama-bpe"),
    ),
    (&["dbrx"], plain("dbrx", &[CONTRACTIONS_LLAMA3])),
    (&["smaug-bpe"], plain("smaug-bpe", &[CONTRACTIONS_LLAMA3])),
    (&["deepseek-llm"], plain("deepseek-llm", DEEPSEEK_LLM)),
    (&["deepseek-coder"], plain("deepseek-coder", DEEPSEEK_CODER)),
    (
        &["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"],
        plain("deepseek-v3", DEEPSEEK3_LLM),
    ),
    (&["falcon"], plain("falcon", FALCON)),
    (
        &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        plain("starcoder", STARCODER),
    ),
    (
        &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ],
        plain("gpt-2", &[GPT2]),
    ),
    (
        &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
            "grok-2",
        ],
        plain("qwen2", &[QWEN2]),
    ),
    (&["qwen35"], plain("qwen35", &[QWEN35])),
    (&["laguna"], plain("laguna", &[NEWLINES, QWEN2])),
    (
        &["poro-chat", "bloom", "gpt3-finnish"],
        plain("bloom", BLOOM),
    ),
    (&["viking"], plain("viking", VIKING)),
    (
        &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        plain("gpt-4o", &[GPT4O]),
    ),
    (&["seed-coder"], plain("seed-coder", SEED_CODER)),
    (
        &["bailingmoe", "bailingmoe2", "llada-moe"],
        plain("bailingmoe", BAILINGMOE),
    ),
    (
        &["minicpm5"],
        Pre {
            ignore_merges: true,
            ..plain("minicpm5", MINICPM5)
        },
    ),
    (&["gemma4", "granite-embed-multi-311m"], gemma4("gemma4")),
    (&["sarvam-moe"], gemma4("sarvam-moe")),
];

/// The pre-tokenizer llama.cpp uses for `name`.
pub(super) fn lookup(name: &str) -> Option<Pre> {
    TABLE
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, pre)| *pre)
}

/// Every supported name, for the error that refuses an unknown one.
pub(super) fn names() -> Vec<&'static str> {
    TABLE
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect()
}
