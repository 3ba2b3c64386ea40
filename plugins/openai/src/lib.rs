//! `openai`: a backend that drives any OpenAI-compatible server (vLLM, SGLang, llama.cpp's
//! server, `lmhost serve`, OpenAI itself).
//!
//! Users who outgrow one machine run an inference engine; lmhost drives it rather than
//! reimplementing it. `generate` uses `/v1/chat/completions` with logprobs; `score` takes the
//! best route to prompt logprobs the server has (see [`score`]). The server's prefix cache shows
//! up as `cached_prompt_tokens` where it reports `usage.prompt_tokens_details.cached_tokens`.
//!
//! Raw text goes to `/v1/completions` as it is. `base_urls` names several servers of one model:
//! [`cluster`] spreads the prompts over them by shared prefix and moves a dead server's prompts
//! to the others.
//!
//! Modules: [`client`] (blocking HTTP, retries, error kinds), [`cluster`] (many servers as one),
//! [`flavor`] (which server),
//! [`chat`] (generate's wire format), [`completion`] (generate from raw text), [`score`],
//! [`tokens`] (the server's `/tokenize` and `/detokenize`), [`ids`] (the model's tokenizer
//! here, to send ids). Prompts for scoring are rendered by
//! `lmhost-plugin-kit`'s chat templates.

pub mod abilities;
pub mod chat;
pub mod client;
pub mod cluster;
pub mod completion;
pub mod flavor;
pub mod ids;
pub mod score;
pub mod tokens;

use std::time::Duration;

use lmhost_plugin_api::serde_json::{json, Map, Value};
use lmhost_plugin_api::{
    Backend, BackendStats, Capabilities, ConversationSnapshot, ErrorKind, GenerationConfig,
    GenerationRecord, Logger, OptionKind, OptionSpec, PluginContext, PluginError, ScoreRecord,
    TokenDelta, TokenizeRecord,
};
use lmhost_plugin_kit::prompt::PromptFormat;
use lmhost_plugin_kit::template::ChatTemplate;
use lmhost_plugin_kit::text::ModelText;

use abilities::{Abilities, Scoring};
use client::{Client, ClientConfig};
use cluster::{Cluster, Endpoint};
use flavor::Flavor;

/// Used when neither the option nor `OPENAI_BASE_URL` names a server: vLLM's default address.
pub const DEFAULT_BASE_URL: &str = "http://127.0.0.1:8000/v1";

