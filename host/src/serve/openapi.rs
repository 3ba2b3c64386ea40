//! The OpenAPI document served at `/openapi.json`. The handlers' `#[utoipa::path]` attributes
//! and the wire types' schemas give its operations and bodies; [`complete`] adds what only the
//! running server knows (the model it serves, whether it wants a key) and the errors that every
//! operation of a kind shares, so no handler repeats them.

use serde_json::{json, Value};
use utoipa::OpenApi;

use super::error::ErrorBody;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "lmhost serve",
        description = "An OpenAI-compatible server over any lmhost backend. Every error is \
                       `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`; a 400's \
                       `param` names the field at fault."
    ),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

/// The document's fixed parts, before the routes add their operations.
pub(super) fn base() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document for a server of `model`, with the bearer scheme when it has a key.
pub(super) fn complete(api: &utoipa::openapi::OpenApi, model: &str, keyed: bool) -> Value {
    let mut document = serde_json::to_value(api).unwrap_or_else(|_| json!({}));
    pin_model(&mut document, model);
    if keyed {
        document["components"]["securitySchemes"] =
            json!({"bearer": {"type": "http", "scheme": "bearer"}});
    }
    if let Some(paths) = document["paths"].as_object_mut() {
        for (path, item) in paths {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, operation) in item {
                add_errors(operation, path, method, keyed);
            }
        }
    }
    document
}

/// Requests must name the served model: every request schema's `model` is that one value
/// (or null where it may be left out).
fn pin_model(document: &mut Value, model: &str) {
    let Some(schemas) = document["components"]["schemas"].as_object_mut() else {
        return;
    };
    for schema in schemas.values_mut() {
        let Some(property) = schema.pointer_mut("/properties/model") else {
            continue;
        };
        let nullable = property["type"]
            .as_array()
            .is_some_and(|types| types.iter().any(|t| t == "null"));
        let choices = if nullable {
            json!([model, null])
        } else {
            json!([model])
        };
        property["enum"] = choices;
        property["description"] = json!("The model this server serves");
    }
}

/// The errors an operation can answer besides its success: a missing key on every route but
/// `/health`; a bad or oversized body, an unknown model and a full or slow queue on those that
/// take a body and call the backend.
fn add_errors(operation: &mut Value, path: &str, method: &str, keyed: bool) {
    let mut errors = Vec::new();
    if keyed && path != "/health" {
        operation["security"] = json!([{"bearer": []}]);
        errors.push(("401", "The `Authorization: Bearer` key is missing or wrong"));
    }
    if method == "post" {
        errors.extend([
            (
                "400",
                "The request is invalid; `param` names the field at fault",
            ),
            (
                "404",
                "The request names a model this server does not serve",
            ),
            ("408", "The body did not arrive within the server's timeout"),
            ("413", "The body is larger than the server's limit"),
            (
                "503",
                "The request queue is full; retry after `Retry-After` seconds",
            ),
            (
                "504",
                "The request did not finish within the server's timeout",
            ),
        ]);
    }
    let Some(responses) = operation["responses"].as_object_mut() else {
        return;
    };
    for (status, description) in errors {
        responses.insert(status.to_string(), error_response(description));
    }
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    })
}
