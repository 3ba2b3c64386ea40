//! `lmhost score`: the log-probability of a given reply, token by token (teacher-forced).

use lmhost::Result;
use serde_json::json;

use super::input::{open, print_json, PromptArgs};
use super::ConfigArg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,

    #[command(flatten)]
    input: PromptArgs,

    /// The reply to score, as the assistant's answer (or, with --raw, as the continuation).
    #[arg(long, value_name = "TEXT")]
    reply: String,

    /// Print the token ids, pieces and logprobs as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let (_, snapshot, backend) = open(&args.config, &args.input)?;
    let record = backend.score(&snapshot, &args.reply)?;
    // Pieces are a courtesy: a backend that cannot detokenize still scores.
    let pieces: Vec<Option<String>> = record
        .token_ids
        .iter()
        .map(|&id| backend.detokenize(&[id]).ok())
        .collect();
    if args.json {
        return print_json(&json!({
            "total_logprob": record.total_logprob(),
            "token_ids": record.token_ids,
            "pieces": pieces,
            "logprobs": record.logprobs,
            "prompt_tokens": record.prompt_tokens,
            "cached_prompt_tokens": record.cached_prompt_tokens,
        }));
    }
    for ((id, logprob), piece) in record.token_ids.iter().zip(&record.logprobs).zip(&pieces) {
        let piece = piece
            .as_deref()
            .map(|p| format!("{p:?}"))
            .unwrap_or_default();
        println!("{id:>8} {logprob:>10.4} {piece}");
    }
    println!(
        "total logprob {:.4} over {} tokens (prompt {} tokens, {} from the cache)",
        record.total_logprob(),
        record.token_ids.len(),
        record.prompt_tokens,
        record.cached_prompt_tokens
    );
    Ok(())
}
