//! `candle`: local causal language models on Hugging Face's candle.

pub mod audio_backend;
pub mod kv;
pub mod models;
pub mod processor;
pub mod speech_plugin;

lmhost_plugin_api::export_plugin!(speech_plugin::CandleSpeech);
