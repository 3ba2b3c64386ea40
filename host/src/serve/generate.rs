//! `/v1/chat/completions` and `/v1/completions`: requests become a snapshot and a validated
//! `GenerationConfig` (errors name the OpenAI field), the backend runs through the queue (and
//! stops at its next token when the client goes away or the request's time is up), and the
//! record, or the stream of its tokens, becomes the OpenAI response.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use axum::Json;
use lmhost_plugin_api::abi_stable::std_types::RString;
use lmhost_plugin_api::{FinishReason, GenerationConfig, GenerationRecord, TokenDelta};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::body::JsonBody;
use super::error::ApiError;
use super::messages::chat_snapshot;
use super::state::{now, AppState, Shared};
use super::stream::{ChatStream, Event};
use super::wire::{
    self, AssistantMessage, ChatChoice, ChatCompletion, ChatRequest, ChoiceLogprobs, Completion,
    CompletionChoice, CompletionLogprobs, CompletionRequest, Prompt, Stop, TokenLogprob, Usage,
};
use crate::ConversationSnapshot;

/// A chat completion: the messages go through the model's chat template.
#[utoipa::path(post, path = "/v1/chat/completions", request_body = ChatRequest,
    responses((status = 200,
        description = "The completion; with `stream`, `chat.completion.chunk` server-sent events",
        content((ChatCompletion = "application/json"), (String = "text/event-stream")))))]
