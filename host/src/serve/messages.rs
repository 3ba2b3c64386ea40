//! A chat request's `messages` as the conversation the backend takes.

use lmhost_plugin_api::{Message, Part, Role};

use super::error::ApiError;
use super::wire::{ChatMessage, Content, ContentPart, WireRole};
use crate::conversation::group_turns;
use crate::ConversationSnapshot;

/// The conversation of a chat request's `messages`.
pub(super) fn chat_snapshot(messages: Vec<ChatMessage>) -> Result<ConversationSnapshot, ApiError> {
    let messages: Vec<Message> = messages
        .into_iter()
        .map(|m| Message {
            role: match m.role {
                WireRole::System | WireRole::Developer => Role::System,
                WireRole::User => Role::User,
                WireRole::Assistant => Role::Assistant,
            },
            parts: match m.content {
                Content::Text(text) => vec![Part::text(text)].into(),
                Content::Parts(parts) => parts
                    .into_iter()
                    .map(|ContentPart::Text { text }| Part::text(text))
                    .collect(),
            },
        })
        .collect();
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` holds no message; at least one is needed",
        ));
    }
    ConversationSnapshot::new(group_turns(messages))
        .map_err(|e| ApiError::invalid("messages", e.message.into_string()))
}
