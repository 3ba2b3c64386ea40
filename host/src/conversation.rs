//! Conversation files: JSON in, a `ConversationSnapshot` out.
//!
//! ```json
//! {"messages": [
//!   {"role": "system", "content": "You are terse."},
//!   {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
//! ]}
//! ```
//! A turn ends after each assistant message, so earlier exchanges become earlier turns.
//!
//! Audio parts name a WAV file relative to the conversation file, or carry base64 PCM inline
//! (see [`crate::audio`] for the formats):
//! ```json
//! {"type": "audio", "path": "clip.wav"}
//! {"type": "audio", "pcm_base64": "AAD/fw==", "sample_rate": 16000}
//! {"type": "audio", "pcm_base64": "...", "sample_rate": 48000, "format": "f32le", "channels": 2}
//! ```

use std::path::Path;

use lmhost_plugin_api::abi_stable::std_types::RVec;
use lmhost_plugin_api::{ConversationSnapshot, Message, Part, Role, Turn};
use serde::Deserialize;

use crate::audio;
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
    Text {
        text: String,
    },
    Audio {
        path: Option<String>,
        pcm_base64: Option<String>,
        sample_rate: Option<u32>,
        format: Option<String>,
        channels: Option<u16>,
    },
}

impl FilePart {
    /// The part for a backend; audio is decoded, `path` is relative to `base`.
    fn into_part(self, base: &Path, source: &Path) -> Result<Part> {
        let invalid = |message: &str| Error::Conversation {
            path: source.to_path_buf(),
            message: message.into(),
        };
        match self {
            FilePart::Text { text } => Ok(Part::text(text)),
            FilePart::Audio {
                path: Some(file),
                pcm_base64: None,
                sample_rate: None,
                format: None,
                channels: None,
            } => Ok(Part::Audio {
                audio: audio::read_wav(&base.join(file))?,
            }),
            FilePart::Audio {
                path: None,
                pcm_base64: Some(data),
                sample_rate: Some(rate),
                format,
                channels,
            } => Ok(Part::Audio {
                audio: audio::decode_pcm_base64(
                    &data,
                    rate,
                    format.as_deref().unwrap_or("s16le"),
                    channels.unwrap_or(1),
                    source,
                )?,
            }),
            FilePart::Audio { path: Some(_), .. } => Err(invalid(
                "an audio part with `path` takes no other field; `sample_rate`, `format` and \
                 `channels` come from the WAV file",
            )),
            FilePart::Audio {
                pcm_base64: Some(_),
                ..
            } => Err(invalid(
                "an audio part with `pcm_base64` needs `sample_rate` (Hz); `format` \
                 (\"s16le\" or \"f32le\", default \"s16le\") and `channels` (default 1) are optional",
            )),
            FilePart::Audio { .. } => Err(invalid(
                "an audio part needs `path` (a WAV file relative to this file) or `pcm_base64` \
                 with `sample_rate`",
            )),
        }
    }
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
    let base = path.parent().unwrap_or(Path::new("."));
    let messages = file
        .messages
        .into_iter()
        .map(|m| {
            let parts = match m.content {
                Content::Text(text) => RVec::from(vec![Part::text(text)]),
                Content::Parts(parts) => parts
                    .into_iter()
                    .map(|p| p.into_part(base, path))
                    .collect::<Result<RVec<Part>>>()?,
            };
            Ok(Message {
                role: m.role,
                parts,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    ConversationSnapshot::new(group_turns(messages)).map_err(|e| invalid(e.message.into_string()))
}

/// A conversation of `messages`, in turns as [`group_turns`] splits them.
pub fn from_messages(messages: impl IntoIterator<Item = Message>) -> Result<ConversationSnapshot> {
    ConversationSnapshot::new(group_turns(messages))
        .map_err(|e| Error::Invalid(e.message.into_string()))
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