pub struct OpenAi {
    cluster: Cluster,
    model: String,
    /// How chat prompts are written for scoring (the server renders them for generation).
    format: PromptFormat,
    /// The `tokenizer` option's: prompts are tokenized here and sent as ids where a server
    /// takes them.
    text: Option<ModelText>,
    logger: Logger,
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
                "base_urls",
                OptionKind::Strings,
                Value::Null,
                "Several servers of the same model, instead of base_url: prompts that share prefixes go to the same one, and a dead one's go to the others.",
            ),
            OptionSpec::new(
                "affinity",
                OptionKind::Bool,
                json!(true),
                "With base_urls: prompts that share prefixes go to the same server (false: each to whichever server is free, as a load balancer sends them).",
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
                "Most requests in flight to each server at once.",
            ),
            OptionSpec::new(
                "tokenizer",
                OptionKind::String,
                Value::Null,
                "The served model's tokenizer.json, model directory or GGUF: prompts are tokenized here and scored in one request, as ids, where the server takes them (vLLM, SGLang, lmhost serve).",
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
        let api_key = api_key(&options)?;
        let client = |base_url: String| {
            let config = ClientConfig {
                base_url,
                api_key: api_key.clone(),
                timeout: Duration::from_secs(int("timeout_s", 600).max(1)),
                max_retries: int("max_retries", 3).min(20) as u32,
                concurrency: int("concurrency", 16).max(1) as usize,
                backoff: Duration::from_millis(int("backoff_ms", 250)),
            };
            Client::new(config, context.logger.clone())
        };
        let mut clients = endpoint_urls(&options)?.into_iter().map(client);
        let first = clients.next().expect("endpoint_urls gives at least one");
        let mut model = text("model").unwrap_or_else(|| context.model_id.to_string());
        let chosen = text("flavor").and_then(|f| Flavor::parse(&f));
        let first = open_endpoint(first, chosen, &mut model)?;
        let mut endpoints = vec![first];
        for client in clients {
            let endpoint = open_endpoint(client, chosen, &mut model)?;
            same_model(&endpoints[0], &endpoint, &model)?;
            endpoints.push(endpoint);
        }
        let local = text("tokenizer")
            .map(|t| ids::load(&t).map(|m| (t, m)))
            .transpose()?;
        if let Some((option, text)) = &local {
            for endpoint in &endpoints {
                ids::check(text, option, endpoint, &model)?;
            }
        }
        let mut local = local.map(|(_, text)| text);
        let option = text("chat_template");
        // Only a server that can score needs the template: it renders chat for generation.
        let scores = endpoints
            .iter()
            .any(|e| e.abilities.scoring != Scoring::None);
        let published = (option.is_none() && scores)
            .then(|| server_template(&endpoints[0].client, &context.logger))
            .flatten()
            .or_else(|| local.as_mut().and_then(|t| t.chat_template.take()));
        let format = PromptFormat::choose(option.as_deref(), published)?;
        let templated = if matches!(format, PromptFormat::None) {
            "no chat template (raw text only)"
        } else {
            "chat template found"
        };
        for endpoint in &endpoints {
            let sent = match (&local, endpoint.flavor.takes_token_ids()) {
                (Some(_), true) => "prompts sent as ids",
                _ => "prompts sent as text",
            };
            context.logger.info(&format!(
                "{} server at {}, model `{model}`: {}; {templated}; {sent}",
                endpoint.flavor,
                endpoint.url(),
                endpoint.abilities,
            ));
        }
        let affinity = options.get("affinity").and_then(Value::as_bool) != Some(false);
        Ok(OpenAi {
            cluster: Cluster::new(endpoints, affinity, context.logger.clone()),
            model,
            format,
            text: local,
            logger: context.logger.clone(),
        })
    }

    fn model_id(&self) -> String {
        self.model.clone()
    }

    fn capabilities(&self) -> Capabilities {
        let scores =
            (self.cluster.endpoints().iter()).all(|e| e.abilities.scoring != Scoring::None);
        Capabilities {
            returns_logprobs: true,
            scores_continuations: scores && !matches!(self.format, PromptFormat::None),
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
        self.cluster
            .call(0, |endpoint| self.generate_on(endpoint, snapshot, config))
    }

    /// A chat relays the server's own event stream, delta by delta (a sink's `false` drops the
    /// connection, so the server stops too); raw text completes whole, then hands over. A
    /// stream is not moved to another endpoint midway: its deltas are already out.
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
        let endpoint = self.cluster.first();
        let mut body = chat::request(&self.model, endpoint.flavor, snapshot, config);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut streamed = chat::Streamed::default();
        (endpoint.client).post_events("/chat/completions", &body, |chunk| {
            sink(&streamed.take(chunk))
        })?;
        Ok(self.finish(endpoint, streamed.record()))
    }

    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        self.cluster
            .call(0, |endpoint| self.score_on(endpoint, snapshot, reply))
    }

    /// Each endpoint's workers (`concurrency` each) take the prompts in the order given, in
    /// runs of neighbours that share prefixes (`lmhost explain` sends them sorted, so each
    /// server's own prefix cache hits), and keep the servers' batchers busy.
    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        // What each prompt, as the servers read it, shares with the one before.
        let shared = || {
            let prompts: Vec<String> = (snapshots.iter())
                .map(|s| (self.format.render(s, &self.model)).map_or(String::new(), |p| p.text))
                .collect();
            let after = prompts.windows(2).map(|w| shared_prefix(&w[0], &w[1]));
            std::iter::once(0).chain(after).collect()
        };
        self.cluster
            .each_by_affinity(snapshots.len(), shared, |endpoint, i| {
                self.score_on(endpoint, &snapshots[i], reply)
            })
    }

    /// Concurrent requests, as `score_batch` sends them: the servers decode them together.
    fn generate_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        config: &GenerationConfig,
    ) -> Result<Vec<GenerationRecord>, PluginError> {
        let shared = || vec![0; snapshots.len()];
        self.cluster
            .each_by_affinity(snapshots.len(), shared, |endpoint, i| {
                self.generate_on(endpoint, &snapshots[i], config)
            })
    }

    /// The endpoints' counts added up.
    fn stats(&self) -> BackendStats {
        let all = self.cluster.endpoints().iter().map(Endpoint::stats);
        all.fold(BackendStats::default(), |sum, s| BackendStats {
            kv_cache_hits: sum.kv_cache_hits + s.kv_cache_hits,
            kv_cache_misses: sum.kv_cache_misses + s.kv_cache_misses,
            kv_cache_reused_tokens: sum.kv_cache_reused_tokens + s.kv_cache_reused_tokens,
            prompt_tokens: sum.prompt_tokens + s.prompt_tokens,
            generated_tokens: sum.generated_tokens + s.generated_tokens,
            ..sum
        })
    }

    /// The prompt as scoring writes it, tokenized by the `tokenizer` option's tokenizer, else
    /// by the server's own `/tokenize`.
    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        let prompt = self.format.render(snapshot, &self.model)?;
        if let Some(text) = &self.text {
            let tokenizer = &text.tokenizer;
            let failed = |e| PluginError::invalid_input(format!("option `tokenizer`: {e}"));
            let ids = (tokenizer.encode(&prompt.text, add_special && prompt.add_special, true))
                .map_err(failed)?;
            let piece = |id: &u32| tokenizer.decode(std::slice::from_ref(id), false);
            let pieces = ids.iter().map(piece).collect::<Result<Vec<_>, _>>();
            let pieces = pieces
                .map_err(failed)?
                .into_iter()
                .map(Into::into)
                .collect();
            return Ok(TokenizeRecord::text(ids, pieces));
        }
        self.cluster.call(0, |endpoint| {
            tokens::tokenize(
                &endpoint.client,
                tokenizer(endpoint, "tokenize")?,
                &self.model,
                &prompt.text,
                add_special && prompt.add_special,
            )
        })
    }

    fn detokenize(&self, ids: &[u32]) -> Result<String, PluginError> {
        if let Some(text) = &self.text {
            return (text.tokenizer.decode(ids, false))
                .map_err(|e| PluginError::invalid_input(format!("option `tokenizer`: {e}")));
        }
        self.cluster.call(0, |endpoint| {
            let tokenizer = tokenizer(endpoint, "detokenize")?;
            tokens::detokenize(&endpoint.client, tokenizer, &self.model, ids)
        })
    }

    /// What each endpoint computed: the prompts' tokens and those its prefix cache served.
    fn close(&self) {
        for endpoint in self.cluster.endpoints() {
            let s = endpoint.stats();
            self.logger.info(&format!(
                "endpoint {}: {} requests, {} prompt tokens ({} from its prefix cache), {} \
                 generated",
                endpoint.url(),
                s.kv_cache_hits + s.kv_cache_misses,
                s.prompt_tokens,
                s.kv_cache_reused_tokens,
                s.generated_tokens
            ));
        }
    }
}

