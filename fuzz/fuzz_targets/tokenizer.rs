//! Arbitrary text through each kind of vocabulary of llama.cpp's tokenizer suite (BPE,
//! SentencePiece, WordPiece): encode, then decode what came out and arbitrary ids.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lmhost_plugin_kit::gguf::Metadata;
use lmhost_plugin_kit::tokenizer::TextTokenizer;

fn tokenizers() -> &'static [TextTokenizer] {
    static TOKENIZERS: OnceLock<Vec<TextTokenizer>> = OnceLock::new();
    TOKENIZERS.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llama.cpp");
        ["llama-bpe", "llama-spm", "bert-bge", "gpt-2"]
            .iter()
            .map(|name| {
                let path = dir.join(format!("ggml-vocab-{name}.gguf"));
                let meta = Metadata::read(&path).expect("run scripts/fetch-test-data");
                TextTokenizer::from_gguf(&meta).expect("a suite vocabulary loads")
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let tokenizer = &tokenizers()[which as usize % tokenizers().len()];
    let text = String::from_utf8_lossy(rest);
    for parse_special in [false, true] {
        if let Ok(ids) = tokenizer.encode(&text, true, parse_special) {
            let _ = tokenizer.decode(&ids, false);
        }
    }
    let ids: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let _ = tokenizer.decode(&ids, false);
});
