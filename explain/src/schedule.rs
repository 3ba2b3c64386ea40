//! Scheduling: identical prompts are evaluated once, and prompts run in lexicographic order of
//! their rendered content, so that consecutive prompts share the longest prefixes and a
//! backend's prefix cache reuses the most.

use std::collections::HashMap;

use lmhost_plugin_api::{ConversationSnapshot, Part};

/// Unique prompts in evaluation order, and which prompt each coalition maps to.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub prompts: Vec<ConversationSnapshot>,
    /// For each input coalition, its index in `prompts`.
    pub of_coalition: Vec<usize>,
}

/// Deduplicates `rendered` (one prompt per coalition) and, when `sort` is set, orders the
/// unique prompts by content; otherwise they keep their first-seen order.
pub fn schedule(rendered: &[ConversationSnapshot], sort: bool) -> Schedule {
    let mut unique: Vec<(String, &ConversationSnapshot)> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut first_index = Vec::with_capacity(rendered.len());
    for prompt in rendered {
        let key = content_key(prompt);
        let next = unique.len();
        let index = *seen.entry(key.clone()).or_insert(next);
        if index == next {
            unique.push((key, prompt));
        }
        first_index.push(index);
    }
    let mut order: Vec<usize> = (0..unique.len()).collect();
    if sort {
        order.sort_by(|&a, &b| unique[a].0.cmp(&unique[b].0));
    }
    let mut position = vec![0; unique.len()];
    for (pos, &u) in order.iter().enumerate() {
        position[u] = pos;
    }
    Schedule {
        prompts: order.iter().map(|&u| unique[u].1.clone()).collect(),
        of_coalition: first_index.iter().map(|&u| position[u]).collect(),
    }
}

/// The prompt as one string: its documents, then each message's role, parts and tool calls in
/// order (the tools are the same for every prompt of a run), with control characters
/// marking the boundaries, so equal keys mean equal prompts and a shared key prefix means a
/// shared prompt prefix. Text is kept as it is (its control characters `\u{0}`..`\u{5}`
/// escaped, so no text reads as a boundary); audio is its
/// [`Audio::digest`](lmhost_plugin_api::Audio::digest) and an image its
/// [`Image::digest`](lmhost_plugin_api::Image::digest), so a minute of audio or a photo adds
/// a few dozen characters, not its samples or pixels.
pub fn content_key(prompt: &ConversationSnapshot) -> String {
    let mut key = String::new();
    // Templates give the documents first; each coalition keeps its own.
    for document in prompt.documents.iter() {
        key.push('\u{4}');
        push_escaped(&mut key, document);
        key.push('\u{2}');
    }
    key.push('\u{5}');
    for turn in prompt.turns.iter() {
        for message in turn.messages.iter() {
            key.push_str(message.role.as_str());
            key.push('\u{1}');
            for part in message.parts.iter() {
                match part {
                    Part::Text { text } => push_escaped(&mut key, text),
                    Part::Audio { audio } => {
                        key.push('\u{4}');
                        key.push_str(&audio.digest());
                    }
                    Part::Image { image } => {
                        key.push('\u{4}');
                        key.push_str("image:");
                        key.push_str(&image.digest());
                    }
                }
                key.push('\u{2}');
            }
            // The calls follow the text, as templates write them after it.
            for call in message.tool_calls.iter() {
                key.push('\u{4}');
                for field in [&call.id, &call.name, &call.arguments] {
                    push_escaped(&mut key, field);
                    key.push('\u{2}');
                }
            }
            if let Some(id) = message.tool_call_id.as_ref().into_option() {
                key.push('\u{4}');
                push_escaped(&mut key, id);
            }
            key.push('\u{3}');
        }
        key.push('\u{5}');
    }
    key
}

/// Appends `text`, each of the marker characters `\u{0}`..=`\u{5}` written as `\u{0}` and a
/// digit, so the mapping is injective and markers in the key are always boundaries.
fn push_escaped(key: &mut String, text: &str) {
    for c in text.chars() {
        if c <= '\u{5}' {
            key.push('\u{0}');
            key.push(char::from(b'0' + c as u8));
        } else {
            key.push(c);
        }
    }
}