impl OpenAi {
    fn generate_on(
        &self,
        endpoint: &Endpoint,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord, PluginError> {
        if snapshot.has_audio() || snapshot.has_images() {
            return Err(PluginError::invalid_input(
                "the openai backend sends text only; this conversation has audio or an image",
            ));
        }
        let (client, flavor) = (&endpoint.client, endpoint.flavor);
        let record = if snapshot.is_raw() {
            let body = completion::request(&self.model, flavor, snapshot, config);
            let answer = client.post("/completions", &body)?;
            let url = format!("{}/completions", client.base_url());
            completion::record(&answer, &url)?
        } else {
            let body = chat::request(&self.model, flavor, snapshot, config);
            let answer = client.post("/chat/completions", &body)?;
            let url = format!("{}/chat/completions", client.base_url());
            chat::record(&answer, &url)?
        };
        Ok(self.finish(endpoint, record))
    }

    fn score_on(
        &self,
        endpoint: &Endpoint,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        let scorer = score::Scorer {
            client: &endpoint.client,
            flavor: endpoint.flavor,
            abilities: endpoint.abilities,
            format: &self.format,
            model: &self.model,
            ids: (self.text.as_ref())
                .filter(|_| endpoint.flavor.takes_token_ids())
                .map(|t| &t.tokenizer),
        };
        let record = scorer.score(snapshot, reply)?;
        endpoint.account(record.prompt_tokens, record.cached_prompt_tokens, 0);
        Ok(record)
    }

    /// A server that names generated tokens by their text only (llama-cpp-python, OpenAI)
    /// leaves their ids unknown; its tokenizer gives them when it counts the same tokens.
    fn with_token_ids(
        &self,
        endpoint: &Endpoint,
        mut record: GenerationRecord,
    ) -> GenerationRecord {
        if !record.token_ids.contains(&chat::UNKNOWN_TOKEN) {
            return record;
        }
        let Some(tokenizer) = endpoint.abilities.tokenizer else {
            return record;
        };
        let ids = tokens::tokenize(
            &endpoint.client,
            tokenizer,
            &self.model,
            &record.text,
            false,
        );
        match ids {
            Ok(ids) if ids.token_ids.len() == record.token_ids.len() => {
                record.token_ids = ids.token_ids;
            }
            _ => {}
        }
        record
    }

    /// A reply's ids filled in where the server gave only text, and its tokens counted.
    fn finish(&self, endpoint: &Endpoint, record: GenerationRecord) -> GenerationRecord {
        let record = self.with_token_ids(endpoint, record);
        endpoint.account(
            record.prompt_tokens,
            record.cached_prompt_tokens,
            record.token_ids.len(),
        );
        record
    }
}

/// The endpoint's tokenizer endpoint; `what` names the call refused without one.
fn tokenizer(endpoint: &Endpoint, what: &str) -> Result<tokens::Tokenizer, PluginError> {
    endpoint.abilities.tokenizer.ok_or_else(|| {
        PluginError::unsupported(format!(
            "the {} server at {} has no tokenizer endpoint, so it cannot {what}; vLLM, \
             SGLang, llama.cpp, llama-cpp-python and `lmhost serve` have one",
            endpoint.flavor,
            endpoint.url()
        ))
    })
}

/// Bytes `a` and `b` share from their start.
fn shared_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// The servers: `base_urls`, else `base_url`, else `$OPENAI_BASE_URL`, else vLLM's default;
/// each an http(s) URL, without a trailing slash.
fn endpoint_urls(options: &Map<String, Value>) -> Result<Vec<String>, PluginError> {
    let urls: Vec<String> = match (options.get("base_urls"), options.get("base_url")) {
        (Some(_), Some(_)) => {
            return Err(PluginError::config(
                "give `base_url` (one server) or `base_urls` (several), not both",
            ))
        }
        (Some(Value::Array(urls)), None) => urls
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        (_, Some(url)) => vec![url.as_str().unwrap_or_default().to_string()],
        _ => vec![std::env::var("OPENAI_BASE_URL").unwrap_or_else(|_| DEFAULT_BASE_URL.into())],
    };
    if urls.is_empty() {
        return Err(PluginError::config(
            "option `base_urls` is empty; list at least one server, e.g. \
             [\"http://10.0.0.1:8000/v1\", \"http://10.0.0.2:8000/v1\"]",
        ));
    }
    for url in &urls {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(PluginError::config(format!(
                "endpoint `{url}` is not an http:// or https:// URL; expected e.g. \
                 http://127.0.0.1:8000/v1"
            )));
        }
    }
    Ok(urls
        .iter()
        .map(|u| u.trim_end_matches('/').to_string())
        .collect())
}

