//! Turning a conversation into prompt text: the model's chat template (Jinja, rendered with
//! minijinja, generation prompt added), or `role: content` lines when the model has none.

use lmhost_plugin_api::{ConversationSnapshot, PluginError};
use minijinja::{context, Environment, Error, ErrorKind};

/// A chat template ready to render.
pub struct ChatTemplate {
    env: Environment<'static>,
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

impl ChatTemplate {
    /// Compiles `source`; the error says where the template is wrong.
    pub fn new(source: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| format!("chat template does not compile: {e}"))?;
        Ok(ChatTemplate { env })
    }

    pub fn render(
        &self,
        messages: &[(String, String)],
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String, PluginError> {
        let messages: Vec<_> = messages
            .iter()
            .map(|(role, content)| context! { role => role, content => content })
            .collect();
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| PluginError::internal(format!("chat template: {e}")))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => bos_token.unwrap_or(""),
                eos_token => eos_token.unwrap_or(""),
            })
            .map_err(|e| PluginError::invalid_input(format!("chat template: {e}")))
    }
}

/// The conversation's text messages as (role, content) pairs; audio is refused.
pub fn messages(snapshot: &ConversationSnapshot) -> Result<Vec<(String, String)>, PluginError> {
    if snapshot.has_audio() {
        return Err(PluginError::unsupported(
            "the candle backend runs text models; this conversation has audio",
        ));
    }
    Ok(snapshot
        .messages()
        .map(|m| (m.role.as_str().to_string(), m.text_content()))
        .collect())
}

/// Without a template: one `role: content` line per message, then `assistant:`.
pub fn fallback(messages: &[(String, String)]) -> String {
    let mut text: String = messages
        .iter()
        .map(|(role, content)| format!("{role}: {content}\n"))
        .collect();
    text.push_str("assistant:");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_generation_prompt() {
        let t = ChatTemplate::new(CHATML).unwrap();
        let text = t
            .render(&[("user".into(), "Hi?".into())], None, None)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn template_errors_are_reported() {
        assert!(ChatTemplate::new("{% for %}").is_err());
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        let err = t.render(&[], None, None).unwrap_err();
        assert!(err.message.contains("no system role"), "{err}");
    }

    #[test]
    fn fallback_lists_roles() {
        let text = fallback(&[
            ("system".into(), "Be brief.".into()),
            ("user".into(), "Hi".into()),
        ]);
        assert_eq!(text, "system: Be brief.\nuser: Hi\nassistant:");
    }
}
