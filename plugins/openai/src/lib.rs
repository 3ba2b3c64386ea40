//! `openai`: a backend that drives any OpenAI-compatible server (vLLM, SGLang, llama.cpp's
//! server, `lmhost serve`, OpenAI itself).
//!
//! Users who outgrow one machine run an inference engine; lmhost drives it rather than
//! reimplementing it. `generate` uses `/v1/chat/completions` with logprobs; `score` takes the
//! best route to prompt logprobs the server has (see [`score`]). The server's prefix cache shows
//! up as `cached_prompt_tokens` where it reports `usage.prompt_tokens_details.cached_tokens`.
//!
//! Raw text goes to `/v1/completions` as it is.
//!
//! Modules: [`client`] (blocking HTTP, retries, error kinds), [`flavor`] (which server),
//! [`chat`] (generate's wire format), [`completion`] (generate from raw text), [`score`],
//! [`tokens`] (the server's `/tokenize` and `/detokenize`). Prompts for scoring are rendered by
//! `lmhost-plugin-kit`'s chat templates.

pub mod abilities;
pub mod chat;
pub mod client;
pub mod completion;
pub mod flavor;
pub mod score;
pub mod tokens;

use std::sync::Mutex;
use std::time::Duration;

use lmhost_plugin_api::serde_json::{json, Map, Value};
use lmhost_plugin_api::{
    Backend, BackendStats, Capabilities, ConversationSnapshot, GenerationConfig, GenerationRecord,
    Logger, OptionKind, OptionSpec, PluginContext, PluginError, ScoreRecord, TokenDelta,
    TokenizeRecord,
};
use lmhost_plugin_kit::concurrent;
use lmhost_plugin_kit::prompt::PromptFormat;
use lmhost_plugin_kit::template::ChatTemplate;

use abilities::{Abilities, Scoring};
use client::{Client, ClientConfig};
use flavor::Flavor;

/// Used when neither the option nor `OPENAI_BASE_URL` names a server: vLLM's default address.
pub const DEFAULT_BASE_URL: &str = "http://127.0.0.1:8000/v1";

pub struct OpenAi {
    client: Client,
    flavor: Flavor,
    abilities: Abilities,
    model: String,
    /// How chat prompts are written for scoring (the server renders them for generation).
    format: PromptFormat,
    stats: Mutex<BackendStats>,
}