/// The endpoint behind `client`: its flavor (`chosen`, else what `/models` says) and what it
/// offers. `model` is filled in from the first server's `/models` when empty.
fn open_endpoint(
    client: Client,
    chosen: Option<Flavor>,
    model: &mut String,
) -> Result<Endpoint, PluginError> {
    if let (Some(flavor), false) = (chosen, model.is_empty()) {
        return Ok(Endpoint::new(client, flavor, Abilities::of(flavor)));
    }
    let url = format!("{}/models", client.base_url());
    let models = client.get(&url).map_err(|e| match e.kind {
        ErrorKind::BackendUnavailable => PluginError::unavailable(format!(
            "{}; start the server there, or take its URL out of `base_url`/`base_urls`",
            e.message
        )),
        _ => e,
    })?;
    if model.is_empty() {
        *model = (models.pointer("/data/0/id").and_then(Value::as_str))
            .ok_or_else(|| {
                PluginError::config(format!(
                    "no `model` option or model_id, and {url} lists no model"
                ))
            })?
            .to_string();
    }
    let named = Flavor::from_models(&models).unwrap_or(Flavor::OpenAi);
    let (flavor, abilities) = match chosen {
        Some(flavor) => (flavor, Abilities::of(flavor)),
        None => (named, Abilities::probe(&client, model, named)),
    };
    Ok(Endpoint::new(client, flavor, abilities))
}

/// `other` must serve `model` as `first` does: listed in its `/models`, and, where both have a
/// tokenizer endpoint, tokenizing the same text into the same ids.
fn same_model(first: &Endpoint, other: &Endpoint, model: &str) -> Result<(), PluginError> {
    let url = format!("{}/models", other.url());
    let models = other.client.get(&url)?;
    let listed = (models.pointer("/data").and_then(Value::as_array)).is_some_and(|data| {
        data.iter()
            .any(|m| m.get("id").and_then(Value::as_str) == Some(model))
    });
    if !listed {
        return Err(PluginError::config(format!(
            "endpoint {} does not serve model `{model}` ({url} lists {}); every endpoint of \
             `base_urls` must serve the same model",
            other.url(),
            models
                .get("data")
                .map_or("nothing".into(), Value::to_string)
        )));
    }
    let (Some(a), Some(b)) = (first.abilities.tokenizer, other.abilities.tokenizer) else {
        return Ok(());
    };
    let ids = |endpoint: &Endpoint, tokenizer| {
        tokens::tokenize(&endpoint.client, tokenizer, model, ids::PROBE, false)
            .map(|r| r.token_ids.to_vec())
    };
    let (theirs, ours) = (ids(other, b)?, ids(first, a)?);
    if theirs != ours {
        return Err(PluginError::config(format!(
            "endpoint {} tokenizes differently from {} ({} ids against {}): every endpoint \
             of `base_urls` must serve the same model with the same tokenizer",
            other.url(),
            first.url(),
            theirs.len(),
            ours.len()
        )));
    }
    Ok(())
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
