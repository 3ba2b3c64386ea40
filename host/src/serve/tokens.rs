//! `/tokenize` and `/detokenize`, answering both vLLM's and llama.cpp's clients: the request
//! may come in either shape, and the answer carries the fields each reads (`tokens` and
//! `count`; `prompt` and `content`).

use axum::Json;
use serde_json::{json, Value};

use super::body::JsonBody;
use super::error::ApiError;
use super::messages::chat_snapshot;
use super::state::Shared;
use super::wire::{DetokenizeRequest, TokenizeRequest};
use crate::ConversationSnapshot;

pub(super) async fn tokenize(
    state: Shared,
    JsonBody(request): JsonBody<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let state = state.0;
    if let Some(model) = &request.model {
        state.check_model(model)?;
    }
    if request.add_generation_prompt == Some(false) {
        return Err(ApiError::invalid(
            "add_generation_prompt",
            "backends tokenize a conversation as they run it, with the assistant's turn \
             opened; `add_generation_prompt` must be true",
        ));
    }
    // vLLM adds special tokens to a prompt unless told not to; llama.cpp only when asked.
    let (snapshot, add_special) = match (request.prompt, request.content, request.messages) {
        (Some(text), None, None) => (
            ConversationSnapshot::raw(text),
            request.add_special_tokens.unwrap_or(true),
        ),
        (None, Some(text), None) => (
            ConversationSnapshot::raw(text),
            request.add_special.unwrap_or(false),
        ),
        (None, None, Some(messages)) => (chat_snapshot(messages)?, true),
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "give exactly one of `prompt` (vLLM), `content` (llama.cpp) or `messages`",
            ))
        }
    };
    let backend = state.backend.clone();
    let record = state
        .queue
        .run(move || backend.tokenize(&snapshot, add_special))
        .await
        .map_err(|e| state.queue_error(e))??;
    let ids = record.token_ids.as_slice();
    let tokens = if request.with_pieces.unwrap_or(false) {
        ids.iter()
            .zip(record.pieces.iter())
            .map(|(id, piece)| json!({"id": id, "piece": piece.as_str()}))
            .collect()
    } else {
        json!(ids)
    };
    let token_strs = request
        .return_token_strs
        .unwrap_or(false)
        .then(|| json!(record.pieces));
    let mut answer = json!({
        "count": ids.len(),
        "tokens": tokens,
        "token_strs": token_strs,
    });
    if !record.images.is_empty() {
        answer["mm_token_type_ids"] = json!(record.mm_token_type_ids);
        answer["images"] = json!(record.images);
    }
    Ok(Json(answer))
}

pub(super) async fn detokenize(
    state: Shared,
    JsonBody(request): JsonBody<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    let state = state.0;
    if let Some(model) = &request.model {
        state.check_model(model)?;
    }
    let backend = state.backend.clone();
    let ids = request.tokens;
    let text = state
        .queue
        .run(move || backend.detokenize(&ids))
        .await
        .map_err(|e| state.queue_error(e))??;
    Ok(Json(json!({ "prompt": text, "content": text })))
}
