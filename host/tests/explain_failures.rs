//! A batch that fails keeps what it can: its prompts run again one at a time, each stored as it
//! comes, so a rerun takes them from the run directory.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use lmhost::explain_run::{self, RunOptions};
use lmhost::{Config, ConversationSnapshot, Host};
use lmhost_plugin_api::author::root_module;
use lmhost_plugin_api::{
    Backend, Capabilities, GenerationConfig, GenerationRecord, Message, OptionSpec, PluginContext,
    PluginError, Role, ScoreRecord, TokenDelta,
};

/// While set, scoring a prompt that holds the word "poison" fails.
static POISONED: AtomicBool = AtomicBool::new(true);

/// Scores a prompt by its word count; keeps the default, all-or-nothing `score_batch`.
struct Flaky;

impl Backend for Flaky {
    const NAME: &'static str = "flaky";
    const VERSION: &'static str = "0.1.0";

    fn options() -> Vec<OptionSpec> {
        Vec::new()
    }

    fn new(_: PluginContext) -> Result<Self, PluginError> {
        Ok(Flaky)
    }

    fn model_id(&self) -> String {
        "flaky".into()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            scores_continuations: true,
            ..Capabilities::default()
        }
    }

    fn generate_stream(
        &self,
        _: &ConversationSnapshot,
        _: &GenerationConfig,
        _: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        Ok(GenerationRecord::from_text("fine"))
    }

    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        _: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        snapshots.iter().map(score).collect()
    }
}

/// One word's log-probability per word of the prompt; a prompt holding "poison" fails once
/// [`POISONED`] is set.
fn score(snapshot: &ConversationSnapshot) -> Result<ScoreRecord, PluginError> {
    let texts: Vec<String> = snapshot.messages().map(|m| m.text_content()).collect();
    if POISONED.load(Ordering::SeqCst) && texts.iter().any(|t| t.contains("poison")) {
        return Err(PluginError::invalid_input("poisoned prompt"));
    }
    let words = texts
        .iter()
        .map(|t| t.split_whitespace().count())
        .sum::<usize>();
    Ok(ScoreRecord {
        token_ids: vec![1].into(),
        logprobs: vec![-(words as f32)].into(),
        prompt_tokens: words as u32,
        cached_prompt_tokens: 0,
    })
}

#[test]
fn a_failed_batch_stores_the_values_it_can_and_a_rerun_reuses_them() {
    let config = Config::parse(
        "[backend]\nkind = \"flaky\"\n[explanation]\nbatch_size = 1000\n",
        Path::new("inline.toml"),
    )
    .unwrap();
    let mut host = Host::new();
    host.register(root_module::<Flaky>());
    let backend = host.open(&config).unwrap();
    let conversation = ConversationSnapshot::new(lmhost::conversation::group_turns([
        Message::text(Role::User, "one two three"),
        Message::text(Role::Assistant, "four five"),
        Message::text(Role::User, "a poison word"),
    ]))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = RunOptions {
        run_dir: Some(dir.path().join("run")),
        ..RunOptions::default()
    };

    let err = explain_run::run(&config, &backend, &conversation, &options).unwrap_err();
    assert!(err.to_string().contains("poisoned prompt"), "{err}");
    POISONED.store(false, Ordering::SeqCst);
    let outcome = explain_run::run(&config, &backend, &conversation, &options).unwrap();
    let stats = outcome.stats;
    // One batch held every coalition; what came before its first poisoned prompt was kept.
    assert!(stats.reused_from_run_dir > 0, "{stats:?}");
    assert!(
        stats.evaluated >= 4,
        "the poisoned coalitions ran only now: {stats:?}"
    );
    assert_eq!(stats.reused_from_run_dir + stats.evaluated, 8);
}
