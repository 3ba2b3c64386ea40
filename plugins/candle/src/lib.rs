//! `candle`: local causal language models on Hugging Face's candle.

pub mod kv;
pub mod prefix_cache;