impl Backend for OpenAi {
    const NAME: &'static str = "openai";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn options() -> Vec<OptionSpec> {
        vec![
            OptionSpec::new(
                "base_url",
                OptionKind::String,
                Value::Null,
                "The server's API root, e.g. http://127.0.0.1:8000/v1 (default: $OPENAI_BASE_URL, else that).",
            ),
            OptionSpec::new(
                "api_key_env",
                OptionKind::String,
                Value::Null,
                "Name of the environment variable holding the API key (default: OPENAI_API_KEY, if set).",
            ),
            OptionSpec::new(
                "model",
                OptionKind::String,
                Value::Null,
                "The server-side model name (default: model_id, else the server's first model).",
            ),
            OptionSpec::choice(
                "flavor",
                &flavor::CHOICES,
                "auto",
                "Which server: decides top_k, token ids and the scoring route; auto asks /v1/models.",
            ),
            OptionSpec::new("timeout_s", OptionKind::Integer, json!(600), "Per-request timeout."),
            OptionSpec::new(
                "max_retries",
                OptionKind::Integer,
                json!(3),
                "Retries on connection errors, 429 and 5xx (never on other 4xx).",
            ),
            OptionSpec::new(
                "backoff_ms",
                OptionKind::Integer,
                json!(250),
                "First retry delay; doubles per retry, with jitter.",
            ),
            OptionSpec::new(
                "concurrency",
                OptionKind::Integer,
                json!(16),
                "Most requests in flight to the server at once.",
            ),
            OptionSpec::new(
                "chat_template",
                OptionKind::String,
                Value::Null,
                "For scoring: the model's tokenizer_config.json, a Jinja chat template file, or \"plain\" (default: the server's /props).",
            ),
        ]
    }

    fn new(context: PluginContext) -> Result<Self, PluginError> {
        let options = context.options()?;
        let text = |key: &str| options.get(key).and_then(Value::as_str).map(str::to_string);
        let int =
            |key: &str, default: u64| options.get(key).and_then(Value::as_u64).unwrap_or(default);
        let base_url = text("base_url")
            .or_else(|| std::env::var("OPENAI_BASE_URL").ok())
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let base_url = base_url.trim_end_matches('/').to_string();
        let client = Client::new(
            ClientConfig {
                base_url,
                api_key: api_key(&options)?,
                timeout: Duration::from_secs(int("timeout_s", 600).max(1)),
                max_retries: int("max_retries", 3).min(20) as u32,
                concurrency: int("concurrency", 16).max(1) as usize,
                backoff: Duration::from_millis(int("backoff_ms", 250)),
            },
            context.logger.clone(),
        );
        let mut model = text("model").unwrap_or_else(|| context.model_id.to_string());
        let chosen = text("flavor").and_then(|f| Flavor::parse(&f));
        let (flavor, abilities) = match chosen {
            Some(flavor) if !model.is_empty() => (flavor, Abilities::of(flavor)),
            _ => {
                let url = format!("{}/models", client.base_url());
                let models = client.get(&url)?;
                if model.is_empty() {
                    model = models
                        .pointer("/data/0/id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            PluginError::config(format!(
                                "no `model` option or model_id, and {url} lists no model"
                            ))
                        })?
                        .to_string();
                }
                let named = Flavor::from_models(&models).unwrap_or(Flavor::OpenAi);
                match chosen {
                    Some(flavor) => (flavor, Abilities::of(flavor)),
                    None => (named, Abilities::probe(&client, &model, named)),
                }
            }
        };
        let option = text("chat_template");
        // Only a server that can score needs the template: it renders chat for generation.
        let published = (option.is_none() && abilities.scoring != Scoring::None)
            .then(|| server_template(&client, &context.logger))
            .flatten();
        let format = PromptFormat::choose(option.as_deref(), published)?;
        let templated = if matches!(format, PromptFormat::None) {
            "no chat template (raw text only)"
        } else {
            "chat template found"
        };
        context.logger.info(&format!(
            "{flavor} server at {}, model `{model}`: {abilities}; {templated}",
            client.base_url(),
        ));
        Ok(OpenAi {
            client,
            flavor,
            abilities,
            model,
            format,
            stats: Mutex::default(),
        })
    }

    fn model_id(&self) -> String {
        self.model.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            returns_logprobs: true,
            scores_continuations: self.abilities.scoring != Scoring::None
                && !matches!(self.format, PromptFormat::None),
            audio_input: false,
            image_input: false,
            hides: false,
            prefix_cache: true,
            embeddings: false,
        }
    }

    fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord, PluginError> {
        if snapshot.has_audio() || snapshot.has_images() {
            return Err(PluginError::invalid_input(
                "the openai backend sends text only; this conversation has audio or an image",
            ));
        }
        let record = if snapshot.is_raw() {
            let body = completion::request(&self.model, self.flavor, snapshot, config);
            let answer = self.client.post("/completions", &body)?;
            let url = format!("{}/completions", self.client.base_url());
            completion::record(&answer, &url)?
        } else {
            let body = chat::request(&self.model, self.flavor, snapshot, config);
            let answer = self.client.post("/chat/completions", &body)?;
            let url = format!("{}/chat/completions", self.client.base_url());
            chat::record(&answer, &url)?
        };
        Ok(self.finish(record))
    }

    /// A chat relays the server's own event stream, delta by delta (a sink's `false` drops the
    /// connection, so the server stops too); raw text completes whole, then hands over.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        if snapshot.is_raw() || snapshot.has_audio() || snapshot.has_images() {
            let record = self.generate(snapshot, config)?;
            sink(&TokenDelta::from(&record));
            return Ok(record);
        }
        let mut body = chat::request(&self.model, self.flavor, snapshot, config);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut streamed = chat::Streamed::default();
        self.client
            .post_events("/chat/completions", &body, |chunk| {
                sink(&streamed.take(chunk))
            })?;
        Ok(self.finish(streamed.record()))
    }

    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        let scorer = score::Scorer {
            client: &self.client,
            flavor: self.flavor,
            abilities: self.abilities,
            format: &self.format,
            model: &self.model,
        };
        let record = scorer.score(snapshot, reply)?;
        self.account(record.prompt_tokens, record.cached_prompt_tokens, 0);
        Ok(record)
    }

    /// A pool of `concurrency` workers takes the prompts in the order given (`lmhost explain`
    /// sends them sorted, so the server's own prefix cache hits) and keeps the server's batcher
    /// busy; one thread per worker, not per prompt.
    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        concurrent::each(snapshots, self.client.concurrency(), |snapshot| {
            self.score(snapshot, reply)
        })
    }

    /// Concurrent requests, as `score_batch` sends them: the server decodes them together.
    fn generate_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        config: &GenerationConfig,
    ) -> Result<Vec<GenerationRecord>, PluginError> {
        concurrent::each(snapshots, self.client.concurrency(), |snapshot| {
            self.generate(snapshot, config)
        })
    }

    fn stats(&self) -> BackendStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// The server's own `/tokenize`, on the prompt as scoring writes it.
    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        let prompt = self.format.render(snapshot, &self.model)?;
        tokens::tokenize(
            &self.client,
            self.tokenizer("tokenize")?,
            &self.model,
            &prompt.text,
            add_special && prompt.add_special,
        )
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, PluginError> {
        tokens::detokenize(
            &self.client,
            self.tokenizer("detokenize")?,
            &self.model,
            ids,
        )
    }
}

