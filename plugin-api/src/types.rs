//! Domain types that cross the plugin boundary.
//!
//! Every type here is `StableAbi` (so a plugin built separately agrees on its layout) and serde
//! (so the host reads and writes it as JSON). Changing a field here is an ABI break: see
//! ARCHITECTURE.md, "ABI rules".

use abi_stable::std_types::{ROption, RString, RVec};
use abi_stable::StableAbi;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::PluginError;

/// Who speaks a message.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// Text that goes into the prompt verbatim, with no chat template: how base models are
    /// driven and raw continuations scored. A conversation is all raw or has no raw message.
    Raw,
    /// A tool's result, answering an assistant message's call (`Message::tool_call_id`).
    Tool,
    /// A document given to the model (`ConversationSnapshot::documents`), as explain's players
    /// name it; no message has this role.
    Document,
}

impl Role {
    /// The lowercase name chat templates expect.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Raw => "raw",
            Role::Tool => "tool",
            Role::Document => "document",
        }
    }
}

/// Mono audio as f32 samples in [-1, 1].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Audio {
    pub samples: RVec<f32>,
    pub sample_rate: u32,
}

impl Audio {
    /// Hex sha256 of the samples as f32 little-endian bytes followed by the sample rate as u32
    /// little-endian: equal exactly when the samples (bit for bit) and the rate are.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        let mut bytes = Vec::with_capacity(4 * 4096);
        for chunk in self.samples.chunks(4096) {
            bytes.clear();
            bytes.extend(chunk.iter().flat_map(|s| s.to_le_bytes()));
            hasher.update(&bytes);
        }
        hasher.update(self.sample_rate.to_le_bytes());
        hex(&hasher.finalize())
    }
}

/// `bytes` as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An image as RGB pixels, 8 bits a channel, row by row from the top left, upright (the host
/// has applied its EXIF orientation). In JSON the pixels are base64, not an array of numbers.
#[repr(C)]
#[derive(StableAbi, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    pub width: u32,
    pub height: u32,
    /// `width * height * 3` bytes.
    #[serde(with = "pixels")]
    pub rgb: RVec<u8>,
}

impl Image {
    /// An image of `width x height` pixels from `rgb`, refused unless it holds exactly
    /// `width * height` RGB pixels and neither side is zero.
    pub fn new(width: u32, height: u32, rgb: Vec<u8>) -> Result<Self, PluginError> {
        let expected = u64::from(width) * u64::from(height) * 3;
        if width == 0 || height == 0 || rgb.len() as u64 != expected {
            return Err(PluginError::invalid_input(format!(
                "an image of {width}x{height} pixels needs {expected} RGB bytes, not {}",
                rgb.len()
            )));
        }
        Ok(Image {
            width,
            height,
            rgb: rgb.into(),
        })
    }

    /// Hex sha256 of the width and height (u32 little-endian) and the pixels: equal exactly
    /// when the images are, pixel for pixel.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.width.to_le_bytes());
        hasher.update(self.height.to_le_bytes());
        hasher.update(self.rgb.as_slice());
        hex(&hasher.finalize())
    }
}

/// Debug without the pixels, which would flood a log.
impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("width", &self.width)
            .field("height", &self.height)
            .finish_non_exhaustive()
    }
}

/// Pixels as base64 in JSON: a third larger than the bytes, where an array of numbers is about
/// four times larger and slow to hash (a snapshot's id hashes its JSON).
mod pixels {
    use abi_stable::std_types::RVec;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(rgb: &RVec<u8>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(rgb.as_slice()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RVec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(text)
            .map(RVec::from)
            .map_err(serde::de::Error::custom)
    }
}

/// One piece of a message.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Part {
    Text { text: RString },
    Audio { audio: Audio },
    Image { image: Image },
}

impl Part {
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text {
            text: RString::from(text.into()),
        }
    }
}

/// An assistant's call of a tool, as OpenAI's API carries it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// Unique in the conversation; the `tool` message that answers the call names it.
    pub id: RString,
    /// The function called.
    pub name: RString,
    /// The arguments: the text of a JSON object.
    pub arguments: RString,
}

#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    pub parts: RVec<Part>,
    /// An assistant message's calls of tools.
    #[serde(default, skip_serializing_if = "RVec::is_empty")]
    pub tool_calls: RVec<ToolCall>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "ROption::is_none")]
    pub tool_call_id: ROption<RString>,
}

