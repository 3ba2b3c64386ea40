//! `echo` on `/v1/completions`: the prompt's own tokens with their logprobs, as vLLM answers it.
//! The prompt is raw text; its first token has no logprob (nothing precedes it), every later
//! token is scored teacher-forced. A client that wants a reply's logprobs sends prompt + reply
//! and reads the tokens past the prompt's.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Json;
use lmhost_plugin_api::{ScoreRecord, TokenizeRecord};

use super::error::ApiError;
use super::state::{now, AppState};
use super::wire::{Completion, CompletionChoice, CompletionLogprobs, Usage};
use crate::{Backend, ConversationSnapshot};

pub(super) async fn respond(
    state: &Arc<AppState>,
    prompt: String,
    with_logprobs: bool,
) -> Result<Response, ApiError> {
    let backend = state.backend.clone();
    let text = prompt.clone();
    let (tokens, record) = state
        .queue
        .run(move || score_prompt(&backend, &text))
        .await
        .map_err(|e| state.queue_error(e))??;
    let pieces: Vec<&str> = tokens.pieces.iter().map(|p| p.as_str()).collect();
    let logprobs = std::iter::once(None).chain(record.logprobs.iter().map(|&l| Some(l)));
    let logprobs = with_logprobs.then(|| token_logprobs(&tokens.token_ids, &pieces, logprobs));
    let count = tokens.token_ids.len() as u32;
    Ok(completion(
        state,
        prompt,
        count,
        logprobs,
        record.cached_prompt_tokens,
    ))
}

/// `echo` of a prompt given as token ids: scored as given, its prefix served from the
/// backend's cache (see [`super::score`]).
pub(super) async fn respond_ids(
    state: &Arc<AppState>,
    ids: Vec<u32>,
    with_logprobs: bool,
) -> Result<Response, ApiError> {
    let backend = state.backend.clone();
    let given = ids.clone();
    let (text, pieces, logprobs, cached) = state
        .queue
        .run(move || -> Result<_, ApiError> {
            let piece = |id: &u32| backend.detokenize(std::slice::from_ref(id));
            let pieces = given.iter().map(piece).collect::<Result<Vec<_>, _>>()?;
            let text = backend.detokenize(&given)?;
            let (logprobs, cached) = super::score::score_all(&backend, given)?;
            Ok((text, pieces, logprobs, cached))
        })
        .await
        .map_err(|e| state.queue_error(e))??;
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let logprobs = with_logprobs.then(|| token_logprobs(&ids, &pieces, logprobs.into_iter()));
    Ok(completion(state, text, ids.len() as u32, logprobs, cached))
}

/// The echo answer: the prompt's text, no completion tokens.
fn completion(
    state: &AppState,
    text: String,
    prompt_tokens: u32,
    logprobs: Option<CompletionLogprobs>,
    cached: u32,
) -> Response {
    state.metrics.record_tokens(prompt_tokens, 0, cached);
    Json(Completion {
        id: state.next_id("cmpl"),
        object: "text_completion",
        created: now(),
        model: state.model.clone(),
        choices: vec![CompletionChoice {
            index: 0,
            text,
            logprobs,
            finish_reason: "length",
        }],
        usage: Usage::new(prompt_tokens, 0, cached),
    })
    .into_response()
}

/// The prompt's tokens (as the text alone tokenizes) and the score of all but the first: the
/// text of the first token is the prompt, the rest of the text its continuation.
fn score_prompt(
    backend: &Backend,
    prompt: &str,
) -> Result<(TokenizeRecord, ScoreRecord), ApiError> {
    let tokens = backend.tokenize(&ConversationSnapshot::raw(prompt), false)?;
    let Some(first) = tokens.pieces.first() else {
        return Err(ApiError::invalid(
            "prompt",
            "`prompt` has no tokens; echo needs at least one",
        ));
    };
    let rest = prompt.strip_prefix(first.as_str()).ok_or_else(|| {
        ApiError::invalid(
            "prompt",
            format!(
                "the prompt's first token {first:?} does not spell how the prompt starts (a \
                 character split across tokens); echo cannot score it"
            ),
        )
    })?;
    let record = backend.score(&ConversationSnapshot::raw(first.as_str()), rest)?;
    if record.token_ids.as_slice() != &tokens.token_ids[1..] {
        return Err(ApiError::invalid(
            "prompt",
            "the prompt tokenizes differently after its first token than as a whole; echo \
             cannot score it",
        ));
    }
    Ok((tokens, record))
}

/// One entry per prompt token: `token_id:N`, its logprob (`null` for the first) and its offset
/// in characters, as vLLM counts them.
fn token_logprobs(
    ids: &[u32],
    pieces: &[&str],
    logprobs: impl Iterator<Item = Option<f32>>,
) -> CompletionLogprobs {
    let mut offset = 0;
    let text_offset = pieces
        .iter()
        .map(|piece| {
            let at = offset;
            offset += piece.chars().count();
            at
        })
        .collect();
    CompletionLogprobs {
        tokens: ids.iter().map(|id| format!("token_id:{id}")).collect(),
        token_logprobs: logprobs.collect(),
        top_logprobs: None,
        text_offset,
    }
}
