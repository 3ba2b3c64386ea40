//! Chat templates, rendered exactly as Hugging Face Transformers renders them.
//!
//! A model learnt its conversations in the text that Transformers' `apply_chat_template` makes of
//! its Jinja chat template, so that text, byte for byte, is the prompt to give it. Transformers
//! renders with Python's jinja2 in the environment of `_cached_compile_jinja_template` and
//! `render_jinja_template` (transformers 5.x, `src/transformers/utils/chat_template_utils.py`):
//! `trim_blocks`, `lstrip_blocks`, loop controls, its `{% generation %}` tag, a `tojson` that is
//! `json.dumps`, and the globals `raise_exception` and `strftime_now`. This module rebuilds that
//! environment on minijinja: Python's methods, `json.dumps` and jinja2's tests in [`python`], two
//! source rewrites for what minijinja parses or runs differently in [`rewrite`]. The test
//! `tests/chat_templates.rs` holds it to jinja2's own output over llama.cpp's collection of real
//! templates.

mod error;
mod python;
mod rewrite;
#[cfg(target_os = "linux")]
mod sandbox;
mod source;

use std::path::Path;

use minijinja::{Environment, Template, Value};
use serde::Serialize;

use error::Failure;
pub use error::TemplateError;

/// One message of a conversation, as the template sees it: `message.role`, `message.content`
/// and, in an agent's trace, `message.tool_calls` and `message.tool_call_id`. A field a message
/// lacks is left out (undefined to the template), as in Transformers' examples.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage<'a> {
    pub role: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<ChatContent<'a>>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tool_calls: Vec<ChatToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<&'a str>,
}

impl<'a> ChatMessage<'a> {
    /// A message of `content` alone.
    pub fn new(role: &'a str, content: impl Into<ChatContent<'a>>) -> Self {
        ChatMessage {
            role,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A call of a tool as Transformers' templates read it: `{"id": ..., "type": "function",
/// "function": {"name": ..., "arguments": {...}}}`, the arguments an object (as vLLM also
/// passes them), not OpenAI's JSON text.
#[derive(Debug, Clone)]
pub struct ChatToolCall<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// The text of a JSON object.
    pub arguments: &'a str,
}

impl Serialize for ChatToolCall<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut function = s.serialize_map(Some(3))?;
        function.serialize_entry("id", self.id)?;
        function.serialize_entry("type", "function")?;
        function.serialize_entry(
            "function",
            &Value::from_iter([
                ("name", Value::from(self.name)),
                ("arguments", json_value(self.arguments)),
            ]),
        )?;
        function.end()
    }
}

/// JSON text as a template value, its objects' keys in their order (Python's dicts keep it);
/// text that does not parse stays a string.
fn json_value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::from(text))
}

/// A message's content: a string, or, where it holds images, the list of parts Transformers
/// passes (`{"type": "text", "text": ...}`, `{"type": "image"}`), which a multimodal model's
/// template walks to place its image markers.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ChatContent<'a> {
    Text(&'a str),
    Parts(Vec<ChatPart<'a>>),
}

impl<'a> From<&'a str> for ChatContent<'a> {
    fn from(text: &'a str) -> Self {
        ChatContent::Text(text)
    }
}

/// One part of a [`ChatContent::Parts`].
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ChatPart<'a> {
    Text { text: &'a str },
    Image,
}

/// A compiled chat template with the special tokens it is rendered with.
#[derive(Debug)]
pub struct ChatTemplate {
    /// Boxed: an environment is large, and templates are moved into enums and options.
    env: Box<Environment<'static>>,
    source: String,
    origin: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// The worker that renders, started by the first render.
    #[cfg(target_os = "linux")]
    sandbox: sandbox::Sandbox,
}

/// The name the template is stored under in its environment.
const NAME: &str = "chat";

/// What one render may spend. A model's chat template is code from whoever made the file, run
/// on every prompt: a loop without end, a runaway recursion or an endless output is refused
/// instead of hanging the process or filling its memory. Real templates stay far below each:
/// the costliest of llama.cpp's collection (Gemma 4's) runs 24,028 instructions for a
/// 65-message chat, about 370 a message, so the fuel allows some 50,000 messages. The size of
/// the values a template builds has no hook in minijinja (a string doubled by `~` forty times
/// in a loop), so memory and time are bounded from outside, by a process of its own (`sandbox`).
pub mod limits {
    use std::time::Duration;

