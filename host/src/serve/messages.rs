//! A chat request's `messages` as the conversation the backend takes: text, and images sent
//! inline as `data:` URLs (lmhost does not fetch).

use std::path::Path;

use lmhost_plugin_api::{Grounding, Image, Message, Part, Role};
use serde_json::value::RawValue;

use super::error::ApiError;
use super::wire::{ChatMessage, Content, ContentPart, WireRole};
use crate::conversation::{group_turns, json_texts, tool_message};
use crate::{images, ConversationSnapshot, Error};

/// The conversation of a chat request's `messages`, `tools` and `documents`.
pub(super) fn chat_snapshot(
    messages: Vec<ChatMessage>,
    tools: &[Box<RawValue>],
    documents: &[Box<RawValue>],
) -> Result<ConversationSnapshot, ApiError> {
    let messages = (messages.into_iter().enumerate())
        .map(|(i, m)| {
            let role = match m.role {
                WireRole::System | WireRole::Developer => Role::System,
                WireRole::User => Role::User,
                WireRole::Assistant => Role::Assistant,
                WireRole::Tool => Role::Tool,
            };
            let parts = match m.content {
                None if m.tool_calls.is_empty() => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content"),
                        format!(
                            "`messages[{i}].content` is missing; only an assistant message \
                             with `tool_calls` may leave it out"
                        ),
                    ))
                }
                None => Vec::new(),
                Some(Content::Text(text)) => vec![Part::text(text)],
                Some(Content::Parts(parts)) => (parts.into_iter().enumerate())
                    .map(|(j, part)| match part {
                        ContentPart::Text { text } => Ok(Part::text(text)),
                        ContentPart::ImageUrl { image_url } => {
                            let field = format!("messages[{i}].content[{j}].image_url.url");
                            let image = image_of(&image_url.url, &field)?;
                            Ok(Part::Image { image })
                        }
                    })
                    .collect::<Result<_, ApiError>>()?,
            };
            Ok(tool_message(role, parts, m.tool_calls, m.tool_call_id))
        })
        .collect::<Result<Vec<Message>, ApiError>>()?;
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` holds no message; at least one is needed",
        ));
    }
    let grounding = Grounding {
        tools: json_texts(tools),
        documents: json_texts(documents),
    };
    ConversationSnapshot::grounded(group_turns(messages), grounding)
        .map_err(|e| ApiError::invalid("messages", e.message.into_string()))
}

/// The image a `data:image/...;base64,` URL holds; any other URL is refused, naming `field`.
fn image_of(url: &str, field: &str) -> Result<Image, ApiError> {
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") {
        return Err(ApiError::invalid(
            field,
            format!(
                "`{field}` is an {scheme} URL; lmhost does not fetch images: send the image \
                 inline as a data URL (data:image/png;base64,...)"
            ),
        ));
    }
    let data = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .map(|(_, data)| data);
    let Some(data) = data else {
        return Err(ApiError::invalid(
            field,
            format!("`{field}` must be a data URL: data:image/png;base64,... (or jpeg, webp, gif)"),
        ));
    };
    images::decode_base64(data, Path::new("request"), field).map_err(|e| match e {
        Error::Image { message, .. } => ApiError::invalid(field, message),
        e => ApiError::invalid(field, e.to_string()),
    })
}
