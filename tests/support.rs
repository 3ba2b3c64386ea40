//! Helpers for the integration tests: where the built plugin libraries are, and configs that
//! point at them.

use std::path::PathBuf;

use lmhost::Config;

/// The directory cargo put the plugin libraries in: the test binary's own (`target/<profile>/deps`).
pub fn plugin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    exe.parent()
        .expect("the test binary has a directory")
        .to_path_buf()
}

/// A config for plugin `kind` with `extra` TOML appended, searching only [`plugin_dir`].
pub fn config(kind: &str, extra: &str) -> Config {
    let text = format!(
        "plugin_dirs = [{:?}]\n[backend]\nkind = {kind:?}\nmodel_id = \"test-model\"\n{extra}",
        plugin_dir()
    );
    Config::parse(&text, "test.toml".as_ref()).expect("test config parses")
}