    /// Template instructions one render may run.
    pub const FUEL: u64 = 20_000_000;
    /// How deep macro calls and nested blocks may go.
    pub const DEPTH: usize = 100;
    /// Bytes one render may write.
    pub const OUTPUT: usize = 64 << 20;
    /// Bytes one render may allocate (on Linux): room for the output eight times over.
    pub const MEMORY: usize = 512 << 20;
    /// How long one render may run (on Linux): far longer than the fuel lasts, so only a
    /// render that stalls within one instruction reaches it.
    pub const TIME: Duration = Duration::from_secs(10);
}

impl ChatTemplate {
    /// Compiles `source`; `origin` (a file path, "GGUF tokenizer.chat_template", "server /props")
    /// is named in every error.
    pub fn new(source: &str, origin: impl Into<String>) -> Result<Self, TemplateError> {
        let origin = origin.into();
        let mut env = environment();
        env.add_template_owned(NAME, rewrite::for_minijinja(source))
            .map_err(|e| TemplateError::compile(&origin, &e))?;
        Ok(ChatTemplate {
            env: Box::new(env),
            source: source.to_string(),
            origin,
            bos_token: None,
            eos_token: None,
            #[cfg(target_os = "linux")]
            sandbox: sandbox::Sandbox::default(),
        })
    }

    /// A Jinja file, or a `tokenizer_config.json` holding `chat_template` and the special tokens.
    pub fn from_file(path: &Path) -> Result<Self, TemplateError> {
        let text = std::fs::read_to_string(path).map_err(|source| TemplateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let origin = path.display().to_string();
        if path.extension().is_some_and(|e| e == "json") {
            let json = serde_json::from_str(&text).map_err(|source| TemplateError::Json {
                origin: origin.clone(),
                source,
            })?;
            Self::from_json(&json, origin)
        } else {
            Self::new(&text, origin)
        }
    }

    /// From a `tokenizer_config.json` or a server's `/props` answer: its `chat_template` (a string,
    /// or a list of named templates, of which "default" is taken) and its `bos_token` /
    /// `eos_token` (strings or `{"content": ...}`) when present.
    pub fn from_json(
        json: &serde_json::Value,
        origin: impl Into<String>,
    ) -> Result<Self, TemplateError> {
        let origin = origin.into();
        let template = Self::new(source::chat_template(json, &origin)?, origin)?;
        Ok(template.with_special_tokens(
            source::special_token(json, "bos_token"),
            source::special_token(json, "eos_token"),
        ))
    }

    /// Sets `bos_token` and `eos_token`; one that is `None` stays undefined in the template, as
    /// Transformers leaves a token the tokenizer lacks.
    pub fn with_special_tokens(self, bos: Option<String>, eos: Option<String>) -> Self {
        ChatTemplate {
            bos_token: bos,
            eos_token: eos,
            ..self
        }
    }

    /// The prompt for `messages`, with the assistant's turn opened when `add_generation_prompt`,
    /// rendered in a process of its own within [`limits::MEMORY`] and [`limits::TIME`] (on Linux;
    /// elsewhere in this one).
    /// `tools` and `documents` are the texts of the JSON objects the template gets as `tools`
    /// and `documents` (none: `None`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[&str],
        documents: &[&str],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self.template()?;
        let context = self.context(messages, [tools, documents], add_generation_prompt);
        self.sandboxed(&template, context)
            .map_err(|failure| TemplateError::failed(&self.origin, failure))
    }

    /// As [`ChatTemplate::render`], in this process, where only fuel, depth and output bound it:
    /// for a caller that bounds the process itself, such as a fuzzer, whose coverage a child
    /// process would hide.
    pub fn render_unsandboxed(
        &self,
        messages: &[ChatMessage],
        tools: &[&str],
        documents: &[&str],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self.template()?;
        let context = self.context(messages, [tools, documents], add_generation_prompt);
        within_limits(&template, context)
            .map_err(|failure| TemplateError::failed(&self.origin, failure))
    }

    fn template(&self) -> Result<Template<'_, '_>, TemplateError> {
        self.env
            .get_template(NAME)
            .map_err(|e| TemplateError::compile(&self.origin, &e))
    }

