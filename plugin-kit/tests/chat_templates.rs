//! Conformance: lmhost renders real chat templates exactly as Transformers does.
//!
//! `scripts/render-chat-templates.py` renders every template of llama.cpp's collection
//! (`models/llama.cpp/templates/*.jinja`, installed by `scripts/fetch-test-data`) over the
//! conversations of `chat_conversations.json` with jinja2, set up as Transformers sets it up;
//! lmhost must produce the same text, byte for byte, and fail wherever jinja2 raised.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use lmhost_plugin_kit::template::{
    ChatContent, ChatMessage, ChatTemplate, ChatToolCall, TemplateError,
};
use serde::Deserialize;
use serde_json::value::RawValue;

/// The conversations both sides render, and the special tokens they render them with.
#[derive(Deserialize)]
struct Fixture {
    bos_token: String,
    eos_token: String,
    conversations: Vec<Conversation>,
}

/// A conversation in Transformers' shape: agent traces give `tools`, assistant messages with
/// `tool_calls` (arguments as objects) and `tool` messages; retrieval gives `documents`.
#[derive(Deserialize)]
struct Conversation {
    name: String,
    add_generation_prompt: bool,
    #[serde(default)]
    tools: Vec<Box<RawValue>>,
    #[serde(default)]
    documents: Vec<Box<RawValue>>,
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCall>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
struct ToolCall {
    id: String,
    function: Function,
}

#[derive(Deserialize)]
struct Function {
    name: String,
    arguments: Box<RawValue>,
}

/// What the reference script wrote.
#[derive(Deserialize)]
struct Reference {
    jinja2: String,
    results: Vec<Rendering>,
}

/// One (template, conversation): jinja2's text, or the exception it raised.
#[derive(Deserialize)]
struct Rendering {
    template: String,
    conversation: String,
    text: Option<String>,
    error: Option<String>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_fixture() -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chat_conversations.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs the reference renderer over `templates`.
fn render_with_jinja2(templates: &Path) -> Reference {
    let root = workspace();
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python (it installs jinja2, the reference renderer)",
        python.display()
    );
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = out.path().join("reference.json");
    let run = Command::new(&python)
        .arg(root.join("scripts/render-chat-templates.py"))
        .arg(templates)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/chat_conversations.json"))
        .arg(&output)
        .output()
        .expect("running scripts/render-chat-templates.py");
    assert!(
        run.status.success(),
        "scripts/render-chat-templates.py failed ({}): {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let text = std::fs::read_to_string(&output).expect("the reference renderings");
    serde_json::from_str(&text).expect("the reference renderings as JSON")
}

/// Templates that add a plain string to a `|safe` one (functionary's tool list: `"..."|safe +
/// t | tojson`): jinja2's `Markup.__add__` escapes the plain string's HTML characters, and
/// minijinja has no Markup type to do so, nor a hook on `+`. Their jinja2 text is compared with
/// those escapes undone, so everything else about them is still held to it.
const MARKUP_CONCATENATION: &[&str] = &["meetkai-functionary-medium-v3.1.jinja"];

/// `text` with markupsafe's escapes undone.
fn unescape_markup(text: &str) -> String {
    [
        ("&#34;", "\""),
        ("&#39;", "'"),
        ("&lt;", "<"),
        ("&gt;", ">"),
        ("&amp;", "&"),
    ]
    .iter()
    .fold(text.to_string(), |text, (from, to)| text.replace(from, to))
}

/// Where lmhost and jinja2 disagree, in words; `None` when they agree.
fn compare(reference: &Rendering, ours: &Result<String, String>) -> Option<String> {
    let expected = reference.text.as_ref().map(|text| {
        match MARKUP_CONCATENATION.contains(&reference.template.as_str()) {
            true => unescape_markup(text),
            false => text.clone(),
        }
    });
    match (&expected, ours) {
        (Some(expected), Ok(text)) if text == expected => None,
        (Some(expected), Ok(text)) => Some(format!(
            "renders differently\n--- jinja2\n{expected}\n--- lmhost\n{text}\n---"
        )),
        (Some(_), Err(e)) => Some(format!("lmhost fails where jinja2 renders: {e}")),
        (None, Err(_)) => None,
        (None, Ok(text)) => Some(format!(
            "lmhost renders where jinja2 raised {:?}:\n{text}",
            reference.error.as_deref().unwrap_or_default()
        )),
    }
}

#[test]
fn chat_templates_render_as_transformers_does() {
    let templates = workspace().join("models/llama.cpp/templates");
    assert!(
        templates.is_dir(),
        "{} is missing: run scripts/fetch-test-data (it installs llama.cpp's chat templates)",
        templates.display()
    );
    let fixture = read_fixture();
    let reference = render_with_jinja2(&templates);
    let conversations: BTreeMap<&str, &Conversation> = fixture
        .conversations
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();

    let mut compiled: BTreeMap<&str, Result<ChatTemplate, TemplateError>> = BTreeMap::new();
    let mut differences = Vec::new();
    let mut both_raise = 0;
    for rendering in &reference.results {
        let template = compiled
            .entry(&rendering.template)
            .or_insert_with(|| load(&templates.join(&rendering.template), &fixture));
        let ours = match template {
            Ok(t) => render(t, conversations[rendering.conversation.as_str()]),
            Err(e) => Err(e.to_string()),
        };
        if rendering.text.is_none() && ours.is_err() {
            both_raise += 1;
        }
        if let Some(difference) = compare(rendering, &ours) {
            differences.push(format!(
                "{} / {}: {difference}",
                rendering.template, rendering.conversation
            ));
        }
    }

    let total = reference.results.len();
    println!(
        "chat templates: {}/{total} renderings identical across {} templates \
         ({both_raise} raise on both sides; reference: jinja2 {})",
        total - differences.len(),
        compiled.len(),
        reference.jinja2
    );
    assert!(total > 0, "no templates in {}", templates.display());
    assert!(
        differences.is_empty(),
        "{} of {total} renderings differ from Transformers':\n\n{}",
        differences.len(),
        differences.join("\n\n")
    );
}

fn load(path: &Path, fixture: &Fixture) -> Result<ChatTemplate, TemplateError> {
    let template = ChatTemplate::from_file(path)?;
    Ok(template.with_special_tokens(
        Some(fixture.bos_token.clone()),
        Some(fixture.eos_token.clone()),
    ))
}

fn texts(list: &[Box<RawValue>]) -> Vec<&str> {
    list.iter().map(|t| t.get()).collect()
}

fn render(template: &ChatTemplate, conversation: &Conversation) -> Result<String, String> {
    let messages: Vec<ChatMessage> = (conversation.messages.iter())
        .map(|m| ChatMessage {
            role: &m.role,
            content: m.content.as_deref().map(ChatContent::Text),
            tool_calls: (m.tool_calls.iter())
                .map(|call| ChatToolCall {
                    id: &call.id,
                    name: &call.function.name,
                    arguments: call.function.arguments.get(),
                })
                .collect(),
            tool_call_id: m.tool_call_id.as_deref(),
        })
        .collect();
    let (tools, documents) = (texts(&conversation.tools), texts(&conversation.documents));
    template
        .render(
            &messages,
            &tools,
            &documents,
            conversation.add_generation_prompt,
        )
        .map_err(|e| e.to_string())
}