impl Message {
    /// A message of `parts`, with no tool call.
    pub fn new(role: Role, parts: Vec<Part>) -> Self {
        Message {
            role,
            parts: parts.into(),
            tool_calls: RVec::new(),
            tool_call_id: ROption::RNone,
        }
    }

    /// A message holding one text part.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self::new(role, vec![Part::text(text)])
    }

    /// This message with `parts` instead of its own; its tool calls and call id stay.
    pub fn with_parts(&self, parts: Vec<Part>) -> Self {
        Message {
            role: self.role,
            parts: parts.into(),
            tool_calls: self.tool_calls.clone(),
            tool_call_id: self.tool_call_id.clone(),
        }
    }

    /// The text parts joined; audio and images contribute nothing.
    pub fn text_content(&self) -> String {
        self.parts
            .iter()
            .filter_map(|part| match part {
                Part::Text { text } => Some(text.as_str()),
                Part::Audio { .. } | Part::Image { .. } => None,
            })
            .collect()
    }

    pub fn has_audio(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Audio { .. }))
    }

    pub fn has_images(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Image { .. }))
    }
}

/// A user's message(s) and, in earlier turns, the assistant's answer.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub messages: RVec<Message>,
}

/// A conversation as a backend sees it: non-empty turns of non-empty messages, the tools it
/// may call, and a content id.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SnapshotWire")]
pub struct ConversationSnapshot {
    pub turns: RVec<Turn>,
    /// First 16 hex chars of the sha256 of the canonical JSON of `turns` (and of `tools`,
    /// where there are any).
    pub snapshot_id: RString,
    /// The tools the model is told of (the chat template's `tools`): each the text of a JSON
    /// object, in OpenAI's shape (`{"type": "function", "function": {...}}`).
    #[serde(
        default,
        skip_serializing_if = "RVec::is_empty",
        serialize_with = "json_texts::serialize"
    )]
    pub tools: RVec<RString>,
    /// The documents the model is given to ground its answer (the chat template's
    /// `documents`, as Transformers passes them): each the text of a JSON object with a string
    /// `text` (and what else the template reads: `title`, `doc_id`, ...).
    #[serde(
        default,
        skip_serializing_if = "RVec::is_empty",
        serialize_with = "json_texts::serialize"
    )]
    pub documents: RVec<RString>,
}

/// The serde shape of a snapshot; the id is recomputed, and checked when given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotWire {
    turns: Vec<Turn>,
    #[serde(default)]
    snapshot_id: Option<String>,
    #[serde(default)]
    tools: Vec<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    documents: Vec<Box<serde_json::value::RawValue>>,
}

impl TryFrom<SnapshotWire> for ConversationSnapshot {
    type Error = PluginError;

    fn try_from(wire: SnapshotWire) -> Result<Self, PluginError> {
        let texts = |raw: &[Box<serde_json::value::RawValue>]| -> Vec<RString> {
            raw.iter().map(|t| RString::from(t.get())).collect()
        };
        let grounding = Grounding {
            tools: texts(&wire.tools),
            documents: texts(&wire.documents),
        };
        let snapshot = ConversationSnapshot::grounded(wire.turns, grounding)?;
        match wire.snapshot_id {
            Some(id) if id != snapshot.snapshot_id.as_str() => {
                Err(PluginError::invalid_input(format!(
                    "snapshot_id {id:?} does not match its turns (expected {:?})",
                    snapshot.snapshot_id
                )))
            }
            _ => Ok(snapshot),
        }
    }
}

/// JSON texts written as the JSON they hold, not as strings.
mod json_texts {
    use abi_stable::std_types::{RString, RVec};
    use serde::ser::{Error, SerializeSeq};
    use serde::Serializer;
    use serde_json::value::RawValue;

    pub fn serialize<S: Serializer>(texts: &RVec<RString>, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(texts.len()))?;
        for text in texts {
            let raw: &RawValue = serde_json::from_str(text).map_err(S::Error::custom)?;
            seq.serialize_element(raw)?;
        }
        seq.end()
    }
}

/// What a conversation gives the model beside its messages: tools it may call and documents
/// to ground its answer, each the text of a JSON object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grounding {
    pub tools: Vec<RString>,
    pub documents: Vec<RString>,
}

impl ConversationSnapshot {
    /// Builds a snapshot with no tools or documents: [`ConversationSnapshot::grounded`].
    pub fn new(turns: Vec<Turn>) -> Result<Self, PluginError> {
        Self::grounded(turns, Grounding::default())
    }

