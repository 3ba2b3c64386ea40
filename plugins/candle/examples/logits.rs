//! Prints the logits of every position of some token ids on a model's f32 path, as JSON rows:
//! the reference other backends' tests hold their logits against (two plugin crates cannot be
//! linked into one test binary, so they run this instead).
//!
//! `logits MODEL 1,2,3` (MODEL: a `.gguf` file or a checkpoint directory).

use anyhow::Context;
use lmhost_candle::Candle;
use lmhost_plugin_api::serde_json::{self, json};
use lmhost_plugin_api::{Backend, PluginContext};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, ids] = args.as_slice() else {
        anyhow::bail!("usage: logits MODEL ID,ID,...");
    };
    let ids = ids
        .split(',')
        .map(|id| {
            id.parse::<u32>()
                .with_context(|| format!("not a token id: {id:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let context = PluginContext::new("candle", model).with_options(json!({ "weights": "f32" }));
    let rows = Candle::new(context)?.engine()?.logits_all(&ids)?;
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}
