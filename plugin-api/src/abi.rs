//! The ABI itself: the backend trait object, the context a backend is made with, and the root
//! module every plugin library exports.

// `#[sabi_trait]` expands to impls inside a generated module; the lint cannot be silenced there.
#![allow(non_local_definitions)]

use abi_stable::library::RootModule;
use abi_stable::sabi_types::RMut;
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{RBox, RResult, RSlice, RStr, RString, RVec};
use abi_stable::{declare_root_module_statics, package_version_strings, sabi_trait, StableAbi};
use serde_json::{Map, Value};

use crate::error::PluginError;
use crate::options::OptionSpec;
use crate::types::{
    BackendStats, Capabilities, ConversationSnapshot, EmbeddingRecord, GenerationConfig,
    GenerationRecord, Hideable, KvCacheSettings, ScoreRecord, TokenDelta, TokenizeRecord,
};

/// Where a streaming generation hands its tokens, as they come. Its answer says whether to go
/// on: `false` (the client went away, the request ran out of time) stops generation after that
/// token, and the record then ends with `Length` (the reply was cut short).
#[sabi_trait]
pub trait TokenSink: Send {
    fn token(&mut self, delta: &TokenDelta) -> bool;
}

/// A sink the host lends for one call.
pub type TokenSinkRef<'a> = TokenSink_TO<'a, RMut<'a, ()>>;

/// A loaded generation backend. Calls block; the backend serializes use of its model itself, so
/// any number of threads may call it at once.
#[sabi_trait]
pub trait GenerationBackend: Send + Sync {
    fn model_id(&self) -> RString;

    fn capabilities(&self) -> Capabilities;

    fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> RResult<GenerationRecord, PluginError>;

    /// Teacher-forced log-probabilities of `reply` as the assistant's answer to `snapshot`.
    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: RStr<'_>,
    ) -> RResult<ScoreRecord, PluginError>;

    fn set_kv_cache(&self, settings: KvCacheSettings) -> RResult<(), PluginError>;

    fn stats(&self) -> BackendStats;

    /// Releases the model; later calls fail with `BackendUnavailable`.
    #[sabi(last_prefix_field)]
    fn close(&self);

    /// `score` of `reply` after each of `snapshots`, in order; fails whole, naming the prompt.
    /// A backend that batches (one pass over many prompts) overrides it. The default, which is
    /// also what the host gets from a plugin built before this method existed, scores one
    /// prompt at a time.
    fn score_batch(
        &self,
        snapshots: RSlice<'_, ConversationSnapshot>,
        reply: RStr<'_>,
    ) -> RResult<RVec<ScoreRecord>, PluginError> {
        let mut records = RVec::with_capacity(snapshots.len());
        for snapshot in snapshots.iter() {
            match self.score(snapshot, reply) {
                RResult::ROk(record) => records.push(record),
                RResult::RErr(e) => return RResult::RErr(e),
            }
        }
        RResult::ROk(records)
    }

    /// The token ids the model runs for `snapshot`'s prompt: its chat template and generation
    /// prompt applied, or its raw text. `add_special` adds the tokens the tokenizer adds on
    /// its own (BOS), as generate and score do; false tokenizes the text alone.
    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> RResult<TokenizeRecord, PluginError> {
        let _ = (snapshot, add_special);
        RResult::RErr(PluginError::unsupported("this backend cannot tokenize"))
    }

    /// The text of `ids`, special tokens included.
    fn detokenize(&self, ids: RSlice<'_, u32>) -> RResult<RString, PluginError> {
        let _ = ids;
        RResult::RErr(PluginError::unsupported("this backend cannot detokenize"))
    }

    /// One vector per text, computed from the text itself (the backend documents its pooling).
    fn embed(&self, texts: RSlice<'_, RString>) -> RResult<RVec<EmbeddingRecord>, PluginError> {
        let _ = texts;
        RResult::RErr(PluginError::unsupported("this backend cannot embed text"))
    }

    /// `generate`, handing tokens to `sink` as they come. The default (and what a plugin built
    /// before this method gets) generates the whole reply, then hands it over in one delta.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        mut sink: TokenSinkRef<'_>,
    ) -> RResult<GenerationRecord, PluginError> {
        let record = match self.generate(snapshot, config) {
            RResult::ROk(record) => record,
            err => return err,
        };
        sink.token(&TokenDelta::from(&record));
        RResult::ROk(record)
    }

    /// `generate` after each of `snapshots`, in order; fails whole, naming the prompt. A
    /// backend that decodes several sequences at once overrides it; the default (and what a
    /// plugin built before this method gets) generates one prompt at a time.
    fn generate_batch(
        &self,
        snapshots: RSlice<'_, ConversationSnapshot>,
        config: &GenerationConfig,
    ) -> RResult<RVec<GenerationRecord>, PluginError> {
        let mut records = RVec::with_capacity(snapshots.len());
        for snapshot in snapshots.iter() {
            match self.generate(snapshot, config) {
                RResult::ROk(record) => records.push(record),
                RResult::RErr(e) => return RResult::RErr(e),
            }
        }
        RResult::ROk(records)
    }

    /// `score` of `reply` after `snapshot` once per entry of `hidden`, with the `parts` it lists
    /// (indexes into [`Hideable`]) hidden: the tokens of messages `from_message..` and of the
    /// reply attend to no token that overlaps a hidden text span, covers a hidden image box or
    /// encodes a hidden stretch of audio, and every token keeps its position. The tokens before
    /// message `from_message` are computed once, seeing everything, so each entry costs only
    /// the rows from there on (explain's `hide` absence: an approximation of deleting the
    /// part, since the messages before still saw it). Fails whole, naming the entry. The
    /// default (and what a plugin built before this method gets) refuses.
    fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: RStr<'_>,
        parts: &Hideable,
        hidden: RSlice<'_, RVec<u32>>,
        from_message: u32,
    ) -> RResult<RVec<ScoreRecord>, PluginError> {
        let _ = (snapshot, reply, parts, hidden, from_message);
        RResult::RErr(PluginError::unsupported(
            "this backend cannot hide parts of a prompt from a reply's attention (score_hidden)",
        ))
    }

    /// Loads now what the backend would load on first use (weights, a session), so that a
    /// server fails before it listens rather than on its first request. Calls that need less
    /// (tokenizing) may never load it. The default, and what a plugin built before this
    /// method gets, does nothing.
    fn load(&self) -> RResult<(), PluginError> {
        RResult::ROk(())
    }
}

