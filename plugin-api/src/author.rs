//! The safe authoring layer: implement [`Backend`] with ordinary Rust types, then export it with
//! [`export_plugin!`](crate::export_plugin). Every call is guarded so a panic inside the plugin
//! comes back as an `Internal` error and never crosses the FFI boundary.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RSlice, RStr, RString, RVec};

use crate::abi::{
    BackendBox, GenerationBackend, GenerationBackend_TO, PluginContext, PluginMod, PluginModRef,
    TokenSinkRef, API_VERSION,
};
use crate::error::PluginError;
use crate::identity::{PluginIdentity, RawStr, IDENTITY_MAGIC};
use crate::options::OptionSpec;
use crate::types::{
    BackendStats, Capabilities, ConversationSnapshot, EmbeddingRecord, GenerationConfig,
    GenerationRecord, Hideable, KvCacheSettings, ScoreRecord, TokenDelta, TokenizeRecord,
};

/// A generation backend, written with std types. Methods take `&self`: a backend that holds a
/// model serializes access to it (a `Mutex`), because the host calls from many threads.
pub trait Backend: Send + Sync + Sized + 'static {
    /// The name configs select the plugin by.
    const NAME: &'static str;
    const VERSION: &'static str;

    /// The options `[backend.options]` may hold; the host validates against them.
    fn options() -> Vec<OptionSpec>;

    fn new(context: PluginContext) -> Result<Self, PluginError>;

    fn model_id(&self) -> String;

    /// What the host may ask of this backend; nothing beyond `generate` unless overridden.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// The reply to `snapshot` with nobody watching its tokens: [`Backend::generate_stream`]
    /// with a sink that takes them all. Override it where a whole reply is cheaper to get.
    fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord, PluginError> {
        self.generate_stream(snapshot, config, &mut |_| true)
    }

    /// The log-probabilities of `reply` after one prompt: [`Backend::score_batch`] of it.
    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
    ) -> Result<ScoreRecord, PluginError> {
        self.score_batch(std::slice::from_ref(snapshot), reply)?
            .pop()
            .ok_or_else(|| PluginError::internal("score_batch gave no record for one prompt"))
    }

    /// The log-probabilities of `reply` after each prompt, one record each, in order; a
    /// backend that scores computes as many at once as it can (one batched pass, concurrent
    /// requests). Unsupported unless overridden.
    fn score_batch(
        &self,
        _snapshots: &[ConversationSnapshot],
        _reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        Err(PluginError::unsupported(format!(
            "backend `{}` cannot score continuations",
            Self::NAME
        )))
    }

    fn set_kv_cache(&self, _settings: KvCacheSettings) -> Result<(), PluginError> {
        Ok(())
    }

    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }

    fn close(&self) {}

    /// The prompt's token ids and pieces (see [`GenerationBackend::tokenize`]).
    fn tokenize(
        &self,
        _snapshot: &ConversationSnapshot,
        _add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        Err(PluginError::unsupported(format!(
            "backend `{}` cannot tokenize",
            Self::NAME
        )))
    }

    /// The text of `ids`, special tokens included.
    fn detokenize(&self, _ids: &[u32]) -> Result<String, PluginError> {
        Err(PluginError::unsupported(format!(
            "backend `{}` cannot detokenize",
            Self::NAME
        )))
    }

    /// The reply to `snapshot`, its tokens handed to `sink` as they come; `sink` answering
    /// `false` stops generation (see [`GenerationBackend::generate_stream`]). A backend that
    /// makes its reply whole hands it over once: `sink(&TokenDelta::from(&record))`.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError>;

    /// `generate` after each prompt, in order. Override it when the backend can do better than
    /// one prompt at a time (sequences decoded together, concurrent requests).
    fn generate_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        config: &GenerationConfig,
    ) -> Result<Vec<GenerationRecord>, PluginError> {
        snapshots.iter().map(|s| self.generate(s, config)).collect()
    }

    /// `score` of `reply` with each entry's spans hidden (see
    /// [`GenerationBackend::score_hidden`]; the host has checked the spans and indexes).
    fn score_hidden(
        &self,
        _snapshot: &ConversationSnapshot,
        _reply: &str,
        _parts: &Hideable,
        _hidden: &[Vec<u32>],
        _from_message: u32,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        Err(PluginError::unsupported(format!(
            "backend `{}` cannot hide parts of a prompt from a reply's attention (score_hidden)",
            Self::NAME
        )))
    }

    /// One vector per text (see [`GenerationBackend::embed`]).
    fn embed(&self, _texts: &[String]) -> Result<Vec<EmbeddingRecord>, PluginError> {
        Err(PluginError::unsupported(format!(
            "backend `{}` cannot embed text",
            Self::NAME
        )))
    }

    /// Loads now what the backend loads on first use (see [`GenerationBackend::load`]); the
    /// default does nothing.
    fn load(&self) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Runs `f`, turning a panic into an `Internal` error carrying the panic message.
