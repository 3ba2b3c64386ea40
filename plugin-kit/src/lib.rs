//! The batteries every lmhost text backend shares, kept in one place so backends carry no
//! copies of their own: the tokenizer built from GGUF metadata (or read from a Hugging Face
//! directory), chat templates rendered the way Transformers renders them, the rendering of a
//! conversation into prompt text, the seeded sampler, the prompt-prefix cache's tree, and the
//! multimodal processor contract.
//!
//! `lmhost-plugin-api` stays the bare contract; this crate is an optional toolkit on top of it,
//! which third-party plugin authors may use too.

pub mod concurrent;
pub mod ct2;
pub mod gguf;
pub mod hf;
pub mod multimodal;
pub mod prefix_cache;
pub mod prompt;
pub mod sampling;
pub mod simd;
pub mod template;
pub mod text;
pub mod tokenizer;
