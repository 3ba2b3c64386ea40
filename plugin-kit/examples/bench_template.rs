//! What the chat-template sandbox costs a render: the same real template (Qwen2.5's, from
//! llama.cpp's collection) rendered over a 20-message chat in this process and in the sandbox's
//! worker, while the process holds 0, 1 and 4 GiB of written heap, as a loaded model does. A
//! template's first render forks the worker, which copies the page tables of all the process
//! holds; every later render is a round trip to it.
//!
//! Prints figures; asserts nothing. `cargo run --release --example bench_template -p
//! lmhost-plugin-kit` (after `scripts/fetch-test-data`).

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use lmhost_plugin_kit::template::{ChatMessage, ChatTemplate};

const TEMPLATE: &str = "models/llama.cpp/templates/Qwen-Qwen2.5-7B-Instruct.jinja";
const RENDERS: u32 = 200;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(TEMPLATE);
    let text = "A sentence of a conversation, long enough to be a turn. ".repeat(4);
    let messages: Vec<ChatMessage> = (0..20)
        .map(|i| ChatMessage::new(["user", "assistant"][i % 2], text.as_str()))
        .collect();
    println!("| heap held | first render (fork), ms | in process, µs | sandboxed, µs | ratio |");
    println!("| --- | --- | --- | --- | --- |");
    let mut held: Vec<Vec<u8>> = Vec::new();
    for gib in [0, 1, 4] {
        while held.len() < gib {
            held.push(vec![1; 1 << 30]);
        }
        let template = ChatTemplate::from_file(&path)?;
        let started = Instant::now();
        template.render(&messages, &[], &[], true)?;
        let first = started.elapsed().as_secs_f64() * 1e3;
        let inside = micros(|| template.render_unsandboxed(&messages, &[], &[], true))?;
        let sandboxed = micros(|| template.render(&messages, &[], &[], true))?;
        let ratio = sandboxed / inside;
        println!("| {gib} GiB | {first:.1} | {inside:.0} | {sandboxed:.0} | {ratio:.1}x |");
    }
    black_box(held);
    Ok(())
}

/// Microseconds per call of `render`, over [`RENDERS`] calls.
fn micros<E>(mut render: impl FnMut() -> Result<String, E>) -> Result<f64, E> {
    let started = Instant::now();
    for _ in 0..RENDERS {
        black_box(render()?);
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(RENDERS))
}
