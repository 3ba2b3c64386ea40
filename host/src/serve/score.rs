//! `/generate` in SGLang's shape, for scoring: a prompt's logprobs from `logprob_start_len` on.
//! The tokens before that position go to the backend as the prompt of a `score` call, so its
//! prefix cache serves what earlier requests shared; `echo` cannot, as it scores the whole
//! text as the continuation of its first token. The openai backend scores through this route.

use axum::Json;

use super::body::JsonBody;
use super::error::ApiError;
use super::state::Shared;
use super::wire::{GenerateRequest, Generated, LogprobEntry as Entry, MetaInfo};
use crate::{Backend, ConversationSnapshot};

/// Scores a prompt given as `text` or `input_ids`; generates nothing.
#[utoipa::path(post, path = "/generate", request_body = GenerateRequest,
    responses((status = 200, description = "The prompt's token count and logprobs", body = Generated)))]
pub(super) async fn generate(
    state: Shared,
    JsonBody(request): JsonBody<GenerateRequest>,
) -> Result<Json<Generated>, ApiError> {
    let state = state.0;
    let sampling = request.sampling_params.as_ref();
    if let Some(n) = sampling.and_then(|p| p.max_new_tokens).filter(|&n| n > 0) {
        return Err(ApiError::invalid(
            "sampling_params.max_new_tokens",
            format!(
                "this server's /generate scores prompts and generates nothing; \
                 `max_new_tokens` must be 0 (generate through /v1/completions). Given: {n}"
            ),
        ));
    }
    let input = match (request.text, request.input_ids) {
        (Some(text), None) => Input::Text(text),
        (None, Some(ids)) => Input::Ids(ids),
        _ => {
            return Err(ApiError::invalid(
                "text",
                "give exactly one of `text` and `input_ids`",
            ))
        }
    };
    let (start, with_logprobs) = (request.logprob_start_len, request.return_logprob);
    let backend = state.backend.clone();
    let scored = state
        .queue
        .run(move || score(&backend, input, start, with_logprobs.unwrap_or(false)))
        .await
        .map_err(|e| state.queue_error(e))??;
    state
        .metrics
        .record_tokens(scored.prompt_tokens, 0, scored.cached_tokens);
    Ok(Json(Generated {
        text: String::new(),
        meta_info: MetaInfo {
            id: state.next_id("gen"),
            prompt_tokens: scored.prompt_tokens,
            completion_tokens: 0,
            cached_tokens: scored.cached_tokens,
            input_token_logprobs: scored.entries,
        },
    }))
}

enum Input {
    Text(String),
    Ids(Vec<u32>),
}

struct Scored {
    prompt_tokens: u32,
    cached_tokens: u32,
    entries: Option<Vec<Entry>>,
}

/// Every token of `ids` but the first scored, as `echo` answers a prompt given as ids: the
/// logprobs (`None` for the first) and the prompt tokens the prefix cache served.
pub(super) fn score_all(
    backend: &Backend,
    ids: Vec<u32>,
) -> Result<(Vec<Option<f32>>, u32), ApiError> {
    let scored = score(backend, Input::Ids(ids), Some(0), true)?;
    let entries = scored.entries.unwrap_or_default();
    Ok((
        entries.into_iter().map(|(logprob, _, _)| logprob).collect(),
        scored.cached_tokens,
    ))
}

