//! `lmhost generate`: one reply, as text or as the whole record in JSON.

use lmhost::{Config, Host, Result};

use super::input::{print_json, PromptArgs};
use super::ConfigArg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,

    #[command(flatten)]
    input: PromptArgs,

    /// Print the whole generation record as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let config = Config::load(&args.config.config)?;
    let snapshot = args.input.snapshot()?;
    let backend = Host::new().open(&config)?;
    let record = backend.generate(&snapshot, &config.generation)?;
    if args.json {
        print_json(&record)
    } else {
        println!("{}", record.text);
        Ok(())
    }
}
