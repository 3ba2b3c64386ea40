//! Server-sent events for `stream: true`, written as the backend hands out tokens: a role chunk,
//! a chunk per token delta (with its logprobs when asked), a chunk with the finish reason, the
//! usage chunk when asked for, and `[DONE]`. A backend that does not stream hands over its whole
//! reply as one delta. A client that goes away drops the stream, and the generation stops at
//! its next token (see [`super::generate::Generation`]).

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use lmhost_plugin_api::{GenerationRecord, TokenDelta};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::ApiError;
use super::wire::{
    finish_reason, ChatChunk, ChoiceLogprobs, ChunkChoice, Delta, TokenLogprob, Usage,
};

/// What a generation sends its stream: deltas, then how it ended.
pub enum Event {
    Delta(TokenDelta),
    Done(Result<GenerationRecord, ApiError>),
}

pub struct ChatStream {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub logprobs: bool,
    pub include_usage: bool,
    /// The first event, already received (a failure before it is an HTTP error instead).
    pub first: Event,
    pub events: UnboundedReceiver<Event>,
}

/// Where a stream is: the role chunk still to send, then events, then the end.
enum State {
    Start(Box<ChatStream>),
    Events(Box<ChatStream>),
    Finished,
}

impl ChatStream {
    pub fn into_response(self) -> Response {
        let chunks = futures_util::stream::unfold(State::Start(Box::new(self)), next);
        let mut response = Response::new(Body::from_stream(chunks));
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<super::wire::Usage>) -> String {
        event(&ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn choice(
        delta: Delta,
        logprobs: Option<ChoiceLogprobs>,
        finish: Option<&'static str>,
    ) -> ChunkChoice {
        ChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason: finish,
        }
    }

    /// The SSE text of one event.
    fn render(&self, event: Event) -> (String, bool) {
        match event {
            Event::Delta(delta) => {
                let logprobs = self.logprobs.then(|| ChoiceLogprobs {
                    content: delta
                        .token_ids
                        .iter()
                        .zip(delta.logprobs.iter())
                        .map(|(&id, &lp)| TokenLogprob::new(id, lp))
                        .collect(),
                });
                let content = Delta {
                    role: None,
                    content: Some(delta.text.into_string()),
                };
                (
                    self.chunk(vec![Self::choice(content, logprobs, None)], None),
                    false,
                )
            }
            Event::Done(Ok(record)) => {
                let reason = finish_reason(record.finish_reason);
                let mut out = self.chunk(
                    vec![Self::choice(Delta::default(), None, Some(reason))],
                    None,
                );
                if self.include_usage {
                    out += &self.chunk(Vec::new(), Some(Usage::of(&record)));
                }
                out.push_str("data: [DONE]\n\n");
                (out, true)
            }
            // Headers are sent: the error goes in the stream, as OpenAI's servers do.
            Event::Done(Err(e)) => (e.event(), true),
        }
    }
}

async fn next(state: State) -> Option<(Result<Bytes, std::convert::Infallible>, State)> {
    match state {
        State::Start(mut stream) => {
            let role = Delta {
                role: Some("assistant"),
                content: Some(String::new()),
            };
            let mut out = stream.chunk(vec![ChatStream::choice(role, None, None)], None);
            let first = std::mem::replace(&mut stream.first, Event::Delta(TokenDelta::default()));
            let (text, done) = stream.render(first);
            out += &text;
            let state = if done {
                State::Finished
            } else {
                State::Events(stream)
            };
            Some((Ok(Bytes::from(out)), state))
        }
        State::Events(mut stream) => {
            let event = stream.events.recv().await.unwrap_or_else(|| {
                Event::Done(Err(ApiError::internal(
                    "the generation ended without a result",
                )))
            });
            let (text, done) = stream.render(event);
            let state = if done {
                State::Finished
            } else {
                State::Events(stream)
            };
            Some((Ok(Bytes::from(text)), state))
        }
        State::Finished => None,
    }
}

fn event(chunk: &impl Serialize) -> String {
    // Serializing these plain structs cannot fail; an empty event would still be valid SSE.
    let json = serde_json::to_string(chunk).unwrap_or_default();
    format!("data: {json}\n\n")
}