/// The prompt's ids, and with `with_logprobs` the logprobs of those from `start` on: the ids
/// before it are the prompt of a backend `score`, the rest its reply.
fn score(
    backend: &Backend,
    input: Input,
    start: Option<i64>,
    with_logprobs: bool,
) -> Result<Scored, ApiError> {
    let (ids, spelled, field) = match input {
        // SGLang tokenizes text as its completions do: with the model's BOS.
        Input::Text(text) => {
            let record = (backend.tokenize(&ConversationSnapshot::raw(text.as_str()), true))
                .map_err(|e| ApiError::from(e).about("text"))?;
            let pieces = record.pieces.into_iter().map(String::from).collect();
            (record.token_ids.into_vec(), Some((text, pieces)), "text")
        }
        Input::Ids(ids) => {
            // Ids the model reads back into text, or a 400 naming the one outside its
            // vocabulary (also where only their count is asked for).
            (backend.detokenize(&ids)).map_err(|e| ApiError::from(e).about("input_ids"))?;
            (ids, None, "input_ids")
        }
    };
    let n = ids.len();
    if n == 0 {
        return Err(ApiError::invalid(field, "the prompt has no tokens"));
    }
    let mut scored = Scored {
        prompt_tokens: n as u32,
        cached_tokens: 0,
        entries: None,
    };
    if !with_logprobs {
        return Ok(scored);
    }
    let start = match start {
        None | Some(-1) => n - 1,
        Some(k) if (0..n as i64).contains(&k) => k as usize,
        Some(k) => {
            return Err(ApiError::invalid(
                "logprob_start_len",
                format!(
                    "`logprob_start_len` must be -1 or a position among the prompt's {n} tokens \
                     (0 to {}). Given: {k}",
                    n - 1
                ),
            ))
        }
    };
    // The first token has no logprob: nothing precedes it.
    let split = start.max(1);
    let mut entries: Vec<Entry> = (start == 0)
        .then_some((None, ids[0], None))
        .into_iter()
        .collect();
    if split < n {
        let spelled = spelled
            .as_ref()
            .map(|(t, p): &(String, Vec<String>)| (t.as_str(), p.as_slice()));
        let (prompt, reply) = texts(backend, &ids, split, spelled, field)?;
        let record = (backend.score(&ConversationSnapshot::raw(prompt), &reply))
            .map_err(|e| ApiError::from(e).about(field))?;
        if record.token_ids.as_slice() != &ids[split..] {
            return Err(round_trip_error(field, "after", split));
        }
        let logprobs = record.logprobs.iter().map(|&l| Some(l));
        entries.extend(logprobs.zip(&ids[split..]).map(|(l, &id)| (l, id, None)));
        scored.cached_tokens = record.cached_prompt_tokens;
    }
    scored.entries = Some(entries);
    Ok(scored)
}

/// The texts of `ids[..split]` (as a raw prompt, which the backend starts with the model's BOS
/// where it adds one) and of `ids[split..]`, checked to tokenize back into the prompt's ids.
/// A prompt sent as text is cut where its tokens' pieces end; ids are detokenized.
fn texts(
    backend: &Backend,
    ids: &[u32],
    split: usize,
    spelled: Option<(&str, &[String])>,
    field: &str,
) -> Result<(String, String), ApiError> {
    let raw = |text: &str| {
        (backend.tokenize(&ConversationSnapshot::raw(text), true))
            .map_err(|e| ApiError::from(e).about(field))
    };
    let bos = raw("")?.token_ids;
    let head = &ids[..split];
    let cut = spelled.and_then(|(text, pieces)| {
        let prompt = pieces[bos.len().min(split)..split].concat();
        let reply = text.strip_prefix(prompt.as_str())?.to_string();
        Some((prompt, reply))
    });
    let (prompt, reply) = match cut {
        Some(cut) => cut,
        None => {
            let body = head.strip_prefix(bos.as_slice()).ok_or_else(|| {
                ApiError::invalid(
                    field,
                    format!(
                        "this model starts every prompt with the ids {:?}; `{field}` must start \
                         with them",
                        bos.as_slice()
                    ),
                )
            })?;
            let detokenize = |ids| {
                backend
                    .detokenize(ids)
                    .map_err(|e| ApiError::from(e).about(field))
            };
            (detokenize(body)?, detokenize(&ids[split..])?)
        }
    };
    if raw(&prompt)?.token_ids.as_slice() != head {
        return Err(round_trip_error(field, "before", split));
    }
    Ok((prompt, reply))
}

fn round_trip_error(field: &str, side: &str, split: usize) -> ApiError {
    ApiError::invalid(
        field,
        format!(
            "the prompt's tokens {side} position {split} (`logprob_start_len`) tokenize \
             differently as text than as given, so this server cannot score them; start the \
             logprobs at a token boundary that text keeps, or send `text`"
        ),
    )
}
