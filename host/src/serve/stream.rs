//! Server-sent events for `stream: true`, produced from a completed record.
//!
//! The plugin API returns whole records, so the stream is written at once: a role chunk, the
//! text in word-sized pieces (the first carries all logprobs), a chunk with the finish reason,
//! the usage chunk when asked for, and `[DONE]`. Clients read it exactly like a live stream.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use serde::Serialize;

use super::wire::{ChatChunk, ChoiceLogprobs, ChunkChoice, Delta, Usage};

pub struct ChatStream {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub text: String,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
    pub usage: Option<Usage>,
}

impl ChatStream {
    pub fn into_response(self) -> Response {
        let mut out = String::new();
        let chunk = |choices: Vec<ChunkChoice>, usage: Option<Usage>| ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        let choice = |delta, logprobs, finish_reason| ChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason,
        };
        let role = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
        };
        push(&mut out, &chunk(vec![choice(role, None, None)], None));
        let mut logprobs = self.logprobs;
        for piece in pieces(&self.text) {
            let delta = Delta {
                role: None,
                content: Some(piece.to_string()),
            };
            push(
                &mut out,
                &chunk(vec![choice(delta, logprobs.take(), None)], None),
            );
        }
        let last = choice(Delta::default(), logprobs.take(), Some(self.finish_reason));
        push(&mut out, &chunk(vec![last], None));
        if let Some(usage) = self.usage {
            push(&mut out, &chunk(Vec::new(), Some(usage)));
        }
        out.push_str("data: [DONE]\n\n");
        let mut response = Response::new(Body::from(out));
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }
}

fn push(out: &mut String, chunk: &impl Serialize) {
    // Serializing these plain structs cannot fail; an empty event would still be valid SSE.
    let json = serde_json::to_string(chunk).unwrap_or_default();
    out.push_str("data: ");
    out.push_str(&json);
    out.push_str("\n\n");
}

/// The text cut before each run of whitespace, so the pieces concatenate back to it.
fn pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut prev_space = false;
    for (i, c) in text.char_indices() {
        let space = c.is_whitespace();
        if space && !prev_space && i > start {
            pieces.push(&text[start..i]);
            start = i;
        }
        prev_space = space;
    }
    if start < text.len() {
        pieces.push(&text[start..]);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_concatenate_to_the_text() {
        for text in ["", "one", "one two  three", " lead\nnew line ", "é ü"] {
            assert_eq!(pieces(text).concat(), text);
        }
        assert_eq!(pieces("a b  c"), vec!["a", " b", "  c"]);
    }
}
