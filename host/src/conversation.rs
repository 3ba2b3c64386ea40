//! Conversation files: JSON in, a `ConversationSnapshot` out.
//!
//! ```json
//! {"messages": [
//!   {"role": "system", "content": "You are terse."},
//!   {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
//! ]}
//! ```
//! A turn ends after each assistant message, so earlier exchanges become earlier turns.

use std::path::Path;

use lmhost_plugin_api::abi_stable::std_types::RVec;
use lmhost_plugin_api::{ConversationSnapshot, Message, Part, Role, Turn};
use serde::Deserialize;

use crate::error::{Error, Result};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConversationFile {
    messages: Vec<FileMessage>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMessage {
    role: Role,
    content: Content,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<FilePart>),
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum FilePart {
    Text { text: String },
}

/// Reads a conversation file.
pub fn load(path: &Path) -> Result<ConversationSnapshot> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)
}

/// Parses conversation JSON; `path` names the source in errors.
pub fn parse(text: &str, path: &Path) -> Result<ConversationSnapshot> {
    let invalid = |message: String| Error::Conversation {
        path: path.to_path_buf(),
        message,
    };
    let file: ConversationFile = serde_json::from_str(text).map_err(|e| {
        invalid(format!(
            "line {}, column {}: {e}; expected {{\"messages\": [{{\"role\": \"user\", \"content\": \"...\"}}]}}",
            e.line(),
            e.column()
        ))
    })?;
    if file.messages.is_empty() {
        return Err(invalid(
            "`messages` is empty; a conversation needs at least one message".into(),
        ));
    }
    let messages = file.messages.into_iter().map(|m| Message {
        role: m.role,
        parts: match m.content {
            Content::Text(text) => RVec::from(vec![Part::text(text)]),
            Content::Parts(parts) => parts
                .into_iter()
                .map(|FilePart::Text { text }| Part::text(text))
                .collect(),
        },
    });
    ConversationSnapshot::new(group_turns(messages)).map_err(|e| invalid(e.message.into_string()))
}

/// Splits messages into turns, closing a turn after each assistant message.
pub fn group_turns(messages: impl IntoIterator<Item = Message>) -> Vec<Turn> {
    let mut turns = Vec::new();
    let mut current = Vec::new();
    for message in messages {
        let closes = message.role == Role::Assistant;
        current.push(message);
        if closes {
            turns.push(Turn {
                messages: RVec::from(std::mem::take(&mut current)),
            });
        }
    }
    if !current.is_empty() {
        turns.push(Turn {
            messages: RVec::from(current),
        });
    }
    turns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<ConversationSnapshot> {
        parse(text, Path::new("c.json"))
    }

    #[test]
    fn strings_and_parts_both_parse_into_turns() {
        let snapshot = parse_str(
            r#"{"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}
            ]}"#,
        )
        .unwrap();
        assert_eq!(snapshot.turns.len(), 2);
        assert_eq!(snapshot.turns[0].messages.len(), 3);
        assert_eq!(snapshot.turns[1].messages[0].text_content(), "Bye");
    }

    #[test]
    fn errors_name_file_position_and_expected_shape() {
        let err =
            parse_str("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("c.json: line 1"), "{text}");
        assert!(text.contains("robot"), "{text}");
        let err = parse_str(r#"{"messages": []}"#).unwrap_err();
        assert!(err.to_string().contains("at least one message"), "{err}");
    }
}