    /// Builds a snapshot, refusing an empty conversation, an empty turn, raw text mixed with
    /// chat messages (a template cannot render one, and raw text has no roles), a tool that is
    /// not a JSON object, a document that is not one with a string `text`, and a tool call and
    /// its answers that do not match ([`check_tool_calls`]).
    pub fn grounded(turns: Vec<Turn>, grounding: Grounding) -> Result<Self, PluginError> {
        let Grounding { tools, documents } = grounding;
        if turns.is_empty() {
            return Err(PluginError::invalid_input(
                "a conversation needs at least one turn",
            ));
        }
        if let Some(i) = turns.iter().position(|t| t.messages.is_empty()) {
            return Err(PluginError::invalid_input(format!(
                "turn {i} has no messages; every turn needs at least one"
            )));
        }
        let messages = turns.iter().flat_map(|t| t.messages.iter());
        let raw = messages.clone().filter(|m| m.role == Role::Raw).count();
        if raw > 0 && raw < messages.clone().count() {
            return Err(PluginError::invalid_input(
                "raw text cannot be mixed with system, user, assistant or tool messages: \
                 a conversation is either all `raw` (no chat template) or all chat messages",
            ));
        }
        if raw > 0 && !(tools.is_empty() && documents.is_empty()) {
            return Err(PluginError::invalid_input(
                "raw text has no chat template to give the model tools or documents; drop \
                 them or send chat messages",
            ));
        }
        for (k, tool) in tools.iter().enumerate() {
            json_object(tool).map_err(|e| {
                PluginError::invalid_input(format!("tools[{k}] is not a JSON object: {e}"))
            })?;
        }
        for (k, document) in documents.iter().enumerate() {
            document_text(document).map_err(|e| {
                PluginError::invalid_input(format!(
                    "documents[{k}] is not a JSON object with a string `text`: {e}"
                ))
            })?;
        }
        if messages.clone().any(|m| m.role == Role::Document) {
            return Err(PluginError::invalid_input(
                "`document` is not a message's role: give documents in the conversation's \
                 `documents`",
            ));
        }
        check_tool_calls(messages)?;
        let turns = RVec::from(turns);
        let (tools, documents) = (RVec::from(tools), RVec::from(documents));
        let snapshot_id = RString::from(snapshot_id(&turns, &tools, &documents));
        Ok(ConversationSnapshot {
            turns,
            snapshot_id,
            tools,
            documents,
        })
    }

    /// A one-turn conversation of a single user message.
    pub fn from_prompt(prompt: impl Into<String>) -> Self {
        let turn = Turn {
            messages: RVec::from(vec![Message::text(Role::User, prompt)]),
        };
        Self::new(vec![turn]).expect("one turn with one message is never empty")
    }

    /// Raw text, sent to the model verbatim with no chat template.
    pub fn raw(text: impl Into<String>) -> Self {
        let turn = Turn {
            messages: RVec::from(vec![Message::text(Role::Raw, text)]),
        };
        Self::new(vec![turn]).expect("one turn with one message is never empty")
    }

    /// Whether this is raw text (no chat template applies).
    pub fn is_raw(&self) -> bool {
        self.messages().all(|m| m.role == Role::Raw)
    }

    /// The raw text: every message's text, concatenated. Meaningful when [`Self::is_raw`].
    pub fn raw_text(&self) -> String {
        self.messages().map(Message::text_content).collect()
    }

    /// Every message in order, across turns.
    pub fn messages(&self) -> impl Iterator<Item = &Message> {
        self.turns.iter().flat_map(|t| t.messages.iter())
    }

    pub fn has_audio(&self) -> bool {
        self.messages().any(Message::has_audio)
    }

    pub fn has_images(&self) -> bool {
        self.messages().any(Message::has_images)
    }
}

/// Canonical JSON is serde_json's output for the turns: struct fields in declaration order, no
/// whitespace, floats in shortest round-trip form, so it is the same on every run and platform.
/// The tools and the documents follow as their texts, only where there are any, so a
/// conversation without them keeps the id it always had.
fn snapshot_id(turns: &RVec<Turn>, tools: &RVec<RString>, documents: &RVec<RString>) -> String {
    let mut hasher = Sha256::new();
    hasher.update(serde_json::to_vec(turns).expect("turns always serialize"));
    for (name, texts) in [("tools", tools), ("documents", documents)] {
        if !texts.is_empty() {
            hasher.update(name);
            hasher.update(serde_json::to_vec(texts).expect("strings always serialize"));
        }
    }
    hex(&hasher.finalize()[..8])
}

