//! An application with lmhost inside: candle linked in-process (the `candle` feature), so no
//! plugin library is needed. It explains a conversation file's answer and prints each player's
//! share, with progress as it goes.
//!
//! cargo run -p lmhost --features candle --example embed -- configs/default.toml examples/conversation.json

use std::sync::Arc;

use lmhost::{conversation, Config, Host, Progress, RunOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(config), Some(chat)) = (args.next(), args.next()) else {
        return Err("usage: embed CONFIG.toml CONVERSATION.json".into());
    };
    let config = Config::load(config.as_ref())?;
    let backend = Host::new().open(&config)?;
    let chat = conversation::load(chat.as_ref())?;
    let options = RunOptions {
        on_progress: Some(Arc::new(|p: &Progress| {
            eprint!("\r{}/{}", p.done, p.planned)
        })),
        ..RunOptions::default()
    };
    let outcome = lmhost::explain_run::run(&config, &backend, &chat, &options)?;
    println!("\nanswer: {}", outcome.reply);
    for a in &outcome.explanation.attributions {
        println!("{:>+9.4}  {}", a.value, a.player.text);
    }
    Ok(())
}
