//! The official `openai` Python client, used as a user would, against `lmhost serve` on mock:
//! a chat and a streamed chat, with bearer auth. Needs `.venv` from `scripts/setup-python`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{TestServer, MODEL};

const SCRIPT: &str = r#"
import sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1], api_key="test-key", max_retries=0)
messages = [{"role": "user", "content": "sun moon stars sun"}]
chat = client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=5, logprobs=True)
print("CHAT", chat.choices[0].message.content)
print("TOKENS", chat.usage.completion_tokens, len(chat.choices[0].logprobs.content))
stream = client.chat.completions.create(
    model=sys.argv[2], messages=messages, max_tokens=5, stream=True,
    stream_options={"include_usage": True},
)
text, usage = "", None
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    if chunk.usage:
        usage = chunk.usage
print("STREAM", text)
print("CACHED", usage.prompt_tokens_details.cached_tokens)
"#;

#[test]
fn official_python_client_chats_and_streams() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup-python to create the venv with the openai client",
        python.display()
    );
    let server = TestServer::mock(0, |o| o.api_key = Some("test-key".into()));
    let output = Command::new(&python)
        .args(["-c", SCRIPT, &server.url("/v1"), MODEL])
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the openai client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = |tag: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag} line in:\n{stdout}"))
            .trim()
            .to_string()
    };
    let chat = line("CHAT ");
    assert!(!chat.is_empty());
    assert!(
        chat.split(' ')
            .all(|w| ["sun", "moon", "stars"].contains(&w)),
        "{chat}"
    );
    assert_eq!(
        line("STREAM "),
        chat,
        "streamed text equals the plain reply"
    );
    let tokens: Vec<&str> = line("TOKENS ").leak().split(' ').collect();
    assert_eq!(tokens[0], tokens[1], "one logprob per completion token");
    let cached: u32 = line("CACHED ").parse().unwrap();
    assert!(cached > 0, "the repeated prompt hits mock's prefix cache");
}
