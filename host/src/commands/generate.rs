//! `lmhost generate`: one reply, as text or as the whole record in JSON.

use std::path::PathBuf;

use lmhost::{conversation, Config, ConversationSnapshot, Error, Host, Result};

use super::ConfigArg;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,

    /// A single user message.
    #[arg(
        short,
        long,
        conflicts_with = "conversation",
        required_unless_present = "conversation"
    )]
    prompt: Option<String>,

    /// A conversation file (JSON; see the README).
    #[arg(long, value_name = "FILE.json")]
    conversation: Option<PathBuf>,

    /// Print the whole generation record as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let config = Config::load(&args.config.config)?;
    let snapshot = match (&args.prompt, &args.conversation) {
        (Some(prompt), _) => ConversationSnapshot::from_prompt(prompt.as_str()),
        (None, Some(path)) => conversation::load(path)?,
        (None, None) => return Err(Error::Invalid("give --prompt or --conversation".into())),
    };
    let backend = Host::new().open(&config)?;
    let record = backend.generate(&snapshot, &config.generation)?;
    if args.json {
        let json =
            serde_json::to_string_pretty(&record).map_err(|e| Error::Invalid(e.to_string()))?;
        println!("{json}");
    } else {
        println!("{}", record.text);
    }
    Ok(())
}