/// A document's `text`, where `document` is a JSON object with a string `text`.
pub fn document_text(document: &str) -> Result<String, String> {
    match json_object(document)?.remove("text") {
        Some(serde_json::Value::String(text)) => Ok(text),
        Some(other) => Err(format!("its `text` is {other}")),
        None => Err("it has no `text`".into()),
    }
}

/// The JSON object `document` with its `text` replaced, its keys in their order.
pub fn document_with_text(document: &str, text: &str) -> String {
    let Ok(Fields(fields)) = serde_json::from_str::<Fields>(document) else {
        return document.to_string();
    };
    let value = |key: &str, raw: &serde_json::value::RawValue| match key {
        "text" => serde_json::to_string(text).unwrap_or_default(),
        _ => raw.get().to_string(),
    };
    let body: Vec<String> = (fields.iter())
        .map(|(key, raw)| {
            format!(
                "{}: {}",
                serde_json::Value::from(key.as_str()),
                value(key, raw)
            )
        })
        .collect();
    format!("{{{}}}", body.join(", "))
}

/// A JSON object's fields in their order, their values as written.
struct Fields(Vec<(String, Box<serde_json::value::RawValue>)>);

impl<'de> serde::Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    fields.push(entry);
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// `text` parsed, where it is a JSON object.
fn json_object(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("it holds {other}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Tool calls and their answers must match as OpenAI's API has them: only an assistant message
/// calls, each call has a unique id, a name and arguments that are a JSON object, and each
/// `tool` message answers, once, a call made before it.
fn check_tool_calls<'a>(messages: impl Iterator<Item = &'a Message>) -> Result<(), PluginError> {
    let invalid =
        |m: usize, what: String| Err(PluginError::invalid_input(format!("messages[{m}]: {what}")));
    // Per call id: the message that made it, and the one that answered it.
    let mut calls: std::collections::HashMap<&str, (usize, Option<usize>)> = Default::default();
    for (m, message) in messages.enumerate() {
        if !message.tool_calls.is_empty() && message.role != Role::Assistant {
            return invalid(
                m,
                format!(
                    "a {} message has `tool_calls`; only assistant messages call tools",
                    message.role.as_str()
                ),
            );
        }
        for call in message.tool_calls.iter() {
            let what = format!("tool call {:?} ({})", call.id.as_str(), call.name.as_str());
            if call.id.is_empty() || call.name.is_empty() {
                return invalid(
                    m,
                    format!("{what} needs a non-empty `id` and function `name`"),
                );
            }
            if let Err(e) = json_object(&call.arguments) {
                return invalid(
                    m,
                    format!("{what}: its arguments must be a JSON object ({e})"),
                );
            }
            if let Some((first, _)) = calls.insert(call.id.as_str(), (m, None)) {
                return invalid(
                    m,
                    format!("{what} reuses the id of a call in messages[{first}]; ids are unique"),
                );
            }
        }
        match (message.role, message.tool_call_id.as_ref()) {
            (Role::Tool, ROption::RSome(id)) => match calls.get_mut(id.as_str()) {
                None => {
                    return invalid(
                        m,
                        format!(
                            "the tool message answers call {:?}, which no assistant message \
                             before it made",
                            id.as_str()
                        ),
                    )
                }
                Some((_, Some(answered))) => {
                    return invalid(
                        m,
                        format!(
                            "call {:?} was already answered by messages[{answered}]",
                            id.as_str()
                        ),
                    )
                }
                Some((_, answer)) => *answer = Some(m),
            },
            (Role::Tool, ROption::RNone) => {
                return invalid(
                    m,
                    "a tool message needs `tool_call_id`, the id of the call it answers".into(),
                )
            }
            (_, ROption::RSome(_)) => {
                return invalid(
                    m,
                    format!(
                        "a {} message has `tool_call_id`; only tool messages answer calls",
                        message.role.as_str()
                    ),
                )
            }
            (_, ROption::RNone) => {}
        }
    }
    Ok(())
}

/// How to generate. Validated by the host before it reaches a backend.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenerationConfig {
    pub max_new_tokens: u32,
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: u32,
    /// 1 means no nucleus cut.
    pub top_p: f32,
    pub seed: u64,
    /// Generation stops when the text ends with any of these; the stop string is not returned.
    pub stop: RVec<RString>,
    pub compute_embeddings: bool,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_new_tokens: 128,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            stop: RVec::new(),
            compute_embeddings: false,
        }
    }
}

