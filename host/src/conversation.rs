//! Conversation files: JSON in, a `ConversationSnapshot` out.
//!
//! ```json
//! {"messages": [
//!   {"role": "system", "content": "You are terse."},
//!   {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
//! ]}
//! ```
//! A turn ends after each assistant message, so earlier exchanges become earlier turns.
//!
//! Audio parts name a WAV file relative to the conversation file, or carry base64 PCM inline
//! (see [`crate::audio`] for the formats):
//! ```json
//! {"type": "audio", "path": "clip.wav"}
//! {"type": "audio", "pcm_base64": "AAD/fw==", "sample_rate": 16000}
//! {"type": "audio", "pcm_base64": "...", "sample_rate": 48000, "format": "f32le", "channels": 2}
//! ```
//!
//! Image parts name a PNG, JPEG, WebP or GIF file relative to the conversation file, or carry
//! its bytes as base64 (see [`crate::images`]); `regions` (boxes in pixels, `[x0, y0, x1, y1]`,
//! as a detector outputs them) are what `explain` takes as its players with
//! `image_players = "regions"`:
//! ```json
//! {"type": "image", "path": "cat.png"}
//! {"type": "image", "data_base64": "iVBORw0KGgo..."}
//! {"type": "image", "path": "park.png", "regions": [{"label": "dog", "box": [10, 20, 90, 80]}]}
//! ```
//!
//! Agent traces take OpenAI's shape: `tools` beside `messages`, assistant messages with
//! `tool_calls` (whose `content` may be null or left out), and `tool` messages answering them;
//! retrieval gives `documents` (objects with a string `text`, as Transformers takes them):
//! ```json
//! {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}],
//!  "messages": [
//!   {"role": "user", "content": "Do I need an umbrella?"},
//!   {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
//!     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
//!   {"role": "tool", "tool_call_id": "c1", "content": "Rain all day."}
//! ]}
//! ```

use std::path::Path;

