//! An arbitrary chat template rendered over an arbitrary conversation (the input up to its
//! first NUL is the template, the rest its messages, split at each byte 1): an error or a
//! prompt, within the render limits. Rendered in this process, not the sandbox's worker, whose
//! coverage libFuzzer would not see; the memory the sandbox bounds is bounded here by
//! `-rss_limit_mb`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lmhost_plugin_kit::template::{ChatMessage, ChatTemplate};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, rest) = text.split_once('\0').unwrap_or((&text, "Hello!\u{1}Hi."));
    let Ok(template) = ChatTemplate::new(source, "fuzz") else {
        return;
    };
    let template = template.with_special_tokens(Some("<s>".into()), Some("</s>".into()));
    let roles = ["system", "user", "assistant"];
    let messages: Vec<ChatMessage> = (rest.split('\u{1}').enumerate())
        .map(|(i, content)| ChatMessage::new(roles[i % roles.len()], content))
        .collect();
    let _ = template.render_unsandboxed(&messages, &[], &[], true);
});
