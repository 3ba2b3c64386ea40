//! `liblmhost_onnx`: the onnx backend (crate `lmhost-onnx`) exported as a plugin library.

lmhost_plugin_api::export_plugin!(backend::Onnx);
