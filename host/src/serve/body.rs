//! The JSON body extractor: errors come back as OpenAI `400`s whose `param` is the path of the
//! field at fault (`messages[0].role`), which axum's own `Json` does not give. A body must
//! arrive within the request's timeout, so a client that trickles one holds nothing forever.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::state::AppState;

pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let at_fault = |status, message| ApiError {
            param: Some("body".into()),
            ..ApiError::body(status, message)
        };
        let limit = state.queue.timeout();
        let bytes = tokio::time::timeout(limit, Bytes::from_request(req, state))
            .await
            .map_err(|_| {
                let waited = limit.as_secs_f64();
                at_fault(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body did not arrive within {waited} s"),
                )
            })?
            .map_err(|e| at_fault(e.status(), e.body_text()))?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parses a request body; the error names the field and what was wrong with it.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::invalid("body", format!("the body is not valid JSON: {inner}"));
        }
        let message = strip_position(&inner.to_string());
        let param = match named_field(&message) {
            // serde_path_to_error's path includes an unknown field but not a missing one.
            Some(field) if path == "." => field.to_string(),
            Some(field) if path == field || path.ends_with(&format!(".{field}")) => path,
            Some(field) => format!("{path}.{field}"),
            None => path,
        };
        // A field named "" (or at the top) has no path to show; the body is at fault.
        let param = if param.is_empty() || param == "." {
            "body".to_string()
        } else {
            param
        };
        ApiError::invalid(param.clone(), format!("`{param}`: {message}"))
    })?;
    de.end()
        .map_err(|e| ApiError::invalid("body", format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// The field an "unknown field `x`" or "missing field `x`" message is about.
fn named_field(message: &str) -> Option<&str> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))?;
    rest.split('`').next()
}

/// serde_json appends " at line L column C"; the path already locates the error.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::wire::ChatRequest;

    fn param(body: &str) -> String {
        parse::<ChatRequest>(body.as_bytes())
            .unwrap_err()
            .param
            .unwrap_or_default()
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(param(r#"{"model": "m"}"#), "messages");
        assert_eq!(
            param(r#"{"model": "m", "messages": [], "tempo": 1}"#),
            "tempo"
        );
        assert_eq!(
            param(r#"{"model": "m", "messages": [{"role": "robot", "content": "x"}]}"#),
            "messages[0].role"
        );
        assert_eq!(
            param(r#"{"model": "m", "messages": [], "temperature": "hot"}"#),
            "temperature"
        );
        assert_eq!(param(r#"{"model": "m", "#), "body");
        assert_eq!(param(r#"{"model": "m", "messages": []} x"#), "body");
    }
}
