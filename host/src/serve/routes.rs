//! The router: routes, the auth and metrics layers, the OpenAPI document (built from the same
//! route list, so the two cannot drift) and the small endpoints. The generation endpoints live
//! in [`super::generate`].

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lmhost_plugin_api::ErrorKind;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::JsonBody;
use super::error::ApiError;
use super::openapi;
use super::state::{now, AppState, Shared};
use super::wire::{
    Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage, Health, Model, ModelList, Props,
};

pub(super) fn build(state: Arc<AppState>, body_limit: usize) -> Router {
    let authorized = || middleware::from_fn_with_state(state.clone(), authorize);
    let protected = OpenApiRouter::new()
        .routes(routes!(super::generate::chat))
        .routes(routes!(super::generate::completions))
        .routes(routes!(super::score::generate))
        .routes(routes!(embeddings))
        .routes(routes!(models))
        .routes(routes!(super::tokens::tokenize))
        .routes(routes!(super::tokens::detokenize))
        .routes(routes!(props))
        .routes(routes!(metrics))
        .route_layer(authorized());
    let (router, api) = OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(health))
        .merge(protected)
        .split_for_parts();
    let document = Arc::new(openapi::complete(
        &api,
        &state.model,
        state.api_key.is_some(),
    ));
    let served = Router::new()
        .route(
            "/openapi.json",
            get(move || std::future::ready(Json(document.as_ref().clone()))),
        )
        .route_layer(authorized());
    router
        .merge(served)
        .route_layer(middleware::from_fn_with_state(state.clone(), track))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
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
            "no route {} {}; /openapi.json lists every route",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::body(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} {} is not served; the `Allow` header lists the methods that are",
            request.method(),
            request.uri().path()
        ),
    )
}

/// Answers while the server runs; needs no key.
#[utoipa::path(get, path = "/health", responses((status = 200, description = "The server runs", body = Health)))]
async fn health() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The one model this server serves.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, description = "The served model", body = ModelList)))]
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
#[utoipa::path(get, path = "/props", responses((status = 200, description = "The server's properties", body = Props)))]
async fn props(State(state): Shared) -> Json<Props> {
    Json(Props {
        model: state.model.clone(),
        server: "lmhost",
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// Prometheus metrics: requests, latencies, queue and prefix-cache figures.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
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
#[utoipa::path(post, path = "/v1/embeddings", request_body = EmbeddingRequest,
    responses((status = 200, description = "One vector per input", body = EmbeddingList)))]
async fn embeddings(
    State(state): Shared,
    JsonBody(request): JsonBody<EmbeddingRequest>,
) -> Result<Json<EmbeddingList>, ApiError> {
    state.check_model(&request.model)?;
    let inputs = match request.input {
        super::wire::Prompt::One(text) => vec![text],
        super::wire::Prompt::Many(texts) => texts,
        super::wire::Prompt::Ids(_) => {
            return Err(ApiError::invalid(
                "input",
                "`input` must be text; this server embeds no token ids",
            ))
        }
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
            e => ApiError::from(e).about("input"),
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