pub fn guard<T>(
    plugin: &str,
    f: impl FnOnce() -> Result<T, PluginError>,
) -> RResult<T, PluginError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.into(),
        Err(payload) => RResult::RErr(PluginError::internal(format!(
            "plugin `{plugin}` panicked: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

/// Locks `mutex`. If a panic poisoned it (a call that [`guard`] caught died holding it),
/// `reset` first puts what it guards back into a safe state (empty a cache, unload a model), so
/// one panic never disables a backend.
pub fn lock_or_reset<T>(mutex: &Mutex<T>, reset: impl FnOnce(&mut T)) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => {
            let mut guard = poisoned.into_inner();
            reset(&mut guard);
            mutex.clear_poison();
            guard
        }
    }
}

/// Like [`guard`] for calls that cannot fail: a panic yields `fallback`.
fn guard_infallible<T>(f: impl FnOnce() -> T, fallback: T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}

/// Adapts a [`Backend`] to the ABI trait object.
struct Guarded<B>(B);

impl<B: Backend> GenerationBackend for Guarded<B> {
    fn model_id(&self) -> RString {
        guard_infallible(|| self.0.model_id(), String::new()).into()
    }

    fn capabilities(&self) -> Capabilities {
        guard_infallible(|| self.0.capabilities(), Capabilities::default())
    }

    fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> RResult<GenerationRecord, PluginError> {
        guard(B::NAME, || self.0.generate(snapshot, config))
    }

    fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: RStr<'_>,
    ) -> RResult<ScoreRecord, PluginError> {
        guard(B::NAME, || self.0.score(snapshot, reply.as_str()))
    }

    fn set_kv_cache(&self, settings: KvCacheSettings) -> RResult<(), PluginError> {
        guard(B::NAME, || self.0.set_kv_cache(settings))
    }

    fn stats(&self) -> BackendStats {
        guard_infallible(|| self.0.stats(), BackendStats::default())
    }

    fn close(&self) {
        guard_infallible(|| self.0.close(), ());
    }

    fn score_batch(
        &self,
        snapshots: RSlice<'_, ConversationSnapshot>,
        reply: RStr<'_>,
    ) -> RResult<RVec<ScoreRecord>, PluginError> {
        guard(B::NAME, || {
            self.0
                .score_batch(snapshots.as_slice(), reply.as_str())
                .map(RVec::from)
        })
    }

    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> RResult<TokenizeRecord, PluginError> {
        guard(B::NAME, || self.0.tokenize(snapshot, add_special))
    }

    fn detokenize(&self, ids: RSlice<'_, u32>) -> RResult<RString, PluginError> {
        guard(B::NAME, || {
            self.0.detokenize(ids.as_slice()).map(RString::from)
        })
    }

    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        mut sink: TokenSinkRef<'_>,
    ) -> RResult<GenerationRecord, PluginError> {
        guard(B::NAME, || {
            self.0
                .generate_stream(snapshot, config, &mut |delta| sink.token(delta))
        })
    }

    fn embed(&self, texts: RSlice<'_, RString>) -> RResult<RVec<EmbeddingRecord>, PluginError> {
        guard(B::NAME, || {
            let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
            self.0.embed(&texts).map(RVec::from)
        })
    }

    fn load(&self) -> RResult<(), PluginError> {
        guard(B::NAME, || self.0.load())
    }

    fn generate_batch(
        &self,
        snapshots: RSlice<'_, ConversationSnapshot>,
        config: &GenerationConfig,
    ) -> RResult<RVec<GenerationRecord>, PluginError> {
        guard(B::NAME, || {
            self.0
                .generate_batch(snapshots.as_slice(), config)
                .map(RVec::from)
        })
    }

    fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: RStr<'_>,
        parts: &Hideable,
        hidden: RSlice<'_, RVec<u32>>,
        from_message: u32,
    ) -> RResult<RVec<ScoreRecord>, PluginError> {
        guard(B::NAME, || {
            let hidden: Vec<Vec<u32>> = hidden.iter().map(|h| h.to_vec()).collect();
            self.0
                .score_hidden(snapshot, reply.as_str(), parts, &hidden, from_message)
                .map(RVec::from)
        })
    }
}

extern "C" fn options_of<B: Backend>() -> RVec<OptionSpec> {
    guard_infallible(|| B::options().into(), RVec::new())
}

extern "C" fn new_backend_of<B: Backend>(
    context: PluginContext,
) -> RResult<BackendBox, PluginError> {
    guard(B::NAME, || {
        let backend = B::new(context)?;
        Ok(GenerationBackend_TO::from_value(
            Guarded(backend),
            TD_Opaque,
        ))
    })
}

/// The root module of `B`. `export_plugin!` exports it from a library; an application that
/// embeds the host registers it directly, with no library at all.
pub fn root_module<B: Backend>() -> PluginModRef {
    PluginMod {
        name: RStr::from_str(B::NAME),
        version: RStr::from_str(B::VERSION),
        api_version: RStr::from_str(API_VERSION),
        options: options_of::<B>,
        new_backend: new_backend_of::<B>,
    }
    .leak_into_prefix()
}

/// The frozen identity of `B`, see [`crate::identity`].
pub fn identity<B: Backend>() -> PluginIdentity {
    PluginIdentity {
        magic: IDENTITY_MAGIC,
        name: RawStr::new(B::NAME),
        version: RawStr::new(B::VERSION),
        api_version: RawStr::new(API_VERSION),
    }
}

/// Exports a [`Backend`] as an lmhost plugin library: the abi_stable root module (what
/// `#[export_root_module]` would write, with paths through this crate so plugins need no direct
/// abi_stable dependency) and the frozen identity symbol.
#[macro_export]
macro_rules! export_plugin {
    ($backend:ty) => {
        #[no_mangle]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::abi_stable::library::LibHeader = {
            fn root() -> $crate::PluginModRef {
                $crate::author::root_module::<$backend>()
            }
            extern "C" fn erased() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(root)
            }
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::PluginModRef>(
                    erased,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };

        #[no_mangle]
        pub extern "C" fn lmhost_plugin_identity() -> $crate::identity::PluginIdentity {
            $crate::author::identity::<$backend>()
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn exported_symbol_is_abi_stables_loader_name() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
