//! `liblmhost_candle`: the candle backend (crate `lmhost-candle`) exported as a plugin library.

lmhost_plugin_api::export_plugin!(backend::Candle);
