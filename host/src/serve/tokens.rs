//! `/tokenize` and `/detokenize`, answering both vLLM's and llama.cpp's clients: the request
//! may come in either shape, and the answer carries the fields each reads (`tokens` and
//! `count`; `prompt` and `content`).

use axum::Json;

use super::body::JsonBody;
use super::error::ApiError;
use super::messages::chat_snapshot;
use super::state::Shared;
use super::wire::{
    DetokenizeRequest, Detokenized, ImageTokenCount, TokenList, TokenPiece, TokenizeRequest,
    Tokenized,
};
use crate::ConversationSnapshot;

/// Tokenizes a prompt, or a conversation through the model's chat template.
#[utoipa::path(post, path = "/tokenize", request_body = TokenizeRequest,
    responses((status = 200, description = "The token ids", body = Tokenized)))]
pub(super) async fn tokenize(
    state: Shared,
    JsonBody(request): JsonBody<TokenizeRequest>,
) -> Result<Json<Tokenized>, ApiError> {
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
    let (field, snapshot, add_special) = match (request.prompt, request.content, request.messages) {
        (Some(text), None, None) => (
            "prompt",
            ConversationSnapshot::raw(text),
            request.add_special_tokens.unwrap_or(true),
        ),
        (None, Some(text), None) => (
            "content",
            ConversationSnapshot::raw(text),
            request.add_special.unwrap_or(false),
        ),
        (None, None, Some(messages)) => {
            let tools = request.tools.as_deref().unwrap_or_default();
            let documents = request.documents.as_deref().unwrap_or_default();
            ("messages", chat_snapshot(messages, tools, documents)?, true)
        }
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
        .map_err(|e| state.queue_error(e))?
        .map_err(|e| ApiError::from(e).about(field))?;
    let ids = record.token_ids.into_vec();
    let count = ids.len();
    let pieces: Vec<String> = record.pieces.into_iter().map(String::from).collect();
    let tokens = if request.with_pieces.unwrap_or(false) {
        TokenList::Pieces(
            ids.iter()
                .zip(&pieces)
                .map(|(&id, piece)| TokenPiece {
                    id,
                    piece: piece.clone(),
                })
                .collect(),
        )
    } else {
        TokenList::Ids(ids)
    };
    let has_images = !record.images.is_empty();
    Ok(Json(Tokenized {
        count,
        tokens,
        token_strs: request.return_token_strs.unwrap_or(false).then_some(pieces),
        mm_token_type_ids: has_images.then(|| record.mm_token_type_ids.into_vec()),
        images: has_images.then(|| {
            record
                .images
                .iter()
                .map(|image| ImageTokenCount {
                    tokens: image.tokens,
                    patches: image.patches,
                })
                .collect()
        }),
    }))
}

/// Turns token ids back into text.
#[utoipa::path(post, path = "/detokenize", request_body = DetokenizeRequest,
    responses((status = 200, description = "The text", body = Detokenized)))]
pub(super) async fn detokenize(
    state: Shared,
    JsonBody(request): JsonBody<DetokenizeRequest>,
) -> Result<Json<Detokenized>, ApiError> {
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
        .map_err(|e| state.queue_error(e))?
        .map_err(|e| ApiError::from(e).about("tokens"))?;
    Ok(Json(Detokenized {
        prompt: text.clone(),
        content: text,
    }))
}
