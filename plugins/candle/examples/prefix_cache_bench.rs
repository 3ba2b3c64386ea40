//! The prefix cache on a coalition workload, as `lmhost explain` produces it: an 8-message
//! conversation, every non-empty subset of its messages rendered with SmolLM2's chat template,
//! each scored against one fixed reply, in sorted prompt order. Cache off, then cache on, in one
//! run, both with one prompt per call and in batches of [`BATCH`] (`score_batch`, as explain
//! sends them). Prints figures; asserts nothing (timings depend on the machine).
//!
//! `cargo run --release --example prefix_cache_bench [MESSAGES] [WEIGHTS]`
//! (after `scripts/fetch-models`; MESSAGES defaults to 8, WEIGHTS to the backend's `auto`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Backend, ConversationSnapshot, KvCacheSettings, Message, PluginContext, Role, ScoreRecord, Turn,
};

const CONVERSATION: [(Role, &str); 8] = [
    (
        Role::System,
        "You are a friendly baking coach who answers briefly.",
    ),
    (
        Role::User,
        "I want to bake my first sourdough loaf this weekend.",
    ),
    (
        Role::Assistant,
        "Great choice. Is your starter active and bubbly yet?",
    ),
    (Role::User, "It doubles in about six hours after feeding."),
    (
        Role::Assistant,
        "That is strong enough. Feed it the night before baking.",
    ),
    (Role::User, "My kitchen is cold, around seventeen degrees."),
    (
        Role::Assistant,
        "Then expect a slower rise and let the dough proof longer.",
    ),
    (Role::User, "When should I start mixing the dough?"),
];
const REPLY: &str =
    "Mix it on Saturday morning and bake it on Sunday after a cold overnight proof.";

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// The conversation with the messages in `mask` kept, one message per turn.
fn coalition(messages: &[(Role, &str)], mask: u32) -> anyhow::Result<ConversationSnapshot> {
    let turns = messages
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, &(role, text))| Turn {
            messages: vec![Message::text(role, text)].into(),
        })
        .collect();
    Ok(ConversationSnapshot::new(turns)?)
}

/// Peak resident memory of this process so far (`VmHWM`), in MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Prompts per `score_batch` call in the batched runs.
const BATCH: usize = 32;

/// Scores every prompt, `batch` prompts per call.
fn score_all(
    b: &Candle,
    prompts: &[ConversationSnapshot],
    batch: usize,
) -> anyhow::Result<(Vec<ScoreRecord>, Duration)> {
    let start = Instant::now();
    let mut records = Vec::with_capacity(prompts.len());
    for chunk in prompts.chunks(batch) {
        match chunk {
            [one] => records.push(b.score(one, REPLY)?),
            many => records.extend(b.score_batch(many, REPLY)?),
        }
    }
    Ok((records, start.elapsed()))
}

fn set_cache(b: &Candle, enabled: bool) -> anyhow::Result<()> {
    b.set_kv_cache(KvCacheSettings {
        enabled,
        max_entries: 4096,
        max_bytes: 0,
    })?;
    Ok(())
}

/// One cache-off and one cache-on pass over the prompts, `batch` prompts per call.
fn compare(
    b: &Candle,
    prompts: &[ConversationSnapshot],
    total: usize,
    batch: usize,
    reference: Option<&[ScoreRecord]>,
) -> anyhow::Result<Vec<ScoreRecord>> {
    set_cache(b, false)?;
    let (off, off_time) = score_all(b, prompts, batch)?;
    let off_peak = peak_rss_mib();
    set_cache(b, true)?;
    let (on, on_time) = score_all(b, prompts, batch)?;
    let on_peak = peak_rss_mib();
    let stats = b.stats();
    let reference = reference.unwrap_or(&off);
    let drift = |records: &[ScoreRecord]| {
        reference
            .iter()
            .zip(records)
            .flat_map(|(a, b)| a.logprobs.iter().zip(b.logprobs.iter()))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    let reused: u64 = on.iter().map(|r| u64::from(r.cached_prompt_tokens)).sum();
    println!("\n{batch} prompt(s) per call:");
    println!(
        "  cache off: {:>7.1} s, {total} prompt tokens computed",
        off_time.as_secs_f64()
    );
    println!(
        "  cache on:  {:>7.1} s, {} prompt tokens computed, {reused} reused ({:.1}%)",
        on_time.as_secs_f64(),
        total as u64 - reused,
        100.0 * reused as f64 / total as f64
    );
    println!(
        "  hits {} / misses {} (hit rate {:.1}%), evictions {}",
        stats.kv_cache_hits,
        stats.kv_cache_misses,
        100.0 * stats.kv_cache_hits as f64 / (stats.kv_cache_hits + stats.kv_cache_misses) as f64,
        stats.kv_cache_evictions
    );
    println!(
        "  cache holds {:.1} MiB; peak RSS {off_peak:.0} MiB after cache off, {on_peak:.0} MiB \
         after cache on",
        stats.kv_cache_bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "  wall-time ratio off/on: {:.2}x; max |Δ logprob| vs one-per-call cache off: off {:.1e}, \
         on {:.1e}",
        off_time.as_secs_f64() / on_time.as_secs_f64(),
        drift(&off),
        drift(&on)
    );
    Ok(off)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(8)
        .clamp(1, 8);
    let weights = args.next().unwrap_or_else(|| "auto".into());
    let messages = &CONVERSATION[..n];
    let context = PluginContext::new("candle", &model_path().to_string_lossy())
        .with_options(json!({ "weights": weights }));
    let b = Candle::new(context)?;
    let engine = b.engine()?;

    let mut prompts = (1..1u32 << n)
        .map(|mask| {
            let snapshot = coalition(messages, mask)?;
            let ids = engine.front.prompt_ids(&snapshot, 0)?;
            Ok((ids, snapshot))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    prompts.sort_by(|a, b| a.0.cmp(&b.0));
    let total: usize = prompts.iter().map(|(ids, _)| ids.len()).sum();
    let prompts: Vec<_> = prompts.into_iter().map(|(_, s)| s).collect();
    println!(
        "SmolLM2-135M Q4_1 GGUF, weights={weights}, CPU; {} prompts (non-empty subsets of {n} \
         messages), {total} prompt tokens, one {}-token reply each",
        prompts.len(),
        engine.front.encode(REPLY, false)?.len()
    );

    let reference = compare(&b, &prompts, total, 1, None)?;
    compare(&b, &prompts, total, BATCH, Some(&reference))?;
    Ok(())
}
