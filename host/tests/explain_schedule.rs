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
    host.register(lmhost_mock::plugin_module());
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
