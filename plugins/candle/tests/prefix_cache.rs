//! The prefix cache through the candle backend on SmolLM2-135M (run `scripts/fetch-models`),
//! weights dequantized to f32 and f32 compute, where cache on and cache off must agree.
//!
//! The prompts are "coalitions" as `lmhost explain` sends them: one conversation with messages
//! dropped in every pattern, rendered with the model's chat template, in sorted order. Each
//! test loads its own backend (they toggle the cache), so the tests can run in parallel.

use std::path::PathBuf;

use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, GenerationConfig, KvCacheSettings, Message, PluginContext, Role,
    Turn,
};

/// The droppable messages; every prompt ends with [`QUESTION`].
const PLAYERS: [(Role, &str); 5] = [
    (
        Role::System,
        "You are a concise assistant for a small bakery.",
    ),
    (Role::User, "We sell sourdough, rye bread and croissants."),
    (Role::Assistant, "Noted: sourdough, rye and croissants."),
    (Role::User, "Croissants sell out by nine every morning."),
    (
        Role::Assistant,
        "Then croissants are your most popular item.",
    ),
];
const QUESTION: &str = "Which item should we bake more of?";
const REPLY: &str = "Bake more croissants.";
/// The bound. Measured here: 0 (bit-identical), because attention computes each row
/// alone wherever its keys lie and every pass has at least `MIN_ROWS` rows, so a row's
/// arithmetic does not depend on how its prompt was split (see `engine`). Another CPU's GEMM
/// kernels may round skinny passes apart.
const TOLERANCE: f32 = 1e-5;

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-models from the repository root first",
        path.display()
    );
    path
}

fn backend() -> Candle {
    let context = PluginContext::new("candle", &model_path().to_string_lossy())
        .with_options(json!({ "weights": "f32", "dtype": "float32" }));
    Candle::new(context).unwrap()
}

fn cache(b: &Candle, enabled: bool) {
    let settings = KvCacheSettings {
        enabled,
        max_entries: 64,
        max_bytes: 0,
    };
    b.set_kv_cache(settings).unwrap();
}

/// The conversation with the players in `mask` kept, one message per turn.
fn coalition(mask: u32) -> ConversationSnapshot {
    let kept = PLAYERS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0);
    let mut turns: Vec<Turn> = kept
        .map(|(_, &(role, text))| Turn {
            messages: vec![Message::text(role, text)].into(),
        })
        .collect();
    turns.push(Turn {
        messages: vec![Message::text(Role::User, QUESTION)].into(),
    });
    ConversationSnapshot::new(turns).unwrap()
}

/// All 32 coalitions with their prompt tokens, in sorted token order.
fn coalitions(b: &Candle) -> Vec<(ConversationSnapshot, Vec<u32>)> {
    let engine = b.engine().unwrap();
    let mut all: Vec<_> = (0..1u32 << PLAYERS.len())
        .map(|mask| {
            let snapshot = coalition(mask);
            let ids = engine.front.prompt_ids(&snapshot, 0).unwrap();
            (snapshot, ids)
        })
        .collect();
    all.sort_by(|a, b| a.1.cmp(&b.1));
    all
}

