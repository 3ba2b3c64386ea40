//! OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`. Every failure
//! the server can meet becomes one of these with a status, so a client never sees a dropped
//! connection or a bare text body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lmhost_plugin_api::ErrorKind;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::Error;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The request field at fault, as a path (`messages[0].role`).
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A `400` naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or wrong bearer token in the Authorization header",
            )
        }
    }

    pub fn model_not_found(given: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model `{given}` does not exist; this server serves `{served}`"),
            )
        }
    }

    pub fn overloaded(retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            code: Some("overloaded"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the request queue is full; retry later",
            )
        }
    }

    pub fn timeout(seconds: f64) -> Self {
        ApiError {
            code: Some("timeout"),
            ..Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                format!("the request did not finish within {seconds} s"),
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "invalid_request_error", message)
    }

    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(param, message)
    }

    /// Names `field` as the one at fault in a `400` that names none: the backend refused the
    /// input that field held.
    pub fn about(mut self, field: &str) -> Self {
        if self.param.is_none() && self.status == StatusCode::BAD_REQUEST {
            self.param = Some(field.to_string());
        }
        self
    }
}

/// Backend errors keep their stable kind: bad input is the client's fault, an unavailable
/// backend is a `503`, anything else a `500`.
impl From<Error> for ApiError {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        match err.plugin_kind() {
            Some(ErrorKind::InvalidInput) | Some(ErrorKind::Config) => ApiError {
                code: Some("invalid_input"),
                ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            },
            // What the backend cannot do at all is the served model's limit.
            Some(ErrorKind::Unsupported) => ApiError {
                param: Some("model".into()),
                code: Some("unsupported"),
                ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
            },
            Some(ErrorKind::BackendUnavailable) => ApiError {
                code: Some("backend_unavailable"),
                ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            },
            _ => Self::internal(message),
        }
    }
}

/// Every error's body, in OpenAI's shape.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail<'a> {
    message: &'a str,
    /// `invalid_request_error` (the client's fault) or `server_error`.
    #[serde(rename = "type")]
    kind: &'a str,
    /// The request field at fault, as a path (`messages[0].role`).
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// The JSON body: `{"error": {...}}`.
    fn json(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }

    /// The body as a server-sent event, for a failure after a stream's headers went out.
    pub fn event(&self) -> String {
        // A struct of strings always serializes.
        let json = serde_json::to_string(&self.json()).unwrap_or_default();
        format!("data: {json}\n\n")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.json())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
