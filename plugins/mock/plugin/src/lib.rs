//! `liblmhost_mock`: the mock backend (crate `lmhost-mock`) exported as a plugin library.

lmhost_plugin_api::export_plugin!(backend::Mock);
