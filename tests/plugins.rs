//! Loading real plugin libraries by name, and everything that can go wrong doing it.

use std::sync::Arc;

use lmhost::{ConversationSnapshot, Error, GenerationConfig, GenerationRecord, Host, Origin};
use lmhost_plugin_api::ErrorKind;
use lmhost_tests::{config, fixture_dir, plugin_dir};

fn generate(kind: &str, prompt: &str) -> Result<lmhost::GenerationRecord, Error> {
    let backend = Host::new().open(&config(kind, ""))?;
    backend.generate(
        &ConversationSnapshot::from_prompt(prompt),
        &GenerationConfig::default(),
    )
}

#[test]
fn mock_loads_by_name_and_is_deterministic() {
    let host = Host::new();
    let backend = host.open(&config("mock", "")).unwrap();
    assert_eq!(backend.plugin(), "mock");
    assert_eq!(backend.model_id(), "test-model");
    let snapshot = ConversationSnapshot::from_prompt("the quick brown fox jumps over the lazy dog");
    let config = GenerationConfig {
        compute_embeddings: true,
        ..Default::default()
    };
    let a = backend.generate(&snapshot, &config).unwrap();
    let b = backend.generate(&snapshot, &config).unwrap();
    // The second call differs only in what the (one-entry) prefix cache served.
    assert_eq!(
        a,
        GenerationRecord {
            cached_prompt_tokens: 0,
            ..b.clone()
        }
    );
    assert_eq!(b.cached_prompt_tokens, b.prompt_tokens - 1);
    assert!(!a.text.is_empty());
    assert_eq!(a.logprobs.len(), a.token_ids.len());
    assert!(a.embedding.is_some() && a.contextual_embedding.is_some());
    let other = backend
        .generate(
            &ConversationSnapshot::from_prompt("a completely different prompt here"),
            &config,
        )
        .unwrap();
    assert_ne!(a.text, other.text);
    // Scoring the generated reply gives back the logprobs generate reported.
    let score = backend.score(&snapshot, &a.text).unwrap();
    assert_eq!(score.logprobs, a.logprobs);
}

/// `score_batch` crosses the ABI (mock keeps the default body: one `score` per prompt) and
/// returns one record per prompt, in order.
#[test]
fn score_batch_returns_each_prompts_record_in_order() {
    let backend = Host::new().open(&config("mock", "")).unwrap();
    let prompts: Vec<_> = ["one fish", "two fish red fish", "blue whale"]
        .iter()
        .map(|&p| ConversationSnapshot::from_prompt(p))
        .collect();
    let one_by_one: Vec<_> = prompts
        .iter()
        .map(|p| backend.score(p, "fish swim").unwrap())
        .collect();
    let batch = backend.score_batch(&prompts, "fish swim").unwrap();
    let logprobs = |records: &[lmhost_plugin_api::ScoreRecord]| -> Vec<Vec<f32>> {
        records.iter().map(|r| r.logprobs.to_vec()).collect()
    };
    assert_eq!(logprobs(&batch), logprobs(&one_by_one));
    assert_ne!(batch[0].logprobs, batch[2].logprobs, "prompts must matter");
    assert!(backend.score_batch(&[], "fish").unwrap().is_empty());
}

/// `generate_batch` crosses the ABI the same way (mock keeps its default body: one `generate`
/// per prompt), and the host checks the config before the call.
#[test]
fn generate_batch_returns_each_prompts_reply_in_order() {
    let backend = Host::new().open(&config("mock", "")).unwrap();
    let prompts: Vec<_> = ["one fish", "two fish red fish", "blue whale"]
        .iter()
        .map(|&p| ConversationSnapshot::from_prompt(p))
        .collect();
    let generation = lmhost_plugin_api::GenerationConfig::default();
    let texts = |records: Vec<lmhost_plugin_api::GenerationRecord>| -> Vec<String> {
        records.into_iter().map(|r| r.text.into_string()).collect()
    };
    let one_by_one: Vec<_> = prompts
        .iter()
        .map(|p| backend.generate(p, &generation).unwrap())
        .collect();
    let batch = backend.generate_batch(&prompts, &generation).unwrap();
    let batch = texts(batch);
    assert_eq!(batch, texts(one_by_one));
    assert_ne!(batch[0], batch[2], "prompts must matter");
    let invalid = lmhost_plugin_api::GenerationConfig {
        temperature: -1.0,
        ..generation
    };
    let err = backend.generate_batch(&prompts, &invalid).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
}

#[test]
fn unknown_name_lists_directories_and_plugins_found() {
    let err = generate("no-such-backend", "hi").unwrap_err();
    let Error::PluginNotFound {
        searched, found, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(searched.contains(&plugin_dir()), "{err}");
    assert!(found.iter().any(|f| f.starts_with("mock (")), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("no-such-backend") && text.contains(&plugin_dir().display().to_string()),
        "{text}"
    );
}

#[test]
fn incompatible_plugin_is_refused_with_one_clear_line() {
    let err = generate("incompatible", "hi").unwrap_err();
    let Error::IncompatiblePlugin(refused) = &err else {
        panic!("{err}")
    };
    assert_eq!(refused.name, "incompatible");
    assert!(
        !refused.report.is_empty(),
        "the layout report is kept for --verbose"
    );
    let text = err.to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("ABI layout differs") && text.contains("--verbose"),
        "{text}"
    );
}