pub(super) async fn chat(
    state: Shared,
    JsonBody(request): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let state = state.0;
    state.check_model(&request.model)?;
    only_one(request.n)?;
    if let Some(k) = request.top_logprobs.filter(|&k| k > 0) {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("backends return only the chosen token's logprob; `top_logprobs` must be 0. Given: {k}"),
        ));
    }
    for (field, value) in [
        ("presence_penalty", request.presence_penalty),
        ("frequency_penalty", request.frequency_penalty),
    ] {
        if let Some(v) = value.filter(|&v| v != 0.0) {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` is not supported; it must be 0. Given: {v}"),
            ));
        }
    }
    let snapshot = chat_snapshot(
        request.messages,
        request.tools.as_deref().unwrap_or_default(),
        request.documents.as_deref().unwrap_or_default(),
    )?;
    let max_tokens = match (request.max_completion_tokens, request.max_tokens) {
        (Some(n), _) => Some(("max_completion_tokens", n)),
        (None, Some(n)) => Some(("max_tokens", n)),
        (None, None) => None,
    };
    let config = Sampling {
        max_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        seed: request.seed,
        stop: request.stop,
    }
    .apply(&state)?;
    let stop = config.stop.first().map(|s| s.to_string());
    let (id, created, model) = (state.next_id("chatcmpl"), now(), state.model.clone());
    if request.stream.unwrap_or(false) {
        let mut events = stream_events(&state, snapshot, config);
        // A request refused or failed before its first token gets an HTTP error, not a stream.
        let first = match events.recv().await {
            Some(Event::Done(Err(e))) => return Err(e.about("messages")),
            Some(event) => event,
            None => return Err(ApiError::internal("the generation ended without a result")),
        };
        let stream = ChatStream {
            id,
            created,
            model,
            logprobs: request.logprobs.unwrap_or(false),
            include_usage: request
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            first,
            events,
        };
        return Ok(stream.into_response());
    }
    let record = generate(&state, snapshot, config)
        .await
        .map_err(|e| e.about("messages"))?;
    let usage = Usage::of(&record);
    let logprobs = request.logprobs.unwrap_or(false).then(|| ChoiceLogprobs {
        content: record
            .token_ids
            .iter()
            .zip(record.logprobs.iter())
            .map(|(&id, &lp)| TokenLogprob::new(id, lp))
            .collect(),
    });
    // vLLM's convention: a string `stop_reason` says a stop string ended generation.
    let stop_reason = stop.filter(|_| record.finish_reason == FinishReason::StopString);
    Ok(Json(ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: record.text.into_string(),
            },
            logprobs,
            finish_reason: wire::finish_reason(record.finish_reason),
            stop_reason,
        }],
        usage,
    })
    .into_response())
}

/// Text completions: the prompt is raw text, given to the model literally (no chat template).
/// With `echo`, the prompt's own tokens are scored instead of generating (see [`super::echo`]).
#[utoipa::path(post, path = "/v1/completions", request_body = CompletionRequest,
    responses((status = 200,
        description = "The completion; with `stream`, `text_completion` server-sent events",
        content((Completion = "application/json"), (String = "text/event-stream")))))]
pub(super) async fn completions(
    state: Shared,
    JsonBody(request): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let state = state.0;
    state.check_model(&request.model)?;
    only_one(request.n)?;
    if request.stream.unwrap_or(false) {
        return Err(ApiError::invalid(
            "stream",
            "streaming is offered on /v1/chat/completions only",
        ));
    }
    if let Some(k) = request.logprobs.filter(|&k| k > 1) {
        return Err(ApiError::invalid(
            "logprobs",
            format!("backends return only the chosen token's logprob; `logprobs` must be 0 or 1. Given: {k}"),
        ));
    }
    let prompt = match request.prompt {
        Prompt::Ids(ids) if request.echo == Some(true) => {
            return super::echo::respond_ids(&state, ids, request.logprobs.is_some())
                .await
                .map_err(|e| e.about("prompt"));
        }
        Prompt::Ids(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "a prompt of token ids is scored only (with `echo`); send text to generate",
            ))
        }
        Prompt::One(text) => text,
        Prompt::Many(mut texts) if texts.len() == 1 => texts.remove(0),
        Prompt::Many(texts) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("one prompt per request. Given: {}", texts.len()),
            ))
        }
    };
    if request.echo.unwrap_or(false) {
        return super::echo::respond(&state, prompt, request.logprobs.is_some())
            .await
            .map_err(|e| e.about("prompt"));
    }
    let snapshot = ConversationSnapshot::raw(prompt.as_str());
    let config = Sampling {
        max_tokens: request.max_tokens.map(|n| ("max_tokens", n)),
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        seed: request.seed,
        stop: request.stop,
    }
    .apply(&state)?;
    let record = generate(&state, snapshot, config)
        .await
        .map_err(|e| e.about("prompt"))?;
    let logprobs = request.logprobs.map(|_| CompletionLogprobs {
        tokens: record
            .token_ids
            .iter()
            .map(|id| format!("token_id:{id}"))
            .collect(),
        token_logprobs: record.logprobs.iter().map(|&l| Some(l)).collect(),
        top_logprobs: None,
        text_offset: vec![prompt.chars().count(); record.token_ids.len()],
    });
    Ok(Json(Completion {
        id: state.next_id("cmpl"),
        object: "text_completion",
        created: now(),
        model: state.model.clone(),
        choices: vec![CompletionChoice {
            index: 0,
            text: record.text.to_string(),
            logprobs,
            finish_reason: wire::finish_reason(record.finish_reason),
        }],
        usage: Usage::of(&record),
    })
    .into_response())
}

/// Set when dropped: the request's handler was dropped before its generation ended (its
/// client went away).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Generates through the queue. The generation stops at its next token once the request's
/// time is up or its client is gone, so neither keeps a worker busy.
async fn generate(
    state: &Arc<AppState>,
    snapshot: ConversationSnapshot,
    config: GenerationConfig,
) -> Result<GenerationRecord, ApiError> {
    let gone = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(gone.clone());
    let deadline = Instant::now() + state.queue.timeout();
    let (shared, watch) = (state.clone(), state.clone());
    let mut clock = TokenClock::new(state);
    state
        .queue
        .run(move || {
            let record = shared
                .backend
                .generate_stream(&snapshot, &config, move |delta| {
                    clock.tick(delta);
                    !gone.load(Ordering::Relaxed) && watch.live(deadline)
                });
            count_tokens(&shared, record, deadline)
        })
        .await
        .map_err(|e| state.queue_error(e))?
}

/// Starts a generation through the queue whose token deltas, then outcome, arrive on the
/// returned channel. Dropping the receiver (the client went away) or running past the
/// request's time stops it at its next token.
fn stream_events(
    state: &Arc<AppState>,
    snapshot: ConversationSnapshot,
    config: GenerationConfig,
) -> UnboundedReceiver<Event> {
    let (events, receiver) = unbounded_channel();
    let state = state.clone();
    let deadline = Instant::now() + state.queue.timeout();
    tokio::spawn(async move {
        let (shared, watch, deltas) = (state.clone(), state.clone(), events.clone());
        let mut clock = TokenClock::new(&state);
        let outcome = state
            .queue
            .run(move || {
                let record = shared
                    .backend
                    .generate_stream(&snapshot, &config, move |delta| {
                        clock.tick(delta);
                        watch.live(deadline) && deltas.send(Event::Delta(delta.clone())).is_ok()
                    });
                count_tokens(&shared, record, deadline)
            })
            .await;
        let outcome = match outcome {
            Err(e) => Err(state.queue_error(e)),
            Ok(outcome) => outcome,
        };
        // The client may be gone; then nobody needs the outcome.
        let _ = events.send(Event::Done(outcome));
    });
    receiver
}

/// Times a generation's tokens for the metrics: the first from the request's arrival, the
/// rest from the token before (a delta of several tokens spreads its gap over them).
struct TokenClock {
    state: Arc<AppState>,
    arrived: Instant,
    last: Option<Instant>,
}

impl TokenClock {
    fn new(state: &Arc<AppState>) -> Self {
        TokenClock {
            state: state.clone(),
            arrived: Instant::now(),
            last: None,
        }
    }

    fn tick(&mut self, delta: &TokenDelta) {
        let tokens = delta.token_ids.len() as u32;
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        let metrics = &self.state.metrics;
        match self.last {
            None => {
                metrics.record_first_token(now - self.arrived);
                for _ in 1..tokens {
                    metrics.record_inter_token(Duration::ZERO);
                }
            }
            Some(last) => {
                for _ in 0..tokens {
                    metrics.record_inter_token((now - last) / tokens);
                }
            }
        }
        self.last = Some(now);
    }
}

/// Counts a generation's tokens where it ran, so a request that timed out or lost its client
/// still shows what its backend call computed; a generation its deadline stopped is a timeout.
fn count_tokens(
    state: &AppState,
    record: crate::Result<GenerationRecord>,
    deadline: Instant,
) -> Result<GenerationRecord, ApiError> {
    let record = record?;
    state.metrics.record_tokens(
        record.prompt_tokens,
        record.token_ids.len() as u32,
        record.cached_prompt_tokens,
    );
    if Instant::now() >= deadline {
        return Err(ApiError::timeout(state.queue.timeout().as_secs_f64()));
    }
    Ok(record)
}

fn only_one(n: Option<u32>) -> Result<(), ApiError> {
    match n {
        Some(n) if n != 1 => Err(ApiError::invalid(
            "n",
            format!("only one choice per request; `n` must be 1. Given: {n}"),
        )),
        _ => Ok(()),
    }
}

/// The sampling fields of a request, before validation.
struct Sampling {
    max_tokens: Option<(&'static str, u32)>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    seed: Option<u64>,
    stop: Option<Stop>,
}

impl Sampling {
    /// The server's defaults with the request's settings applied; errors name the request's
    /// field, or the server's limit it exceeds.
    fn apply(self, state: &AppState) -> Result<GenerationConfig, ApiError> {
        let mut config = state.defaults.clone();
        let cap = state.limits.max_tokens;
        config.max_new_tokens = config.max_new_tokens.min(cap);
        if let Some((field, n)) = self.max_tokens {
            if n == 0 {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` must be >= 1. Given: 0"),
                ));
            }
            if n > cap {
                return Err(ApiError::invalid(
                    field,
                    format!("`{field}` is at most {cap} on this server (--max-tokens). Given: {n}"),
                ));
            }
            config.max_new_tokens = n;
        }
        if let Some(t) = self.temperature {
            if !(t.is_finite() && (0.0..=2.0).contains(&t)) {
                return Err(ApiError::invalid(
                    "temperature",
                    format!("`temperature` must be >= 0 and <= 2. Given: {t}"),
                ));
            }
            config.temperature = t;
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(ApiError::invalid(
                    "top_p",
                    format!("`top_p` must be > 0 and <= 1. Given: {p}"),
                ));
            }
            config.top_p = p;
        }
        if let Some(k) = self.top_k {
            config.top_k = k;
        }
        if let Some(seed) = self.seed {
            config.seed = seed;
        }
        if let Some(stop) = self.stop {
            let stop = stop.into_vec();
            if let Some(i) = stop.iter().position(String::is_empty) {
                return Err(ApiError::invalid(
                    format!("stop[{i}]"),
                    format!("`stop[{i}]` is empty; stop strings need at least one character"),
                ));
            }
            config.stop = stop.into_iter().map(RString::from).collect();
        }
        config
            .validate()
            .map_err(|e| ApiError::invalid("body", e.message.into_string()))?;
        Ok(config)
    }
}
