//! `lmhost generate`: one reply, as text or as the whole record in JSON.

use lmhost::Result;

use super::input::{open, print_json, PromptArgs};
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
    let (config, snapshot, backend) = open(&args.config, &args.input)?;
    let record = backend.generate(&snapshot, &config.generation)?;
    if args.json {
        print_json(&record)
    } else {
        println!("{}", record.text);
        Ok(())
    }
}
