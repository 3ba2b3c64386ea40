//! The `lmhost` binary as a user runs it: plugins are found beside the executable.

use std::path::Path;
use std::process::{Command, Output};

fn lmhost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .expect("lmhost runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn plugins_lists_mock_with_its_options() {
    let output = lmhost(&["plugins"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let mock = text
        .lines()
        .find(|l| l.starts_with("mock "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(mock.contains("liblmhost_mock"), "{mock}");
    assert!(
        text.contains("reply_words") && text.contains("Most words per reply."),
        "{text}"
    );
    // Beside the executable lie only real plugins: the test fixtures are built under other
    // names, and none is refused as incompatible.
    let all = format!("{text}{}", stderr(&output));
    assert!(
        !all.contains("faulty") && !all.contains("incompatible"),
        "{all}"
    );
}

/// A backend's error names the backend and says its message once, not again as its cause.
#[test]
fn a_backend_error_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    let options = "[backend.options]\nweights = \"nope\"\n";
    std::fs::write(
        &config,
        format!("[backend]\nkind = \"candle\"\nmodel_id = \"m\"\n{options}"),
    )
    .unwrap();
    let config = config.display().to_string();
    let output = lmhost(&["generate", "--prompt", "hi", "--config", &config]);
    assert!(!output.status.success());
    let text = stderr(&output);
    assert_eq!(text.matches("must be one of").count(), 1, "{text}");
    assert!(
        text.starts_with("error: backend `candle`: config error"),
        "{text}"
    );
}

#[test]
fn generate_prints_a_json_record() {
    let output = lmhost(&[
        "generate",
        "--config",
        "configs/mock.toml",
        "--prompt",
        "hi there",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let record: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert!(!record["text"].as_str().unwrap().is_empty());
    assert_eq!(
        record["logprobs"].as_array().unwrap().len(),
        record["token_ids"].as_array().unwrap().len()
    );
    assert_eq!(record["finish_reason"], "eos");
}

#[test]
fn a_bad_config_fails_with_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[backend]\nkind = \"mock\"\ncolour = \"blue\"\n").unwrap();
    let output = lmhost(&[
        "generate",
        "--config",
        config.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert!(!output.status.success());
    let text = stderr(&output);
    assert!(
        text.contains("bad.toml:3:1") && text.contains("colour"),
        "{text}"
    );
}

#[test]
fn a_missing_conversation_file_is_named() {
    let output = lmhost(&[
        "generate",
        "--config",
        "configs/mock.toml",
        "--conversation",
        "nowhere.json",
    ]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("cannot read nowhere.json"),
        "{}",
        stderr(&output)
    );
}

/// Runs `lmhost serve` on `config`, which must stop it before it listens; its stderr.
fn serve_refusing(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .args(["serve", "--port", "0", "--config"])
        .arg(&path)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lmhost runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("lmhost serve kept running with a model that cannot load");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    stderr(&output)
}

/// `serve` loads the model before it listens: a model file that is not there, or one whose
/// tokenizer reads but whose architecture does not load (tokenizing alone would not find out),
/// stops it with the reason and a non-zero exit, instead of a server that answers every
/// request 503.
#[test]
fn serve_exits_naming_a_model_that_cannot_load() {
    let text = serve_refusing("[backend]\nkind = \"candle\"\nmodel_id = \"/nowhere/model.gguf\"\n");
    assert!(
        text.contains("/nowhere/model.gguf") && !text.contains("lmhost serve: `"),
        "{text}"
    );
    let vocab = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/llama.cpp/ggml-vocab-gpt-2.gguf")
        .canonicalize()
        .expect("scripts/fetch-test-data installs llama.cpp's vocabularies");
    let text = serve_refusing(&format!(
        "[backend]\nkind = \"candle\"\nmodel_id = {:?}\n",
        vocab.display().to_string()
    ));
    assert!(text.contains("unknown architecture \"gpt2\""), "{text}");
}

/// A plugin that links a library the dynamic loader cannot find (as a CUDA build links cuBLAS)
/// loads once a Python environment's `nvidia/*/lib` holds it, and without one is refused naming
/// the library and every folder searched. The plugin is the mock's library with one more
/// `DT_NEEDED` entry, added by patchelf; the library is an empty one built by the C compiler.
#[test]
fn a_plugins_missing_library_is_loaded_from_a_python_wheel() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    let wheel = tmp
        .path()
        .join("venv/lib/python3.11/site-packages/nvidia/fake/lib");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(&wheel).unwrap();
    let built = Path::new(env!("CARGO_BIN_EXE_lmhost")).with_file_name("liblmhost_mock.so");
    let plugin = plugins.join("liblmhost_mock.so");
    std::fs::copy(&built, &plugin).unwrap();
    let run = |program: &str, args: &[&std::ffi::OsStr]| {
        let output = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} runs (scripts/setup-system installs it): {e}"));
        assert!(output.status.success(), "{program}: {}", stderr(&output));
    };
    let library = "liblmhost-test-needed.so.7";
    run(
        "patchelf",
        &[
            "--add-needed".as_ref(),
            library.as_ref(),
            plugin.as_os_str(),
        ],
    );
    let c = tmp.path().join("empty.c");
    std::fs::write(&c, "int lmhost_test_needed(void) { return 7; }\n").unwrap();
    let soname = format!("-Wl,-soname,{library}");
    let out = wheel.join(library);
    run(
        "cc",
        &[
            "-shared".as_ref(),
            "-fPIC".as_ref(),
            soname.as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
            c.as_os_str(),
        ],
    );
    let plugins_in = |venv: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lmhost"));
        command
            .arg("plugins")
            .env("LMHOST_PLUGIN_PATH", &plugins)
            .env("HOME", tmp.path())
            .env_remove("CONDA_PREFIX")
            .env_remove("LD_LIBRARY_PATH");
        match venv {
            Some(venv) => command.env("VIRTUAL_ENV", venv),
            None => command.env_remove("VIRTUAL_ENV"),
        };
        let output = command.output().expect("lmhost runs");
        format!("{}{}", stdout(&output), stderr(&output))
    };

    let refused = plugins_in(None);
    assert!(
        refused.contains(&format!("needs {library}"))
            && refused.contains("LD_LIBRARY_PATH")
            && refused.contains("nvidia/*/lib"),
        "{refused}"
    );
    let loaded = plugins_in(Some(&tmp.path().join("venv")));
    let mock = loaded
        .lines()
        .find(|l| l.starts_with("mock "))
        .unwrap_or_else(|| panic!("{loaded}"));
    assert!(mock.contains(&plugins.display().to_string()), "{loaded}");
    assert!(!loaded.contains(library), "{loaded}");
}
