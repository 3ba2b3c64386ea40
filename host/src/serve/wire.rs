//! The OpenAI wire format, as far as `lmhost serve` speaks it.
//!
//! Requests refuse unknown fields, so a misspelt parameter is a `400` naming it rather than a
//! silently ignored setting. The few extensions that vLLM and SGLang also accept (`top_k`) are
//! listed as known fields. Responses carry the fields official clients read.

use lmhost_plugin_api::{FinishReason, GenerationRecord};

pub use crate::conversation::WireToolCall;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{AnyOfBuilder, ArrayBuilder, OneOfBuilder, Schema};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// Given to the chat template as `tools`. The reply is the model's text as it wrote it:
    /// a call the model writes is not parsed into `tool_calls`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Box<serde_json::value::RawValue>>>,
    /// Extension (vLLM): documents for the chat template, each with a string `text`.
    #[schema(value_type = Option<Vec<Object>>)]
    pub documents: Option<Vec<Box<serde_json::value::RawValue>>>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extension (vLLM, SGLang): 0 or absent means no top-k cut.
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub n: Option<u32>,
    pub user: Option<String>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: WireRole,
    /// May be null or left out in an assistant message with `tool_calls`.
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<WireToolCall>,
    pub tool_call_id: Option<String>,
}

/// Roles a message may have; `developer` is OpenAI's newer name for `system`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WireRole {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

#[derive(Debug)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A message's content: a string, or a list of text and image parts.
impl PartialSchema for Content {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(String::schema())
            .item(ArrayBuilder::new().items(ContentPart::schema()))
            .into()
    }
}

impl ToSchema for Content {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        <ContentPart as ToSchema>::schemas(schemas);
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match crate::conversation::text_or_parts(d)? {
            Ok(text) => Content::Text(text),
            Err(parts) => Content::Parts(parts),
        })
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

/// An image part's `image_url`: lmhost takes `data:` URLs (the image inline, base64).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageUrl {
    pub url: String,
    /// OpenAI's resolution hint; a model's processor decides the resolution, so it is read
    /// and ignored.
    #[serde(default)]
    pub detail: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub echo: Option<bool>,
    /// Extension (vLLM): accepted; this server always names tokens `token_id:N`.
    pub return_tokens_as_token_ids: Option<bool>,
    /// Legacy completions take a number: how many alternatives per token (only 0 or 1 here).
    pub logprobs: Option<u32>,
    pub stream: Option<bool>,
    pub n: Option<u32>,
    pub user: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    One(String),
    Many(Vec<String>),
    /// Token ids (vLLM's shape), for `echo` only: scored as given.
    Ids(Vec<u32>),
}

/// `POST /generate`, SGLang's native route, for scoring: a prompt (`text` or `input_ids`)
/// and the position its logprobs start at. Generation stays on `/v1/completions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerateRequest {
    pub text: Option<String>,
    pub input_ids: Option<Vec<u32>>,
    pub sampling_params: Option<SamplingParams>,
    pub return_logprob: Option<bool>,
    /// The first prompt position whose logprob is returned; absent or -1: the last.
    pub logprob_start_len: Option<i64>,
}

/// SGLang's sampling parameters, as far as scoring reads them.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    /// Only 0: this route scores, it does not generate.
    pub max_new_tokens: Option<u32>,
    /// Read and ignored: nothing is sampled.
    pub temperature: Option<f32>,
}

/// What `/generate` answers, in SGLang's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct Generated {
    pub text: String,
    pub meta_info: MetaInfo,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MetaInfo {
    pub id: String,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Of `prompt_tokens`, those the backend's prefix cache served.
    pub cached_tokens: u32,
    /// `[logprob, token_id, null]` for each prompt token from `logprob_start_len` on; the
    /// first token of a prompt has no logprob (`null`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Vec<Value>>>)]
    pub input_token_logprobs: Option<Vec<LogprobEntry>>,
}

/// `[logprob, token_id, text]`; the text is left out (`null`).
pub type LogprobEntry = (Option<f32>, u32, Option<String>);

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: Prompt,
    pub encoding_format: Option<EncodingFormat>,
    pub user: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    Float,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl Usage {
    /// A finished generation's token counts.
    pub fn of(record: &GenerationRecord) -> Self {
        Usage::new(
            record.prompt_tokens,
            record.token_ids.len() as u32,
            record.cached_prompt_tokens,
        )
    }

    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
    /// vLLM's extension: the stop string that ended generation, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

/// A generated token's logprob. Backends return ids, not token text, so `token` is
/// `token_id:N`, vLLM's spelling for `return_tokens_as_token_ids`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
    #[schema(value_type = Vec<Object>)]
    pub top_logprobs: Vec<()>,
}

impl TokenLogprob {
    pub fn new(id: u32, logprob: f32) -> Self {
        TokenLogprob {
            token: format!("token_id:{id}"),
            logprob,
            bytes: None,
            top_logprobs: Vec::new(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    pub usage: Usage,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: &'static str,
}

/// The legacy completions logprobs: parallel arrays, `null` where a token has no logprob.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub top_logprobs: Option<Vec<()>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: Vec<f32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

/// `POST /tokenize`, in vLLM's shape (`prompt` or `messages`, `add_special_tokens`,
/// `return_token_strs`) or llama.cpp's (`content`, `add_special`, `with_pieces`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub content: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    /// With `messages`: the chat template's `tools` and `documents`, as in a chat request.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Vec<Box<serde_json::value::RawValue>>>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub documents: Option<Vec<Box<serde_json::value::RawValue>>>,
    /// Only `true` (the default): the chat template always opens the assistant's turn.
    pub add_generation_prompt: Option<bool>,
    pub add_special_tokens: Option<bool>,
    pub add_special: Option<bool>,
    pub return_token_strs: Option<bool>,
    pub with_pieces: Option<bool>,
}

/// `POST /detokenize` (vLLM and llama.cpp both send `tokens`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// What `/tokenize` answers: the fields vLLM's clients read (`count`, `tokens`, `token_strs`)
/// and llama.cpp's (`tokens` as id and piece pairs when asked `with_pieces`).
#[derive(Debug, Serialize, ToSchema)]
pub struct Tokenized {
    pub count: usize,
    pub tokens: TokenList,
    pub token_strs: Option<Vec<String>>,
    /// For a conversation with images: 1 for each image placeholder token, 0 for others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_token_type_ids: Option<Vec<u8>>,
    /// For a conversation with images: each image's placeholder tokens and patches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<ImageTokenCount>>,
}

/// The ids alone, or with their pieces: `anyOf`, since an empty list is both.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum TokenList {
    Ids(Vec<u32>),
    Pieces(Vec<TokenPiece>),
}

impl PartialSchema for TokenList {
    fn schema() -> RefOr<Schema> {
        AnyOfBuilder::new()
            .item(Vec::<u32>::schema())
            .item(Vec::<TokenPiece>::schema())
            .into()
    }
}

impl ToSchema for TokenList {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((TokenPiece::name().into(), TokenPiece::schema()));
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenPiece {
    pub id: u32,
    pub piece: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ImageTokenCount {
    pub tokens: u32,
    pub patches: u32,
}

/// What `/detokenize` answers: the text under vLLM's name and llama.cpp's.
#[derive(Debug, Serialize, ToSchema)]
pub struct Detokenized {
    pub prompt: String,
    pub content: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

/// Server properties in llama.cpp's shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct Props {
    pub model: String,
    pub server: &'static str,
    pub version: &'static str,
}

/// OpenAI's name for why a generation ended.
pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Eos | FinishReason::StopString => "stop",
        FinishReason::Length => "length",
    }
}
