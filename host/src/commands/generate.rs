//! `lmhost generate`: one reply, printed as it is generated, or the whole record in JSON.

use std::io::Write;

use lmhost::Result;

use super::input::{open, print_json, PromptArgs};
use super::ConfigArg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,

    #[command(flatten)]
    input: PromptArgs,

    /// Print the whole generation record as JSON (once it is complete).
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let (config, snapshot, backend) = open(&args.config, &args.input)?;
    if args.json {
        let record = backend.generate(&snapshot, &config.generation)?;
        return print_json(&record);
    }
    // Each token's text as it comes; a closed stdout (`| head`) stops generation.
    let mut out = std::io::stdout();
    backend.generate_stream(&snapshot, &config.generation, |delta| {
        out.write_all(delta.text.as_bytes())
            .and_then(|()| out.flush())
            .is_ok()
    })?;
    writeln!(out).ok();
    Ok(())
}