impl GenerationConfig {
    /// Checks every field's range; the error names the field, its value and the limit.
    pub fn validate(&self) -> Result<(), PluginError> {
        if self.max_new_tokens == 0 {
            return Err(PluginError::config(
                "`max_new_tokens` must be >= 1. Given: 0",
            ));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(PluginError::config(format!(
                "`temperature` must be a finite number >= 0. Given: {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(PluginError::config(format!(
                "`top_p` must be > 0 and <= 1. Given: {}",
                self.top_p
            )));
        }
        if let Some(i) = self.stop.iter().position(|s| s.is_empty()) {
            return Err(PluginError::config(format!(
                "`stop[{i}]` is empty; stop strings must have at least one character"
            )));
        }
        Ok(())
    }
}

/// Why generation ended.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model produced its end-of-sequence token.
    Eos,
    /// The text reached one of `GenerationConfig::stop`.
    StopString,
    /// `max_new_tokens` were generated.
    Length,
}

/// Generated tokens as they come (`generate_stream`): their ids, logprobs and the text they add.
/// The text may lag the ids: bytes of an unfinished character, or what could be the start of a
/// stop string, wait for the tokens that settle them.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenDelta {
    pub token_ids: RVec<u32>,
    pub logprobs: RVec<f32>,
    pub text: RString,
}

impl From<&GenerationRecord> for TokenDelta {
    /// A whole reply as one delta: how a backend that does not stream hands it over.
    fn from(record: &GenerationRecord) -> Self {
        TokenDelta {
            token_ids: record.token_ids.clone(),
            logprobs: record.logprobs.clone(),
            text: record.text.clone(),
        }
    }
}

/// What `generate` returns.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRecord {
    pub text: RString,
    pub token_ids: RVec<u32>,
    /// One per generated token: log-softmax of the raw logits, before temperature/top-k/top-p.
    pub logprobs: RVec<f32>,
    /// Static embedding of the reply (mean of its input-embedding rows).
    pub embedding: ROption<RVec<f32>>,
    /// Contextual embedding of the reply (mean of its last hidden states).
    pub contextual_embedding: ROption<RVec<f32>>,
    pub prompt_tokens: u32,
    /// How many of `prompt_tokens` came from a prefix cache instead of being computed.
    pub cached_prompt_tokens: u32,
    pub finish_reason: FinishReason,
}

impl GenerationRecord {
    /// A record of `text` alone: no tokens, logprobs or embeddings, finished at end of sequence.
    pub fn from_text(text: impl Into<String>) -> Self {
        GenerationRecord {
            text: RString::from(text.into()),
            token_ids: RVec::new(),
            logprobs: RVec::new(),
            embedding: ROption::RNone,
            contextual_embedding: ROption::RNone,
            prompt_tokens: 0,
            cached_prompt_tokens: 0,
            finish_reason: FinishReason::Eos,
        }
    }
}

/// A byte range `start..end` of one message's text: message `message` counts the snapshot's
/// messages in order across turns, and the range lies on UTF-8 character boundaries of that
/// message's text parts joined (`Message::text_content`). `score_hidden` hides such ranges.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextSpan {
    pub message: u32,
    pub start: u32,
    pub end: u32,
}

/// A box `[x0, y0, x1, y1]` in the pixels of one image (x1 and y1 excluded): image `image`
/// counts the images of message `message` (counted across turns, as [`TextSpan`]'s) in order.
/// `score_hidden` hides the image's tokens that cover any of it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageBox {
    pub message: u32,
    pub image: u32,
    pub bounds: [u32; 4],
}

/// A stretch `start..end` of one audio clip's samples, at the clip's own sample rate: clip
/// `audio` counts the audio parts of message `message` (counted across turns, as
/// [`TextSpan`]'s) in order. `score_hidden` hides what the model heard of it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AudioSpan {
    pub message: u32,
    pub audio: u32,
    pub start: u32,
    pub end: u32,
}

/// What the entries of a `score_hidden` call choose from, by one index: the text `spans`
/// first, then the image `boxes`, then the audio `clips`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hideable {
    pub spans: RVec<TextSpan>,
    pub boxes: RVec<ImageBox>,
    pub clips: RVec<AudioSpan>,
}

