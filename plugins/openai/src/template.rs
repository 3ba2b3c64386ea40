//! Rendering a conversation to the model's prompt text, for scoring through text endpoints.
//!
//! Chat endpoints render prompts on the server, but prompt logprobs come from text endpoints
//! (`/v1/completions` with `echo`, SGLang's `/generate`), so the plugin must write the exact
//! prompt the model's chat template would. The template comes from the `chat_template` option
//! (a Jinja file, or a Hugging Face `tokenizer_config.json`) or from the server's `/props`
//! (llama.cpp's server and `lmhost serve` publish it there).

use std::path::Path;

use lmhost_plugin_api::serde_json::Value;
use lmhost_plugin_api::{Message, PluginError};
use minijinja::value::Value as JinjaValue;
use minijinja::{context, Environment, Error as JinjaError, ErrorKind as JinjaErrorKind};

pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    /// Where it came from, for error messages.
    origin: String,
}

impl ChatTemplate {
    pub fn new(source: String, origin: impl Into<String>) -> Self {
        ChatTemplate {
            source,
            bos_token: String::new(),
            eos_token: String::new(),
            origin: origin.into(),
        }
    }

    /// A Jinja file, or a `tokenizer_config.json` holding `chat_template` and the special tokens.
    pub fn from_file(path: &Path) -> Result<Self, PluginError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            PluginError::config(format!(
                "option `chat_template`: cannot read {}: {e}",
                path.display()
            ))
        })?;
        let origin = path.display().to_string();
        if path.extension().is_some_and(|e| e == "json") {
            let json: Value = lmhost_plugin_api::serde_json::from_str(&text).map_err(|e| {
                PluginError::config(format!("option `chat_template`: {origin}: {e}"))
            })?;
            Self::from_json(&json, origin)
        } else {
            Ok(Self::new(text, origin))
        }
    }

    /// From a `tokenizer_config.json` or a server's `/props` answer.
    pub fn from_json(json: &Value, origin: String) -> Result<Self, PluginError> {
        let source = match json.get("chat_template") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            // Several named templates: the one named "default".
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| {
                    PluginError::config(format!("{origin}: no chat template named \"default\""))
                })?,
            _ => {
                return Err(PluginError::config(format!(
                    "{origin} holds no `chat_template`"
                )))
            }
        };
        let token = |key: &str| match json.get(key) {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            None => String::new(),
        };
        Ok(ChatTemplate {
            source,
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            origin,
        })
    }

    /// The prompt for `messages`, with the assistant's turn opened when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[&Message],
        add_generation_prompt: bool,
    ) -> Result<String, PluginError> {
        let mut env = Environment::new();
        env.add_function(
            "raise_exception",
            |message: String| -> Result<(), JinjaError> {
                Err(JinjaError::new(JinjaErrorKind::InvalidOperation, message))
            },
        );
        env.set_unknown_method_callback(python_methods);
        let failed = |e: JinjaError| {
            PluginError::config(format!("chat template from {}: {e:#}", self.origin))
        };
        let template = env.template_from_str(&self.source).map_err(failed)?;
        let messages: Vec<JinjaValue> = messages
            .iter()
            .map(|m| {
                JinjaValue::from_serialize(lmhost_plugin_api::serde_json::json!({
                    "role": m.role.as_str(),
                    "content": m.text_content(),
                }))
            })
            .collect();
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(failed)
    }
}

/// The few Python string methods chat templates call (`content.strip()` and friends).
fn python_methods(
    _: &minijinja::State,
    value: &JinjaValue,
    method: &str,
    args: &[JinjaValue],
) -> Result<JinjaValue, JinjaError> {
    let Some(s) = value.as_str() else {
        return Err(JinjaError::from(JinjaErrorKind::UnknownMethod));
    };
    let arg = |i: usize| args.get(i).and_then(|a| a.as_str()).unwrap_or("");
    Ok(match method {
        "strip" => JinjaValue::from(s.trim()),
        "lstrip" => JinjaValue::from(s.trim_start()),
        "rstrip" => JinjaValue::from(s.trim_end()),
        "startswith" => JinjaValue::from(s.starts_with(arg(0))),
        "endswith" => JinjaValue::from(s.ends_with(arg(0))),
        "upper" => JinjaValue::from(s.to_uppercase()),
        "lower" => JinjaValue::from(s.to_lowercase()),
        _ => return Err(JinjaError::from(JinjaErrorKind::UnknownMethod)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::serde_json::json;
    use lmhost_plugin_api::Role;

    #[test]
    fn renders_a_hugging_face_style_template() {
        let config = json!({
            "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content.strip() }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
            "bos_token": "<s>",
            "eos_token": {"content": "</s>"},
        });
        let template = ChatTemplate::from_json(&config, "test".into()).unwrap();
        let (sys, user) = (
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, " Hi "),
        );
        let text = template.render(&[&sys, &user], true).unwrap();
        assert_eq!(text, "<s><system>Be brief.</s><user>Hi</s><assistant>");
    }

    #[test]
    fn template_errors_name_the_source() {
        let template = ChatTemplate::new(
            "{{ raise_exception('roles must alternate') }}".into(),
            "tpl.jinja",
        );
        let err = template
            .render(&[&Message::text(Role::User, "x")], true)
            .unwrap_err();
        assert!(err.message.contains("tpl.jinja"), "{err}");
        assert!(err.message.contains("roles must alternate"), "{err}");
    }
}
