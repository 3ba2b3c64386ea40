//! One module per subcommand; each turns parsed arguments into library calls.

mod explain;
mod generate;
mod input;
mod plugins;
mod score;
mod serve;
mod tokenize;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use lmhost::Result;

#[derive(Parser)]
#[command(
    name = "lmhost",
    version,
    about = "Run and explain LLM generation backends loaded as plugins"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace); also shows ABI layout reports.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Only errors; no progress bars.
    #[arg(short, long, global = true)]
    pub quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every plugin found, with its options.
    Plugins(plugins::Args),
    /// Generate a reply to a prompt or a conversation file.
    Generate(generate::Args),
    /// Log-probability of a given reply, token by token (teacher-forced).
    Score(score::Args),
    /// The token ids the model reads for a prompt.
    Tokenize(tokenize::TokenizeArgs),
    /// The text of token ids.
    Detokenize(tokenize::DetokenizeArgs),
    /// Attribute the model's answer to the parts of a conversation (Shapley values).
    Explain(Box<explain::Args>),
    /// Serve the backend over an OpenAI-compatible HTTP API.
    Serve(serve::Args),
}

pub fn run(cli: &Cli) -> Result<()> {
    match &cli.command {
        Command::Plugins(args) => plugins::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Score(args) => score::run(args),
        Command::Tokenize(args) => tokenize::tokenize(args),
        Command::Detokenize(args) => tokenize::detokenize(args),
        Command::Explain(args) => explain::run(args, cli.quiet),
        Command::Serve(args) => serve::run(args),
    }
}

/// `--config FILE`, shared by the commands that open a backend.
#[derive(clap::Args)]
struct ConfigArg {
    /// The TOML config naming the backend.
    #[arg(short, long, value_name = "FILE")]
    config: PathBuf,
}