/// One of a [`Hideable`]'s parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenPart<'a> {
    Span(&'a TextSpan),
    Box(&'a ImageBox),
    Clip(&'a AudioSpan),
}

/// The parts one `score_hidden` entry hides, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hidden<'a> {
    pub spans: Vec<&'a TextSpan>,
    pub boxes: Vec<&'a ImageBox>,
    pub clips: Vec<&'a AudioSpan>,
}

impl Hideable {
    pub fn len(&self) -> usize {
        self.spans.len() + self.boxes.len() + self.clips.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The part with index `i` (spans, then boxes, then clips), if there is one.
    pub fn get(&self, i: u32) -> Option<HiddenPart<'_>> {
        let i = i as usize;
        let (spans, boxes) = (self.spans.len(), self.boxes.len());
        if i < spans {
            Some(HiddenPart::Span(&self.spans[i]))
        } else if i < spans + boxes {
            Some(HiddenPart::Box(&self.boxes[i - spans]))
        } else {
            self.clips.get(i - spans - boxes).map(HiddenPart::Clip)
        }
    }

    /// The parts `entry` lists, by kind (an index past the last part is skipped).
    pub fn hidden(&self, entry: &[u32]) -> Hidden<'_> {
        let mut out = Hidden::default();
        for part in entry.iter().filter_map(|&i| self.get(i)) {
            match part {
                HiddenPart::Span(s) => out.spans.push(s),
                HiddenPart::Box(b) => out.boxes.push(b),
                HiddenPart::Clip(c) => out.clips.push(c),
            }
        }
        out
    }
}

/// What `score` returns: the teacher-forced log-probabilities of a given reply.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreRecord {
    pub token_ids: RVec<u32>,
    pub logprobs: RVec<f32>,
    pub prompt_tokens: u32,
    pub cached_prompt_tokens: u32,
}

impl ScoreRecord {
    /// The log-probability of the whole reply.
    pub fn total_logprob(&self) -> f64 {
        self.logprobs.iter().map(|&l| f64::from(l)).sum()
    }
}

/// What `tokenize` returns: the prompt's token ids and each token's text, and for a prompt
/// with images what each position holds and what each image became.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRecord {
    pub token_ids: RVec<u32>,
    /// One per id: the token's own text (a piece of a multi-byte character decodes lossily).
    pub pieces: RVec<RString>,
    /// One per id where the prompt has images, else empty: 0 text, 1 image (2 video), an
    /// image's start, end, row and column markers counted as image (Transformers'
    /// `mm_token_type_ids`, with the design document's rule for markers).
    #[serde(default)]
    pub mm_token_type_ids: RVec<u8>,
    /// Per image, in prompt order: its placeholder tokens and patches.
    #[serde(default)]
    pub images: RVec<ImageTokens>,
}

impl TokenizeRecord {
    /// A prompt of text alone.
    pub fn text(token_ids: Vec<u32>, pieces: Vec<RString>) -> Self {
        TokenizeRecord {
            token_ids: token_ids.into(),
            pieces: pieces.into(),
            mm_token_type_ids: RVec::new(),
            images: RVec::new(),
        }
    }
}

/// What one image becomes in a prompt.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageTokens {
    /// Placeholder tokens, each replaced by one vector of image features (markers not counted).
    pub tokens: u32,
    /// The patches (tiles) the image is cut into, the whole image's view included.
    pub patches: u32,
}

/// What `embed` returns for one text: its vector and how many tokens the model read.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingRecord {
    pub embedding: RVec<f32>,
    pub prompt_tokens: u32,
}

/// Counters since the backend was made (or its cache last reconfigured).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStats {
    pub kv_cache_hits: u64,
    pub kv_cache_misses: u64,
    pub kv_cache_reused_tokens: u64,
    pub kv_cache_evictions: u64,
    pub kv_cache_bytes: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
}

/// What a backend can do; the host checks these before asking.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub returns_logprobs: bool,
    pub scores_continuations: bool,
    pub audio_input: bool,
    pub prefix_cache: bool,
    pub embeddings: bool,
    /// Takes image parts (a backend that cannot know before its model loads says `true`, and
    /// refuses images on use).
    pub image_input: bool,
    /// `score_hidden` works.
    pub hides: bool,
}

/// The host's `[kv_cache]` settings, passed on to the backend.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheSettings {
    pub enabled: bool,
    pub max_entries: u64,
    /// 0 means no byte budget.
    pub max_bytes: u64,
}