impl OpenAi {
    /// A server that names generated tokens by their text only (llama-cpp-python, OpenAI)
    /// leaves their ids unknown; its tokenizer gives them when it counts the same tokens.
    fn with_token_ids(&self, mut record: GenerationRecord) -> GenerationRecord {
        if !record.token_ids.contains(&chat::UNKNOWN_TOKEN) {
            return record;
        }
        let Some(tokenizer) = self.abilities.tokenizer else {
            return record;
        };
        let ids = tokens::tokenize(&self.client, tokenizer, &self.model, &record.text, false);
        match ids {
            Ok(ids) if ids.token_ids.len() == record.token_ids.len() => {
                record.token_ids = ids.token_ids;
            }
            _ => {}
        }
        record
    }

    /// The server's tokenizer endpoint; `what` names the call refused without one.
    fn tokenizer(&self, what: &str) -> Result<tokens::Tokenizer, PluginError> {
        self.abilities.tokenizer.ok_or_else(|| {
            PluginError::unsupported(format!(
                "the {} server at {} has no tokenizer endpoint, so it cannot {what}; vLLM, \
                 SGLang, llama.cpp, llama-cpp-python and `lmhost serve` have one",
                self.flavor,
                self.client.base_url()
            ))
        })
    }

    /// Counts the server's prefix-cache use as reported per request.
    /// A reply's ids filled in where the server gave only text, and its tokens counted.
    fn finish(&self, record: GenerationRecord) -> GenerationRecord {
        let record = self.with_token_ids(record);
        self.account(
            record.prompt_tokens,
            record.cached_prompt_tokens,
            record.token_ids.len(),
        );
        record
    }

    fn account(&self, prompt: u32, cached: u32, generated: usize) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.prompt_tokens += u64::from(prompt);
            stats.generated_tokens += generated as u64;
            stats.kv_cache_reused_tokens += u64::from(cached);
            stats.kv_cache_hits += u64::from(cached > 0);
            stats.kv_cache_misses += u64::from(cached == 0);
        }
    }
}

/// The key from the variable `api_key_env` names. An explicitly named variable must be set;
/// the default `OPENAI_API_KEY` is used only when present.
fn api_key(options: &Map<String, Value>) -> Result<Option<String>, PluginError> {
    match options.get("api_key_env").and_then(Value::as_str) {
        Some(var) => std::env::var(var).map(Some).map_err(|_| {
            PluginError::config(format!(
                "option `api_key_env` names `{var}`, but that environment variable is not set"
            ))
        }),
        None => Ok(std::env::var("OPENAI_API_KEY").ok()),
    }
}

/// The chat template a server publishes at `/props` (llama.cpp's server), if any; one that
/// does not compile is logged, not silently dropped.
fn server_template(client: &Client, logger: &Logger) -> Option<ChatTemplate> {
    let url = format!("{}/props", client.root_url());
    let props = client.get(&url).ok()?;
    props.get("chat_template")?;
    ChatTemplate::from_json(&props, url)
        .map_err(|e| logger.warn(&format!("{e}; set the `chat_template` option instead")))
        .ok()
}
