//! Through the host: `kind = "candle"` loads `liblmhost_candle.so` by name and generates.

mod common;

use std::path::PathBuf;

use lmhost::{Config, ConversationSnapshot, Host};

/// `target/debug`, where cargo puts the plugin library beside the test's `deps/` directory.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .to_path_buf()
}

#[test]
fn host_loads_the_candle_library_by_name_and_generates() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::write_gguf(&dir.path().join("tiny.gguf"), "llama");
    let library = library_dir().join(lmhost::plugins::library_file_name("candle"));
    assert!(
        library.is_file(),
        "{} missing: build with `cargo build --workspace`",
        library.display()
    );
    let config_path = dir.path().join("candle.toml");
    let toml = format!(
        "plugin_dirs = [{:?}]\n[backend]\nkind = \"candle\"\nmodel_id = \"tiny.gguf\"\n\
         [backend.options]\nweights = \"f32\"\nthreads = 1\n[generation]\nmax_new_tokens = 5\n",
        library_dir()
    );
    std::fs::write(&config_path, toml).unwrap();
    let config = Config::load(&config_path).unwrap();
    let backend = Host::new().open(&config).unwrap();
    assert_eq!(backend.plugin(), "candle");
    let record = backend
        .generate(
            &ConversationSnapshot::from_prompt("Hello?"),
            &config.generation,
        )
        .unwrap();
    assert!(!record.token_ids.is_empty() && record.token_ids.len() <= 5);
    assert_eq!(record.logprobs.len(), record.token_ids.len());
    assert!(model.is_file());
}
