//! lmhost's plain chat format, the text form of a conversation on `/v1/completions`.
//!
//! A backend renders conversations with its own model's template, behind the plugin boundary, so
//! the server cannot know it. Text completions therefore use one fixed, published format, which
//! `/props` serves as a Jinja `chat_template` (as llama.cpp's server does) so that clients, such
//! as the `openai` plugin, render prompts the server can read back:
//!
//! ```text
//! <|system|>
//! You are terse.
//! <|user|>
//! Hi
//! <|assistant|>
//! Hello.
//! ```
//! Each message is its role marker on a line, then its content and a newline; a trailing
//! `<|assistant|>` marker opens the reply. Text without a leading marker is one user message.
//! A message whose content itself holds a marker line cannot be written in this format.

use lmhost_plugin_api::{Message, Role};

/// The format as a Hugging Face-style Jinja chat template.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}<|{{ message.role }}|>\n\
{{ message.content }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// A prompt read back: its messages and, when it ends in an assistant message, that reply.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub messages: Vec<Message>,
    /// The text after the last `<|assistant|>` marker; `Some("")` for an open reply.
    pub reply: Option<String>,
    /// Byte offset where `reply` starts in the prompt.
    pub reply_offset: usize,
}

const ROLES: [(Role, &str); 3] = [
    (Role::System, "<|system|>\n"),
    (Role::User, "<|user|>\n"),
    (Role::Assistant, "<|assistant|>\n"),
];

/// Splits a prompt into messages; a final assistant message becomes the reply.
pub fn parse(prompt: &str) -> Parsed {
    let markers = find_markers(prompt);
    if markers.first().map(|m| m.start) != Some(0) {
        return Parsed {
            messages: vec![Message::text(Role::User, prompt)],
            reply: None,
            reply_offset: prompt.len(),
        };
    }
    let mut messages = Vec::new();
    let mut reply = None;
    let mut reply_offset = prompt.len();
    for (i, marker) in markers.iter().enumerate() {
        match markers.get(i + 1) {
            Some(next) => {
                // The content ends with the newline before the next marker.
                let content = &prompt[marker.end..next.start - 1];
                messages.push(Message::text(marker.role, content));
            }
            None if marker.role == Role::Assistant => {
                reply = Some(prompt[marker.end..].to_string());
                reply_offset = marker.end;
            }
            None => {
                let content = &prompt[marker.end..];
                let content = content.strip_suffix('\n').unwrap_or(content);
                messages.push(Message::text(marker.role, content));
            }
        }
    }
    Parsed {
        messages,
        reply,
        reply_offset,
    }
}

struct Marker {
    role: Role,
    start: usize,
    end: usize,
}

/// Role markers at the start of the text or of a line.
fn find_markers(prompt: &str) -> Vec<Marker> {
    let mut found = Vec::new();
    let mut line_start = 0;
    for line in prompt.split_inclusive('\n') {
        if let Some((role, marker)) = ROLES.iter().find(|(_, m)| *m == line) {
            found.push(Marker {
                role: *role,
                start: line_start,
                end: line_start + marker.len(),
            });
        }
        line_start += line.len();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_reply_round_trip() {
        let prompt = "<|system|>\nBe brief.\n<|user|>\nHi\nthere\n<|assistant|>\nHello you";
        let parsed = parse(prompt);
        assert_eq!(
            parsed.messages,
            vec![
                Message::text(Role::System, "Be brief."),
                Message::text(Role::User, "Hi\nthere"),
            ]
        );
        assert_eq!(parsed.reply.as_deref(), Some("Hello you"));
        assert_eq!(&prompt[parsed.reply_offset..], "Hello you");
    }

    #[test]
    fn open_reply_and_plain_text() {
        let parsed = parse("<|user|>\nHi\n<|assistant|>\n");
        assert_eq!(parsed.messages, vec![Message::text(Role::User, "Hi")]);
        assert_eq!(parsed.reply.as_deref(), Some(""));
        let parsed = parse("just text <|user|>\n");
        assert_eq!(
            parsed.messages,
            vec![Message::text(Role::User, "just text <|user|>\n")]
        );
        assert_eq!(parsed.reply, None);
    }
}