    /// Renders in [`sandbox`], within [`limits::MEMORY`] and [`limits::TIME`]: the context goes
    /// to the worker as JSON, the outcome comes back as JSON.
    #[cfg(target_os = "linux")]
    fn sandboxed(&self, template: &Template, context: Value) -> Result<String, Failure> {
        use sandbox::{Breach, Ending};
        // Strings, numbers, lists and maps always serialize; an empty frame is refused below.
        let request = serde_json::to_vec(&context).unwrap_or_default();
        let work = |request: &[u8]| {
            let rendered = serde_json::from_slice(request)
                .map_err(|e| unreadable("request", &e))
                .and_then(|context| within_limits(template, context));
            serde_json::to_vec(&rendered).unwrap_or_default()
        };
        match self
            .sandbox
            .call(&request, &work, limits::MEMORY, limits::TIME)
        {
            Ok(reply) => {
                serde_json::from_slice(&reply).unwrap_or_else(|e| Err(unreadable("reply", &e)))
            }
            Err(Breach::Time) => Err(Failure::Limit(format!(
                "its time limit of {} s",
                limits::TIME.as_secs()
            ))),
            // A failed allocation aborts; the kernel's OOM killer sends SIGKILL.
            Err(Breach::Ended(Ending::Signal(signal @ (libc::SIGABRT | libc::SIGKILL)))) => {
                Err(Failure::Limit(format!(
                    "its memory limit of {} MiB (its render process ended by signal {signal})",
                    limits::MEMORY >> 20
                )))
            }
            Err(Breach::Ended(Ending::Signal(signal))) => Err(Failure::process(format!(
                "its render process was ended by signal {signal}"
            ))),
            Err(Breach::Ended(Ending::Status(status))) => Err(Failure::process(format!(
                "its render process failed, exiting with status {status}"
            ))),
            Err(Breach::Io(e)) => Err(Failure::process(format!(
                "cannot run a process to render it in: {e}"
            ))),
        }
    }

    /// Elsewhere a render runs in this process, bounded by fuel, depth and output alone.
    #[cfg(not(target_os = "linux"))]
    fn sandboxed(&self, template: &Template, context: Value) -> Result<String, Failure> {
        within_limits(template, context)
    }

    /// The variables `apply_chat_template` passes: `render_jinja_template` gives `tools` and
    /// `documents` as None when there are none, and a special token the tokenizer lacks is left
    /// out (undefined).
    fn context(
        &self,
        messages: &[ChatMessage],
        [tools, documents]: [&[&str]; 2],
        add_generation_prompt: bool,
    ) -> Value {
        let objects = |texts: &[&str]| match texts {
            [] => Value::from(()),
            texts => texts.iter().map(|t| json_value(t)).collect(),
        };
        let mut vars = vec![
            ("messages", Value::from_serialize(messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("tools", objects(tools)),
            ("documents", objects(documents)),
        ];
        let tokens = [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ];
        vars.extend(
            tokens
                .into_iter()
                .filter_map(|(name, token)| Some((name, Value::from(token.as_deref()?)))),
        );
        Value::from_iter(vars)
    }

    /// The template as given, before any rewriting.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Where the template came from, as named in errors.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// Renders `template` over `context` within fuel, depth and [`limits::OUTPUT`].
fn within_limits(template: &Template, context: Value) -> Result<String, Failure> {
    let mut out = Capped::default();
    let rendered = template.render_captured_to(context, &mut out);
    if out.over {
        let limit = format!("its output limit of {} MiB", limits::OUTPUT >> 20);
        return Err(Failure::Limit(limit));
    }
    rendered.map_err(|e| Failure::of(&e))?;
    String::from_utf8(out.bytes)
        .map_err(|_| Failure::Limit("UTF-8: it wrote bytes that are not text".into()))
}

/// A sandbox's message that did not parse: a bug, never the template's doing.
#[cfg(target_os = "linux")]
fn unreadable(what: &str, e: &serde_json::Error) -> Failure {
    Failure::process(format!(
        "its render process exchanged an unreadable {what}: {e}"
    ))
}

/// A render's output, refused past [`limits::OUTPUT`] bytes.
#[derive(Default)]
struct Capped {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > limits::OUTPUT {
            self.over = true;
            return Err(std::io::Error::other("the template's output is too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// jinja2's `ImmutableSandboxedEnvironment` as Transformers configures it, within [`limits`].
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(limits::FUEL));
    env.set_recursion_limit(limits::DEPTH);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // jinja2's default, like minijinja's: a single newline at the end of the template is dropped.
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python::format);
    env.add_filter("tojson", python::tojson);
    env.add_filter("string", python::string);
    env.add_filter("length", python::length);
    env.add_filter("count", python::length);
    env.add_filter("map", python::map);
    env.add_filter("select", python::select);
    env.add_filter("reject", python::reject);
    env.add_filter("selectattr", python::selectattr);
    env.add_filter("rejectattr", python::rejectattr);
    env.add_function("raise_exception", python::raise_exception);
    env.add_function("strftime_now", python::strftime_now);
    env.add_function(rewrite::CHECKED_ITERABLE, python::checked_iterable);
    env.add_test("iterable", python::is_iterable);
    env.add_test("sequence", python::is_sequence);
    env.add_test("number", python::is_number);
    env
}

#[cfg(test)]
mod tests;
