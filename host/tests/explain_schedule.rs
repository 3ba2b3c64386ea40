//! Scheduling on the mock backend, in-process: sorting prompts makes the prefix cache pay, and
//! batching changes no value.

use std::path::Path;

use lmhost::explain_run::{self, RunOptions};
use lmhost::{conversation, Config, Host};

fn reused_tokens(sort: bool) -> (u64, Vec<f64>) {
    run(|e| e.sort_prompts = sort)
}

/// Explains the example conversation by sentences, `[explanation]` adjusted by `adjust`;
/// returns the prompt tokens reused and the attributions.
fn run(adjust: impl FnOnce(&mut lmhost::config::ExplanationConfig)) -> (u64, Vec<f64>) {
    let mut config = Config::parse(
        "[backend]\nkind = \"mock\"\n[explanation]\nplayers = \"sentences\"\n",
        Path::new("inline.toml"),
    )
    .unwrap();
    adjust(&mut config.explanation);
    let mut host = Host::new();
    host.register(lmhost::root_module::<lmhost_mock::Mock>());
    let backend = host.open(&config).unwrap();
    let conversation = conversation::load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/conversation.json"),
    )
    .unwrap();
    let outcome =
        explain_run::run(&config, &backend, &conversation, &RunOptions::default()).unwrap();
    let values = outcome
        .explanation
        .attributions
        .iter()
        .map(|a| a.value)
        .collect();
    (outcome.stats.prompt_tokens_reused, values)
}

#[test]
fn sorted_prompts_share_more_prefix_tokens_than_unsorted_with_equal_values() {
    let (sorted, sorted_values) = reused_tokens(true);
    let (unsorted, unsorted_values) = reused_tokens(false);
    assert!(sorted > unsorted, "sorted {sorted} <= unsorted {unsorted}");
    assert_eq!(sorted_values, unsorted_values);
}

#[test]
fn batch_size_changes_no_value() {
    let (_, whole) = run(|e| e.batch_size = 1);
    for size in [3, 32, 10_000] {
        let (_, batched) = run(|e| e.batch_size = size);
        assert_eq!(batched, whole, "batch_size {size}");
    }
}

/// A conversation whose user message holds `seconds` of 16 kHz audio made from `seed`.
fn with_audio(seconds: usize, seed: f32) -> lmhost::ConversationSnapshot {
    use lmhost_plugin_api::abi_stable::std_types::RVec;
    use lmhost_plugin_api::{Audio, Message, Part, Role, Turn};
    let samples: Vec<f32> = (0..16_000 * seconds)
        .map(|i| (i as f32 * 0.001 + seed).sin() * 0.5)
        .collect();
    let message = Message::new(
        Role::User,
        vec![
            Part::Audio {
                audio: Audio {
                    samples: RVec::from(samples),
                    sample_rate: 16_000,
                },
            },
            Part::text("What is said here?"),
        ],
    );
    lmhost::ConversationSnapshot::new(vec![Turn {
        messages: RVec::from(vec![message]),
    }])
    .unwrap()
}

#[test]
fn a_minute_of_audio_gives_a_small_schedule_key_and_a_small_stored_row() {
    use lmhost::explain::schedule::content_key;
    use lmhost::explain::Evaluation;
    use lmhost::explain_run::store::{prompt_key, RunStore};

    let minute = with_audio(60, 0.0);
    let other = with_audio(60, 0.25);
    let key = content_key(&minute);
    assert!(key.len() <= 256, "schedule key of {} bytes", key.len());
    assert_ne!(key, content_key(&other));
    assert_eq!(key, content_key(&minute.clone()), "deterministic");

    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path()).unwrap();
    let e = Evaluation {
        value: -2.5,
        tokens: Vec::new(),
        prompt_tokens: 1500,
        cached_prompt_tokens: 0,
    };
    store.put("run", &minute, &e).unwrap();
    store.put("run", &other, &e).unwrap();
    let loaded = store.load("run").unwrap();
    assert_eq!(loaded.len(), 2, "two audios, two rows");
    assert_eq!(loaded[&prompt_key(&minute)], e);
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join("values.sqlite")).unwrap();
    let row_bytes: i64 = conn
        .query_row(
            "SELECT MAX(length(CAST(run_key AS BLOB)) + length(CAST(prompt_key AS BLOB)) \
             + length(CAST(prompt_json AS BLOB)) + 32) FROM coalition_values",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(row_bytes <= 1024, "stored row of {row_bytes} bytes");
}