/// The owned, type-erased backend the host holds.
pub type BackendBox = GenerationBackend_TO<'static, RBox<()>>;

/// Severity of a plugin log line.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Sends plugin log lines to the host's `tracing` subscriber, tagged with the plugin's name.
#[repr(C)]
#[derive(StableAbi, Clone)]
pub struct Logger {
    source: RString,
    callback: extern "C" fn(LogLevel, RStr<'_>, RStr<'_>),
}

impl Logger {
    /// `callback` receives the level, `source` (the plugin's name) and the message.
    pub fn new(source: &str, callback: extern "C" fn(LogLevel, RStr<'_>, RStr<'_>)) -> Self {
        Logger {
            source: source.into(),
            callback,
        }
    }

    /// A logger that drops every line, for tests and embedding without a subscriber.
    pub fn discard() -> Self {
        extern "C" fn discard(_: LogLevel, _: RStr<'_>, _: RStr<'_>) {}
        Logger::new("", discard)
    }

    pub fn log(&self, level: LogLevel, message: &str) {
        (self.callback)(level, self.source.as_rstr(), RStr::from_str(message));
    }

    pub fn warn(&self, message: &str) {
        self.log(LogLevel::Warn, message);
    }

    pub fn info(&self, message: &str) {
        self.log(LogLevel::Info, message);
    }

    pub fn debug(&self, message: &str) {
        self.log(LogLevel::Debug, message);
    }
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Logger({})", self.source)
    }
}

/// What a backend is made from: the config's `[backend]` section, the explanation's plugin
/// options, a cache directory and a logger. Tables travel as JSON text.
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct PluginContext {
    pub kind: RString,
    pub model_id: RString,
    /// `[backend.options]` as a JSON object, already validated against the plugin's options.
    pub options_json: RString,
    /// `[explanation.plugin_options]` as a JSON object.
    pub plugin_options_json: RString,
    /// A directory the plugin may write to and reuse across runs.
    pub cache_dir: RString,
    pub logger: Logger,
}

impl PluginContext {
    /// A context with empty option tables, discarding logs.
    pub fn new(kind: &str, model_id: &str) -> Self {
        PluginContext {
            kind: kind.into(),
            model_id: model_id.into(),
            options_json: "{}".into(),
            plugin_options_json: "{}".into(),
            cache_dir: std::env::temp_dir().to_string_lossy().as_ref().into(),
            logger: Logger::discard(),
        }
    }

    /// Sets the backend options from a JSON object.
    pub fn with_options(mut self, options: Value) -> Self {
        self.options_json = options.to_string().into();
        self
    }

    /// `[backend.options]` as a JSON map.
    pub fn options(&self) -> Result<Map<String, Value>, PluginError> {
        parse_table(&self.options_json, "backend.options")
    }

    /// `[explanation.plugin_options]` as a JSON map.
    pub fn plugin_options(&self) -> Result<Map<String, Value>, PluginError> {
        parse_table(&self.plugin_options_json, "explanation.plugin_options")
    }
}

fn parse_table(json: &str, what: &str) -> Result<Map<String, Value>, PluginError> {
    serde_json::from_str(json)
        .map_err(|e| PluginError::config(format!("`{what}` is not a JSON object: {e}")))
}

/// The root module of a plugin library. Fields may only be added after the last prefix field,
/// so that plugins built against an older API keep loading.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    /// The name configs select it by (`kind = "mock"`).
    pub name: RStr<'static>,
    pub version: RStr<'static>,
    /// The `lmhost-plugin-api` version the plugin was built against.
    pub api_version: RStr<'static>,
    pub options: extern "C" fn() -> RVec<OptionSpec>,
    #[sabi(last_prefix_field)]
    pub new_backend: extern "C" fn(PluginContext) -> RResult<BackendBox, PluginError>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "lmhost_plugin";
    const NAME: &'static str = "lmhost_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// The API version of this crate, which plugins record and the host compares.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");
