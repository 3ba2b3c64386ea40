//! The router: routes, the auth and metrics layers, and the small endpoints. The generation
//! endpoints live in [`super::generate`].

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lmhost_plugin_api::ErrorKind;
use serde_json::json;

use super::body::JsonBody;
use super::error::ApiError;
use super::generate::{chat, completions};
use super::state::{now, AppState, Shared};
use super::wire::{Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, Model, ModelList};

pub(super) fn build(state: Arc<AppState>, body_limit: usize) -> Router {
    let protected = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(super::tokens::tokenize))
        .route("/detokenize", post(super::tokens::detokenize))
        .route("/props", get(props))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/health", get(health))
        .merge(protected)
        .route_layer(middleware::from_fn_with_state(state.clone(), track))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// Records each routed request's status and latency.
async fn track(State(state): Shared, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let start = Instant::now();
    let response = next.run(request).await;
    state
        .metrics
        .record_request(&route, response.status().as_u16(), start.elapsed());
    response
}

/// Checks `Authorization: Bearer <key>` when the server has a key.
async fn authorize(State(state): Shared, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(request: Request) -> ApiError {
    ApiError::body(
        axum::http::StatusCode::NOT_FOUND,
        format!(
            "no route {} {}; see /v1/models, /v1/chat/completions, /v1/completions",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(state): Shared) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![Model {
            id: state.model.clone(),
            object: "model",
            created: now(),
            owned_by: "lmhost",
        }],
    })
}

/// Server properties in llama.cpp's shape. No `chat_template`: the backend renders chat
/// behind the plugin boundary, and `/v1/completions` takes its prompt literally.
async fn props(State(state): Shared) -> Json<serde_json::Value> {
    Json(json!({
        "model": state.model,
        "server": "lmhost",
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn metrics(State(state): Shared) -> Response {
    let backend = state.backend.clone();
    let stats = tokio::task::spawn_blocking(move || backend.stats())
        .await
        .unwrap_or_default();
    let text = state.metrics.render(&stats, state.queue.load());
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// Embeds each input through the backend's `embed` (candle: the mean of the model's final
/// hidden states over the input's tokens); a backend that cannot embed gets a 400 naming it.
async fn embeddings(
    State(state): Shared,
    JsonBody(request): JsonBody<EmbeddingRequest>,
) -> Result<Json<EmbeddingList>, ApiError> {
    state.check_model(&request.model)?;
    let inputs = match request.input {
        super::wire::Prompt::One(text) => vec![text],
        super::wire::Prompt::Many(texts) => texts,
    };
    if inputs.is_empty() {
        return Err(ApiError::invalid("input", "`input` is empty"));
    }
    let limits = &state.limits;
    if inputs.len() > limits.max_embedding_inputs {
        return Err(ApiError::invalid(
            "input",
            format!(
                "`input` holds {} texts; this server embeds at most {} per request",
                inputs.len(),
                limits.max_embedding_inputs
            ),
        ));
    }
    let bytes: usize = inputs.iter().map(String::len).sum();
    if bytes > limits.max_embedding_bytes {
        return Err(ApiError::invalid(
            "input",
            format!(
                "`input` holds {bytes} bytes of text; this server embeds at most {} per request",
                limits.max_embedding_bytes
            ),
        ));
    }
    let backend = state.backend.clone();
    let records = state
        .queue
        .run(move || backend.embed(&inputs))
        .await
        .map_err(|e| state.queue_error(e))?
        .map_err(|e| match e {
            crate::Error::Plugin { ref source, .. } if source.kind == ErrorKind::Unsupported => {
                ApiError::invalid(
                    "model",
                    format!(
                        "backend `{}` cannot embed text; /v1/embeddings needs one that can",
                        state.backend.plugin()
                    ),
                )
            }
            e => e.into(),
        })?;
    let prompt_tokens = records.iter().map(|r| r.prompt_tokens).sum();
    let data = records
        .into_iter()
        .enumerate()
        .map(|(index, record)| Embedding {
            object: "embedding",
            index,
            embedding: record.embedding.into_vec(),
        })
        .collect();
    Ok(Json(EmbeddingList {
        object: "list",
        data,
        model: state.model.clone(),
        usage: EmbeddingUsage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    }))
}
