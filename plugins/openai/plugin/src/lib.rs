//! `liblmhost_openai`: the openai backend (crate `lmhost-openai`) exported as a plugin library.

lmhost_plugin_api::export_plugin!(backend::OpenAi);
