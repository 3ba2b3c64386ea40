//! Where a template's text comes from: a `tokenizer_config.json` or a server's `/props` answer.

use serde_json::Value;

use super::TemplateError;

/// The `chat_template` of a `tokenizer_config.json` or `/props` answer: a string, or a list of
/// `{"name", "template"}` of which Transformers takes "default" when no tools are given.
pub(super) fn chat_template<'a>(json: &'a Value, origin: &str) -> Result<&'a str, TemplateError> {
    match json.get("chat_template") {
        Some(Value::String(source)) if !source.is_empty() => Ok(source),
        Some(Value::Array(list)) => {
            named(list, "default").ok_or_else(|| TemplateError::NoDefault {
                origin: origin.to_string(),
                names: list
                    .iter()
                    .filter_map(|t| t.get("name")?.as_str().map(str::to_string))
                    .collect(),
            })
        }
        _ => Err(TemplateError::Missing {
            origin: origin.to_string(),
        }),
    }
}

fn named<'a>(list: &'a [Value], name: &str) -> Option<&'a str> {
    list.iter()
        .find(|t| t.get("name").and_then(Value::as_str) == Some(name))?
        .get("template")?
        .as_str()
}

/// A special token given as a string or as an added token `{"content": ...}`.
pub(super) fn special_token(json: &Value, key: &str) -> Option<String> {
    let token = json.get(key)?;
    let text = token.as_str().or_else(|| token.get("content")?.as_str())?;
    Some(text.to_string())
}