/// Characters shared by each prompt's key with the previous one's: what a one-entry prefix
/// cache could reuse in this order.
pub fn shared_prefix_chars(prompts: &[ConversationSnapshot]) -> usize {
    let keys: Vec<String> = prompts.iter().map(content_key).collect();
    keys.windows(2)
        .map(|w| {
            w[0].chars()
                .zip(w[1].chars())
                .take_while(|(a, b)| a == b)
                .count()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use lmhost_plugin_api::Audio;

    use super::*;

    fn prompt(text: &str) -> ConversationSnapshot {
        ConversationSnapshot::from_prompt(text)
    }

    #[test]
    fn duplicates_are_evaluated_once_and_every_coalition_finds_its_prompt() {
        let rendered = vec![
            prompt("b x"),
            prompt("a"),
            prompt("b x"),
            prompt("a y"),
            prompt("a"),
        ];
        let s = schedule(&rendered, true);
        assert_eq!(s.prompts.len(), 3);
        let texts: Vec<String> = s
            .prompts
            .iter()
            .map(|p| p.messages().next().unwrap().text_content())
            .collect();
        assert_eq!(texts, ["a", "a y", "b x"]);
        for (c, &p) in s.of_coalition.iter().enumerate() {
            assert_eq!(s.prompts[p], rendered[c]);
        }
        let unsorted = schedule(&rendered, false);
        assert_eq!(unsorted.prompts.len(), 3);
        assert_eq!(unsorted.prompts[0], rendered[0]);
    }

    #[test]
    fn text_never_reads_as_a_boundary_or_as_audio() {
        use lmhost_plugin_api::abi_stable::std_types::RVec;
        use lmhost_plugin_api::{Message, Role, Turn};
        let of = |parts: Vec<Part>| {
            let message = Message::new(Role::User, parts);
            let turn = Turn {
                messages: RVec::from(vec![message]),
            };
            content_key(&ConversationSnapshot::new(vec![turn]).unwrap())
        };
        let audio = Audio {
            samples: RVec::from(vec![0.25f32, -0.5]),
            sample_rate: 16_000,
        };
        let as_audio = of(vec![Part::Audio {
            audio: audio.clone(),
        }]);
        let as_text = of(vec![Part::text(format!("\u{4}{}", audio.digest()))]);
        assert_ne!(as_audio, as_text);
        assert_ne!(
            of(vec![Part::text("a\u{2}b")]),
            of(vec![Part::text("a"), Part::text("b")])
        );
        let other_rate = Audio {
            sample_rate: 8_000,
            ..audio.clone()
        };
        assert_ne!(audio.digest(), other_rate.digest());
        assert_eq!(audio.digest().len(), 64);
        // Images key by their pixels and size: one changed byte or another shape is another
        // prompt, and an image never keys like text or audio.
        let image = |w: u32, rgb: Vec<u8>| Part::Image {
            image: lmhost_plugin_api::Image::new(w, 6 / w, rgb).unwrap(),
        };
        let picture = of(vec![image(2, vec![7; 18])]);
        assert_eq!(picture, of(vec![image(2, vec![7; 18])]));
        let mut changed = vec![7; 18];
        changed[17] = 8;
        assert_ne!(picture, of(vec![image(2, changed)]));
        assert_ne!(picture, of(vec![image(3, vec![7; 18])]));
        assert!(picture.len() < 90, "{picture}");
    }

    #[test]
    fn sorting_increases_shared_prefixes() {
        let rendered: Vec<_> = ["b 1", "a 1", "b 2", "a 2", "b 3", "a 3"]
            .iter()
            .map(|t| prompt(t))
            .collect();
        let sorted = schedule(&rendered, true);
        let unsorted = schedule(&rendered, false);
        assert!(shared_prefix_chars(&sorted.prompts) > shared_prefix_chars(&unsorted.prompts));
    }

    /// Prompts that differ only in a tool call, or in the call a tool message answers, are
    /// different prompts.
    #[test]
    fn tool_calls_are_part_of_the_key() {
        use lmhost_plugin_api::abi_stable::std_types::ROption;
        use lmhost_plugin_api::{Message, Role, ToolCall, Turn};
        let trace = |arguments: &str, answered: &str| {
            let call = |id: &str| ToolCall {
                id: id.into(),
                name: "f".into(),
                arguments: arguments.into(),
            };
            let messages = vec![
                Message {
                    tool_calls: vec![call("a"), call("b")].into(),
                    ..Message::new(Role::Assistant, vec![])
                },
                Message {
                    tool_call_id: ROption::RSome(answered.into()),
                    ..Message::text(Role::Tool, "done")
                },
            ];
            ConversationSnapshot::new(vec![Turn {
                messages: messages.into(),
            }])
            .unwrap()
        };
        let keys = [
            trace("{}", "a"),
            trace(r#"{"x": 1}"#, "a"),
            trace("{}", "b"),
        ]
        .map(|t| content_key(&t));
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
        assert_eq!(
            schedule(&[trace("{}", "a"), trace("{}", "a")], true)
                .prompts
                .len(),
            1
        );
    }

    /// Coalitions that keep different documents are different prompts.
    #[test]
    fn documents_are_part_of_the_key() {
        use lmhost_plugin_api::{Grounding, Message, Role, Turn};
        let with = |documents: Vec<&str>| {
            let turn = Turn {
                messages: vec![Message::text(Role::User, "q")].into(),
            };
            let documents = documents.into_iter().map(Into::into).collect();
            let grounding = Grounding {
                documents,
                ..Grounding::default()
            };
            content_key(&ConversationSnapshot::grounded(vec![turn], grounding).unwrap())
        };
        let (a, b) = (r#"{"text": "a"}"#, r#"{"text": "b"}"#);
        assert_ne!(with(vec![a, b]), with(vec![a]));
        assert_ne!(with(vec![a]), with(vec![b]));
        assert_ne!(with(vec![]), with(vec![a]));
    }
}
