//! A complete lmhost plugin: replies with the last message's words in reverse order.
//! Built as `liblmhost_echo.so` and selected with `kind = "echo"`.

use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::OptionKind::Bool;
use lmhost_plugin_api::{
    export_plugin, Backend, ConversationSnapshot, GenerationConfig, GenerationRecord, OptionSpec,
    PluginContext, PluginError, TokenDelta,
};

pub struct Echo {
    model_id: String,
    shout: bool,
}

impl Backend for Echo {
    const NAME: &'static str = "echo";
    const VERSION: &'static str = "0.1.0";

    fn options() -> Vec<OptionSpec> {
        vec![OptionSpec::new("shout", Bool, json!(false), "Capitals")]
    }

    fn new(context: PluginContext) -> Result<Self, PluginError> {
        let shout = context.options()?.get("shout").and_then(|v| v.as_bool());
        let (model_id, shout) = (context.model_id.into_string(), shout.unwrap_or(false));
        Ok(Echo { model_id, shout })
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    /// Makes the whole reply, then hands it over at once.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        let last = snapshot
            .messages()
            .last()
            .map(|m| m.text_content())
            .unwrap_or_default();
        let words = last
            .split_whitespace()
            .rev()
            .take(config.max_new_tokens as usize);
        let text = words.collect::<Vec<_>>().join(" ");
        let text = if self.shout {
            text.to_uppercase()
        } else {
            text
        };
        let record = GenerationRecord::from_text(text);
        sink(&TokenDelta::from(&record));
        Ok(record)
    }
}

export_plugin!(Echo);
