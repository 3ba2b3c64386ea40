//! The prompt a command runs on: one message, raw text, or a conversation file.

use std::path::PathBuf;

use lmhost::{conversation, Backend, Config, ConversationSnapshot, Host, Result};

use super::ConfigArg;

#[derive(clap::Args)]
pub struct PromptArgs {
    /// A single user message (with --raw: raw text).
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

    /// Send --prompt to the model verbatim, with no chat template (base models, raw
    /// continuations).
    #[arg(long, requires = "prompt")]
    raw: bool,
}

impl PromptArgs {
    pub fn snapshot(&self) -> Result<ConversationSnapshot> {
        match (&self.prompt, &self.conversation) {
            (Some(prompt), _) if self.raw => Ok(ConversationSnapshot::raw(prompt.as_str())),
            (Some(prompt), _) => Ok(ConversationSnapshot::from_prompt(prompt.as_str())),
            (None, Some(path)) => conversation::load(path),
            (None, None) => Err(lmhost::Error::Invalid(
                "give --prompt or --conversation".into(),
            )),
        }
    }
}

/// The config, the prompt and the backend it names, in the order their errors are best met.
pub fn open(
    config: &ConfigArg,
    input: &PromptArgs,
) -> Result<(Config, ConversationSnapshot, Backend)> {
    let config = Config::load(&config.config)?;
    let snapshot = input.snapshot()?;
    let backend = Host::new().open(&config)?;
    Ok((config, snapshot, backend))
}

/// Pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let json =
        serde_json::to_string_pretty(value).map_err(|e| lmhost::Error::Invalid(e.to_string()))?;
    println!("{json}");
    Ok(())
}