/// What the cache must serve each prompt, worked out from the tokens alone: the longest common
/// prefix with an earlier prompt's stored all-but-last tokens, one token short of the prompt.
fn expected_reuse(prompts: &[Vec<u32>]) -> Vec<u32> {
    let lcp = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let best = prompts[..i].iter().map(|q| lcp(p, &q[..q.len() - 1])).max();
            best.unwrap_or(0).min(p.len() - 1) as u32
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Counters after a sorted pass with the cache on: the cache's own count of reused tokens is
/// what the records say, and what the token arithmetic predicts.
fn check_reuse(b: &Candle, prompts: &[Vec<u32>], cached: &[u32]) {
    assert_eq!(cached, expected_reuse(prompts));
    let stats = b.stats();
    let total: u64 = cached.iter().map(|&c| u64::from(c)).sum();
    let computed: usize = prompts.iter().map(Vec::len).sum::<usize>() - total as usize;
    println!(
        "hits {} misses {} reused {total} computed {computed} bytes {}",
        stats.kv_cache_hits, stats.kv_cache_misses, stats.kv_cache_bytes
    );
    assert!(stats.kv_cache_hits > 0);
    assert_eq!(
        stats.kv_cache_hits + stats.kv_cache_misses,
        prompts.len() as u64
    );
    assert_eq!(stats.kv_cache_reused_tokens, total);
    assert!(
        total as usize > computed,
        "coalitions share most of their prompts"
    );
}

#[test]
fn generate_gives_the_same_greedy_text_and_logprobs_with_the_cache() {
    let b = backend();
    let prompts = coalitions(&b);
    let config = GenerationConfig {
        max_new_tokens: 4,
        ..GenerationConfig::default()
    };
    let run = || -> Vec<_> {
        prompts
            .iter()
            .map(|(s, _)| b.generate(s, &config).unwrap())
            .collect()
    };
    let off = run();
    cache(&b, true);
    let on = run();
    for ((off, on), (_, ids)) in off.iter().zip(&on).zip(&prompts) {
        assert_eq!(off.cached_prompt_tokens, 0);
        assert_eq!(
            (&on.text, &on.token_ids),
            (&off.text, &off.token_ids),
            "{ids:?}"
        );
        let diff = max_abs_diff(&on.logprobs, &off.logprobs);
        assert!(
            diff <= TOLERANCE,
            "|Δlogprob| {diff:e} after {} cached",
            on.cached_prompt_tokens
        );
    }
    let ids: Vec<_> = prompts.into_iter().map(|(_, ids)| ids).collect();
    let cached: Vec<u32> = on.iter().map(|r| r.cached_prompt_tokens).collect();
    check_reuse(&b, &ids, &cached);
}

#[test]
fn score_gives_the_same_logprobs_with_the_cache() {
    let b = backend();
    let prompts = coalitions(&b);
    let run = || -> Vec<_> {
        prompts
            .iter()
            .map(|(s, _)| b.score(s, REPLY).unwrap())
            .collect()
    };
    let off = run();
    cache(&b, true);
    let on = run();
    let mut worst = 0f32;
    for (off, on) in off.iter().zip(&on) {
        assert_eq!(on.token_ids, off.token_ids);
        worst = worst.max(max_abs_diff(&on.logprobs, &off.logprobs));
    }
    println!("score, cache on vs off: max |Δlogprob| = {worst:e}");
    assert!(worst <= TOLERANCE, "{worst:e}");
    let ids: Vec<_> = prompts.into_iter().map(|(_, ids)| ids).collect();
    let cached: Vec<u32> = on.iter().map(|r| r.cached_prompt_tokens).collect();
    check_reuse(&b, &ids, &cached);
}

#[test]
fn a_batch_scores_as_one_prompt_at_a_time_and_shares_prefixes_inside_it() {
    let b = backend();
    let prompts = coalitions(&b);
    let snapshots: Vec<ConversationSnapshot> = prompts.iter().map(|(s, _)| s.clone()).collect();
    let one_by_one: Vec<_> = snapshots
        .iter()
        .map(|s| b.score(s, REPLY).unwrap())
        .collect();
    let batched_off = b.score_batch(&snapshots, REPLY).unwrap();
    cache(&b, true);
    // From an empty cache: whatever is reused comes from earlier prompts of the same batch.
    let batched_on = b.score_batch(&snapshots, REPLY).unwrap();
    let mut worst = 0f32;
    for ((one, off), on) in one_by_one.iter().zip(&batched_off).zip(&batched_on) {
        assert_eq!(
            (&off.token_ids, &on.token_ids),
            (&one.token_ids, &one.token_ids)
        );
        assert_eq!(off.cached_prompt_tokens, 0);
        worst = worst
            .max(max_abs_diff(&off.logprobs, &one.logprobs))
            .max(max_abs_diff(&on.logprobs, &one.logprobs));
    }
    println!("score_batch vs score: max |Δlogprob| = {worst:e}");
    assert!(worst <= TOLERANCE, "{worst:e}");
    let ids: Vec<_> = prompts.into_iter().map(|(_, ids)| ids).collect();
    let cached: Vec<u32> = batched_on.iter().map(|r| r.cached_prompt_tokens).collect();
    // A batch-mate also offers its last prompt token and reply, so reuse can pass the
    // one-at-a-time figure, never fall short of it.
    for (got, least) in cached.iter().zip(expected_reuse(&ids)) {
        assert!(*got >= least, "{cached:?}");
    }
    let stats = b.stats();
    let total: u64 = cached.iter().map(|&c| u64::from(c)).sum();
    assert_eq!(stats.kv_cache_reused_tokens, total);
    assert_eq!(
        stats.kv_cache_hits + stats.kv_cache_misses,
        ids.len() as u64
    );
    assert_eq!(
        stats.kv_cache_misses, 1,
        "only the first prompt has no earlier one"
    );
}

#[test]
fn a_branch_run_from_a_shared_prefix_leaves_the_first_branch_intact() {
    let b = backend();
    let (a, other) = (coalition(0b00111), coalition(0b01011)); // share the first two messages
    let reference = b.score(&a, REPLY).unwrap();
    cache(&b, true);
    let first = b.score(&a, REPLY).unwrap();
    let branch = b.score(&other, REPLY).unwrap();
    let again = b.score(&a, REPLY).unwrap();
    assert_eq!(first.cached_prompt_tokens, 0);
    assert!(
        branch.cached_prompt_tokens > 0,
        "the branch starts from A's cropped prefix"
    );
    assert_eq!(again.cached_prompt_tokens, again.prompt_tokens - 1);
    assert!(max_abs_diff(&again.logprobs, &first.logprobs) <= TOLERANCE);
    assert!(max_abs_diff(&again.logprobs, &reference.logprobs) <= TOLERANCE);
    // Decoding grows a state taken from the cache too; A's entry must survive that as well.
    let config = GenerationConfig {
        max_new_tokens: 3,
        ..GenerationConfig::default()
    };
    b.generate(&other, &config).unwrap();
    let last = b.score(&a, REPLY).unwrap();
    assert!(max_abs_diff(&last.logprobs, &reference.logprobs) <= TOLERANCE);
}