#[test]
fn a_library_that_is_not_a_plugin_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir
        .path()
        .join(lmhost::plugins::library_file_name("garbage"));
    std::fs::write(&garbage, b"not a shared library").unwrap();
    let err = Host::new().registry().load(&garbage).unwrap_err();
    assert!(matches!(err, Error::NotAPlugin { .. }), "{err}");
    assert!(err.to_string().contains("is not an lmhost plugin"), "{err}");
    // A real shared library without the identity symbol: the incompatible fixture's is there,
    // so use a system library.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    if let Some(libm) = libm {
        let err = Host::new().registry().load(libm.as_ref()).unwrap_err();
        assert!(
            err.to_string()
                .contains("exports no `lmhost_plugin_identity`"),
            "{err}"
        );
    }
}

#[test]
fn a_panic_in_the_plugin_becomes_an_internal_error_and_the_host_keeps_serving() {
    let backend = Host::new().open(&config("faulty", "")).unwrap();
    let err = backend
        .generate(
            &ConversationSnapshot::from_prompt("please panic"),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(err.plugin_kind(), Some(ErrorKind::Internal), "{err}");
    assert!(err.to_string().contains("asked to panic"), "{err}");
    let ok = backend
        .generate(
            &ConversationSnapshot::from_prompt("all good"),
            &GenerationConfig::default(),
        )
        .unwrap();
    assert_eq!(ok.text, "all good");
}

#[test]
fn plugin_errors_keep_their_kind_and_message() {
    let err = generate("faulty", "please fail").unwrap_err();
    assert_eq!(err.plugin_kind(), Some(ErrorKind::InvalidInput));
    assert!(
        err.to_string()
            .starts_with("backend `faulty`: invalid_input error: asked to fail"),
        "{err}"
    );
}

#[test]
fn eight_threads_generate_concurrently() {
    let backend = Arc::new(Host::new().open(&config("mock", "")).unwrap());
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("prompt number {i} about topic {}", i * 7))
        .collect();
    let expected: Vec<_> = prompts
        .iter()
        .map(|p| {
            backend
                .generate(
                    &ConversationSnapshot::from_prompt(p.as_str()),
                    &GenerationConfig::default(),
                )
                .unwrap()
        })
        .collect();
    let handles: Vec<_> = prompts
        .into_iter()
        .map(|p| {
            let backend = Arc::clone(&backend);
            std::thread::spawn(move || {
                (0..20)
                    .map(|_| {
                        backend
                            .generate(
                                &ConversationSnapshot::from_prompt(p.as_str()),
                                &GenerationConfig::default(),
                            )
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (handle, expected) in handles.into_iter().zip(expected) {
        for record in handle.join().unwrap() {
            assert_eq!(record.text, expected.text);
            assert_eq!(record.logprobs, expected.logprobs);
        }
    }
}

#[test]
fn options_of_the_wrong_type_fail_naming_the_key() {
    let err = Host::new()
        .open(&config(
            "mock",
            "[backend.options]\nreply_words = \"many\"\n",
        ))
        .unwrap_err();
    assert_eq!(err.plugin_kind(), Some(ErrorKind::Config));
    let text = err.to_string();
    assert!(
        text.contains("`reply_words`") && text.contains("whole number"),
        "{text}"
    );
    let err = Host::new()
        .open(&config("mock", "[backend.options]\nreply_word = 3\n"))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("allowed keys: reply_words, latency_ms"),
        "{err}"
    );
}

#[test]
fn in_process_registration_needs_no_library() {
    let mut host = Host::new();
    host.register(lmhost::root_module::<lmhost_mock::Mock>());
    let (plugin, origin) = host.registry().find("mock", &[]).unwrap();
    assert_eq!(
        (plugin.name().as_str(), origin),
        ("mock", Origin::InProcess)
    );
    let mut config = config("mock", "");
    config.plugin_dirs.clear();
    let record = host
        .open(&config)
        .unwrap()
        .generate(
            &ConversationSnapshot::from_prompt("hello in process"),
            &GenerationConfig::default(),
        )
        .unwrap();
    assert!(!record.text.is_empty());
}

#[test]
fn discovery_lists_every_plugin_and_reports_broken_ones() {
    // Where cargo builds them, the fixtures are not plugins a search finds.
    let (plugins, errors) = Host::new().registry().discover(&[plugin_dir()]);
    let names: Vec<String> = plugins.iter().map(|(p, _)| p.name()).collect();
    assert!(names.contains(&"mock".into()), "{names:?}");
    assert!(!names.contains(&"faulty".into()), "{names:?}");
    assert!(
        !errors
            .iter()
            .any(|e| matches!(e, Error::IncompatiblePlugin(_))),
        "{errors:?}"
    );

    let (plugins, errors) = Host::new()
        .registry()
        .discover(&[plugin_dir(), fixture_dir()]);
    let names: Vec<String> = plugins.iter().map(|(p, _)| p.name()).collect();
    assert!(
        names.contains(&"mock".into()) && names.contains(&"faulty".into()),
        "{names:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, Error::IncompatiblePlugin(_))),
        "{errors:?}"
    );
}

#[test]
fn the_readme_example_plugin_loads_from_its_own_directory() {
    let examples = plugin_dir().join("..").join("examples");
    let mut config = config("echo", "[backend.options]\nshout = true\n");
    config.plugin_dirs = vec![examples];
    let record = Host::new()
        .open(&config)
        .unwrap()
        .generate(
            &ConversationSnapshot::from_prompt("hello plugin world"),
            &GenerationConfig::default(),
        )
        .unwrap();
    assert_eq!(record.text, "WORLD PLUGIN HELLO");
}