use lmhost_plugin_api::abi_stable::std_types::{RString, RVec};
use lmhost_plugin_api::{ConversationSnapshot, Grounding, Message, Part, Role, ToolCall, Turn};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::explain::{ImageRegions, Region};
use crate::{audio, images};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConversationFile {
    messages: Vec<FileMessage>,
    #[serde(default)]
    tools: Vec<Box<RawValue>>,
    #[serde(default)]
    documents: Vec<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMessage {
    role: Role,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
    tool_call_id: Option<String>,
}

/// A tool call in OpenAI's shape. `arguments` is the text of a JSON object, as OpenAI sends
/// it, or the object itself, as Transformers' examples write it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WireToolCall {
    id: String,
    /// Checked, not kept: "function" is the only kind.
    #[serde(rename = "type")]
    _kind: Option<FunctionKind>,
    function: WireFunction,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
enum FunctionKind {
    Function,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct WireFunction {
    name: String,
    #[schema(value_type = Object)]
    arguments: Box<RawValue>,
}

impl WireToolCall {
    /// The call for a backend: `arguments` given as a string become the text it holds.
    pub(crate) fn into_call(self) -> ToolCall {
        let raw = self.function.arguments.get();
        let arguments = match serde_json::from_str::<String>(raw) {
            Ok(text) => text,
            Err(_) => raw.to_string(),
        };
        ToolCall {
            id: self.id.into(),
            name: self.function.name.into(),
            arguments: arguments.into(),
        }
    }
}

/// A message of `parts` with its tool calls, or answering the call `tool_call_id`.
pub(crate) fn tool_message(
    role: Role,
    parts: Vec<Part>,
    tool_calls: Vec<WireToolCall>,
    tool_call_id: Option<String>,
) -> Message {
    Message {
        tool_calls: tool_calls
            .into_iter()
            .map(WireToolCall::into_call)
            .collect(),
        tool_call_id: tool_call_id.map(RString::from).into(),
        ..Message::new(role, parts)
    }
}

/// Tools or documents as the snapshot holds them: each one's JSON text, as written.
pub(crate) fn json_texts(values: &[Box<RawValue>]) -> Vec<RString> {
    values.iter().map(|t| RString::from(t.get())).collect()
}

#[derive(Debug)]
enum Content {
    Text(String),
    Parts(Vec<FilePart>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Ok(match text_or_parts(d)? {
            Ok(text) => Content::Text(text),
            Err(parts) => Content::Parts(parts),
        })
    }
}

/// A message's `content`: a string (`Ok`) or a list of parts (`Err`), whose errors say what is
/// wrong with a part (serde's untagged enums say only that nothing matched).
pub(crate) fn text_or_parts<'de, D, P>(
    d: D,
) -> std::result::Result<std::result::Result<String, Vec<P>>, D::Error>
where
    D: serde::Deserializer<'de>,
    P: serde::de::DeserializeOwned,
{
    use serde::de::Error as _;
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(text) => Ok(Ok(text)),
        parts @ serde_json::Value::Array(_) => serde_json::from_value(parts)
            .map(Err)
            .map_err(D::Error::custom),
        other => Err(D::Error::custom(format!(
            "`content` is a string or a list of parts, not {other}"
        ))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum FilePart {
    Text {
        text: String,
    },
    Audio {
        path: Option<String>,
        pcm_base64: Option<String>,
        sample_rate: Option<u32>,
        format: Option<String>,
        channels: Option<u16>,
    },
    Image {
        path: Option<String>,
        data_base64: Option<String>,
        #[serde(default)]
        regions: Vec<FileRegion>,
    },
}

/// A region of an image part: `box` is `[x0, y0, x1, y1]` in pixels (x1 and y1 excluded).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRegion {
    label: Option<String>,
    #[serde(rename = "box")]
    bounds: [u32; 4],
}

impl FilePart {
    /// The part for a backend; audio and images are decoded, `path` is relative to `base`;
    /// `what` names the part in errors.
    fn into_part(self, base: &Path, source: &Path, what: &str) -> Result<Part> {
        let invalid = |message: &str| Error::Conversation {
            path: source.to_path_buf(),
            message: message.into(),
        };
        match self {
            FilePart::Text { text } => Ok(Part::text(text)),
            FilePart::Audio {
                path: Some(file),
                pcm_base64: None,
                sample_rate: None,
                format: None,
                channels: None,
            } => Ok(Part::Audio {
                audio: audio::read_wav(&base.join(file))?,
            }),
            FilePart::Audio {
                path: None,
                pcm_base64: Some(data),
                sample_rate: Some(rate),
                format,
                channels,
            } => Ok(Part::Audio {
                audio: audio::decode_pcm_base64(
                    &data,
                    rate,
                    format.as_deref().unwrap_or("s16le"),
                    channels.unwrap_or(1),
                    source,
                )?,
            }),
            FilePart::Audio { path: Some(_), .. } => Err(invalid(
                "an audio part with `path` takes no other field; `sample_rate`, `format` and \
                 `channels` come from the WAV file",
            )),
            FilePart::Audio {
                pcm_base64: Some(_),
                ..
            } => Err(invalid(
                "an audio part with `pcm_base64` needs `sample_rate` (Hz); `format` \
                 (\"s16le\" or \"f32le\", default \"s16le\") and `channels` (default 1) are optional",
            )),
            FilePart::Audio { .. } => Err(invalid(
                "an audio part needs `path` (a WAV file relative to this file) or `pcm_base64` \
                 with `sample_rate`",
            )),
            FilePart::Image {
                path: Some(file),
                data_base64: None,
                ..
            } => Ok(Part::Image {
                image: images::read(&base.join(file), what)?,
            }),
            FilePart::Image {
                path: None,
                data_base64: Some(data),
                ..
            } => Ok(Part::Image {
                image: images::decode_base64(&data, source, what)?,
            }),
            FilePart::Image { .. } => Err(invalid(&format!(
                "{what}: an image part needs one of `path` (an image file relative to this \
                 file) and `data_base64` (the file's bytes as base64)"
            ))),
        }
    }
}

/// Reads a conversation file.
pub fn load(path: &Path) -> Result<ConversationSnapshot> {
    load_with_regions(path).map(|(conversation, _)| conversation)
}

/// Reads a conversation file and the regions its image parts give.
pub fn load_with_regions(path: &Path) -> Result<(ConversationSnapshot, Vec<ImageRegions>)> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_with_regions(&text, path)
}

/// Parses conversation JSON; `path` names the source in errors.
pub fn parse(text: &str, path: &Path) -> Result<ConversationSnapshot> {
    parse_with_regions(text, path).map(|(conversation, _)| conversation)
}

/// Parses conversation JSON and the regions its image parts give (message counted from 0 in
/// file order, image counted from 0 within its message).
pub fn parse_with_regions(
    text: &str,
    path: &Path,
) -> Result<(ConversationSnapshot, Vec<ImageRegions>)> {
    let invalid = |message: String| Error::Conversation {
        path: path.to_path_buf(),
        message,
    };
    let file: ConversationFile = serde_json::from_str(text).map_err(|e| {
        invalid(format!(
            "line {}, column {}: {e}; expected {{\"messages\": [{{\"role\": \"user\", \"content\": \"...\"}}]}}",
            e.line(),
            e.column()
        ))
    })?;
    if file.messages.is_empty() {
        return Err(invalid(
            "`messages` is empty; a conversation needs at least one message".into(),
        ));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let mut regions = Vec::new();
    let messages = file
        .messages
        .into_iter()
        .enumerate()
        .map(|(m, message)| {
            let parts = match message.content {
                None if message.tool_calls.is_empty() => {
                    return Err(invalid(format!(
                        "messages[{m}] has no `content`; only an assistant message with \
                         `tool_calls` may leave it out"
                    )))
                }
                None => Vec::new(),
                Some(Content::Text(text)) => vec![Part::text(text)],
                Some(Content::Parts(mut parts)) => {
                    let images = parts.iter_mut().filter_map(|part| match part {
                        FilePart::Image { regions, .. } => Some(regions),
                        _ => None,
                    });
                    for (k, given) in images.enumerate() {
                        regions.extend(image_regions(m, k, std::mem::take(given)));
                    }
                    (parts.into_iter().enumerate())
                        .map(|(p, part)| {
                            let what = format!("message {}, part {}", m + 1, p + 1);
                            part.into_part(base, path, &what)
                        })
                        .collect::<Result<Vec<Part>>>()?
                }
            };
            let (calls, id) = (message.tool_calls, message.tool_call_id);
            Ok(tool_message(message.role, parts, calls, id))
        })
        .collect::<Result<Vec<_>>>()?;
    let grounding = Grounding {
        tools: json_texts(&file.tools),
        documents: json_texts(&file.documents),
    };
    let conversation = ConversationSnapshot::grounded(group_turns(messages), grounding)
        .map_err(|e| invalid(e.message.into_string()))?;
    Ok((conversation, regions))
}

/// The regions given for image `image` of message `message`, if any.
fn image_regions(message: usize, image: usize, given: Vec<FileRegion>) -> Option<ImageRegions> {
    (!given.is_empty()).then(|| ImageRegions {
        message,
        image,
        regions: (given.into_iter())
            .map(|r| Region {
                label: r.label,
                bounds: r.bounds,
            })
            .collect(),
    })
}

/// A conversation of `messages`, in turns as [`group_turns`] splits them.
pub fn from_messages(messages: impl IntoIterator<Item = Message>) -> Result<ConversationSnapshot> {
    ConversationSnapshot::new(group_turns(messages))
        .map_err(|e| Error::Invalid(e.message.into_string()))
}

/// Splits messages into turns, closing a turn after each assistant message that calls no tool:
/// an agent's calls and their results stay in the turn they answer.
pub fn group_turns(messages: impl IntoIterator<Item = Message>) -> Vec<Turn> {
    let mut turns = Vec::new();
    let mut current = Vec::new();
    for message in messages {
        let closes = message.role == Role::Assistant && message.tool_calls.is_empty();
        current.push(message);
        if closes {
            turns.push(Turn {
                messages: RVec::from(std::mem::take(&mut current)),
            });
        }
    }
    if !current.is_empty() {
        turns.push(Turn {
            messages: RVec::from(current),
        });
    }
    turns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<ConversationSnapshot> {
        parse(text, Path::new("c.json"))
    }

    #[test]
    fn strings_and_parts_both_parse_into_turns() {
        let snapshot = parse_str(
            r#"{"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"}
            ]}"#,
        )
        .unwrap();
        assert_eq!(snapshot.turns.len(), 2);
        assert_eq!(snapshot.turns[0].messages.len(), 3);
        assert_eq!(snapshot.turns[1].messages[0].text_content(), "Bye");
    }

    #[test]
    fn errors_name_file_position_and_expected_shape() {
        let err =
            parse_str("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("c.json: line 1"), "{text}");
        assert!(text.contains("robot"), "{text}");
        let err = parse_str(r#"{"messages": []}"#).unwrap_err();
        assert!(err.to_string().contains("at least one message"), "{err}");
    }

    /// A 2x1 PNG (a red and a blue pixel) in `dir`, and its bytes.
    fn png(dir: &Path) -> Vec<u8> {
        let image = image::RgbImage::from_raw(2, 1, vec![255, 0, 0, 0, 0, 255]).unwrap();
        let mut bytes = std::io::Cursor::new(Vec::new());
        image.write_to(&mut bytes, image::ImageFormat::Png).unwrap();
        std::fs::write(dir.join("dot.png"), bytes.get_ref()).unwrap();
        bytes.into_inner()
    }

    #[test]
    fn image_parts_read_a_file_beside_the_conversation_or_inline_base64() {
        use base64::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let bytes = png(dir.path());
        let inline = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let text = format!(
            r#"{{"messages": [{{"role": "user", "content": [
                {{"type": "image", "path": "dot.png"}},
                {{"type": "text", "text": "Which colours?"}},
                {{"type": "image", "data_base64": "{inline}"}}
            ]}}]}}"#
        );
        let snapshot = parse(&text, &dir.path().join("c.json")).unwrap();
        let parts = &snapshot.turns[0].messages[0].parts;
        let (Part::Image { image: a }, Part::Image { image: b }) = (&parts[0], &parts[2]) else {
            panic!("{parts:?}");
        };
        assert_eq!((a.width, a.height), (2, 1));
        assert_eq!(a.rgb.as_slice(), &[255, 0, 0, 0, 0, 255]);
        assert_eq!(a, b);
        assert!(snapshot.has_images());
    }

    #[test]
    fn bad_image_parts_name_the_message_and_part() {
        let dir = tempfile::tempdir().unwrap();
        png(dir.path());
        let cases = [
            (
                r#"{"type": "image"}"#,
                "message 2, part 1: an image part needs one of `path`",
            ),
            (
                r#"{"type": "image", "path": "dot.png", "data_base64": "AA=="}"#,
                "needs one of `path`",
            ),
            (
                r#"{"type": "image", "path": "missing.png"}"#,
                "message 2, part 1: cannot read",
            ),
            (
                r#"{"type": "image", "data_base64": "aGVsbG8="}"#,
                "PNG, JPEG, WebP or GIF",
            ),
            (
                r#"{"type": "image", "url": "http://x/cat.png"}"#,
                "unknown field `url`",
            ),
        ];
        for (part, expected) in cases {
            let text = format!(
                r#"{{"messages": [{{"role": "system", "content": "x"}},
                    {{"role": "user", "content": [{part}]}}]}}"#
            );
            let err = parse(&text, &dir.path().join("c.json"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{part}: {err}");
        }
    }

    const TRACE: &str = r#"{"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["city"]}}}],
        "messages": [
            {"role": "user", "content": "Umbrella?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}]},
            {"role": "tool", "tool_call_id": "a", "content": "Rain."},
            {"role": "tool", "tool_call_id": "b", "content": "Sun."},
            {"role": "assistant", "content": "Take one to Paris."},
            {"role": "user", "content": "Thanks"}
        ]}"#;

    #[test]
    fn an_agent_trace_keeps_its_calls_in_the_turn_they_answer() {
        let snapshot = parse_str(TRACE).unwrap();
        // The tool's schema as written, keys in their order.
        assert_eq!(
            snapshot.tools[0].as_str(),
            r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["city"]}}}"#
        );
        let lengths: Vec<usize> = snapshot.turns.iter().map(|t| t.messages.len()).collect();
        assert_eq!(
            lengths,
            [5, 1],
            "the calls and answers stay in the first turn"
        );
        let calls = &snapshot.turns[0].messages[1].tool_calls;
        // OpenAI's string and Transformers' object both become the object's text.
        assert_eq!(calls[0].arguments.as_str(), r#"{"city": "Paris"}"#);
        assert_eq!(calls[1].arguments.as_str(), r#"{"city": "Lyon"}"#);
        assert!(snapshot.turns[0].messages[1].parts.is_empty());
        assert_eq!(
            snapshot.turns[0].messages[3]
                .tool_call_id
                .as_ref()
                .map(|id| id.as_str()),
            lmhost_plugin_api::abi_stable::std_types::ROption::RSome("b")
        );
    }

    #[test]
    fn a_broken_trace_is_refused_naming_the_message() {
        let cases = [
            (
                TRACE.replace(r#""tool_call_id": "b""#, r#""tool_call_id": "z""#),
                "messages[3]: the tool message answers call \"z\"",
            ),
            (
                TRACE.replace(r#"{\"city\": \"Paris\"}"#, "Paris"),
                "messages[1]: tool call \"a\" (get_weather): its arguments must be a JSON object",
            ),
            (
                TRACE.replace(
                    r#"{"role": "user", "content": "Umbrella?"}"#,
                    r#"{"role": "user"}"#,
                ),
                "messages[0] has no `content`",
            ),
            (
                TRACE.replace(
                    r#""type": "function", "function": {"name": "get_weather", "arguments": {"#,
                    r#""type": "method", "function": {"name": "get_weather", "arguments": {"#,
                ),
                "unknown variant `method`, expected `function`",
            ),
            (
                TRACE.replace(
                    r#"[{"type": "function", "function": {"name": "get_weather", "parameters""#,
                    r#"["get_weather", {"function": {"name": "get_weather", "parameters""#,
                ),
                "tools[0] is not a JSON object",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_str(&text).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} should say {expected}");
            assert!(err.contains("c.json"), "{err} names the file");
        }
    }
}
