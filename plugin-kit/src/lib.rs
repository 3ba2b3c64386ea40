//! The batteries every lmhost text backend shares, kept in one place so backends carry no
//! copies of their own: the tokenizer built from GGUF metadata, chat templates rendered the way
//! Transformers renders them, and the rendering of a conversation into prompt text.
//!
//! `lmhost-plugin-api` stays the bare contract; this crate is an optional toolkit on top of it,
//! which third-party plugin authors may use too.

pub mod gguf;
pub mod prompt;
pub mod template;
pub mod tokenizer;
