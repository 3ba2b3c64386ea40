//! The stable domain types: snapshot ids and JSON round trips.

use lmhost_plugin_api::abi_stable::std_types::{ROption, RVec};
use lmhost_plugin_api::{
    Audio, BackendStats, ConversationSnapshot, FinishReason, GenerationConfig, GenerationRecord,
    Grounding, Image, Message, Part, Role, ScoreRecord, ToolCall, Turn,
};

fn conversation() -> ConversationSnapshot {
    let turn = |messages: Vec<Message>| Turn {
        messages: RVec::from(messages),
    };
    ConversationSnapshot::new(vec![
        turn(vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, "Hi"),
            Message::text(Role::Assistant, "Hello."),
        ]),
        turn(vec![Message::new(
            Role::User,
            vec![
                Part::text("Listen:"),
                Part::Audio {
                    audio: Audio {
                        samples: RVec::from(vec![0.0, 0.5, -0.25]),
                        sample_rate: 16_000,
                    },
                },
            ],
        )]),
    ])
    .unwrap()
}

#[test]
fn snapshot_id_is_stable_across_runs_and_platforms() {
    // Pinned: the id is a content hash that stored runs and caches key on, so it must never
    // change for the same turns. The value was computed independently with Python
    // (`hashlib.sha256(json.dumps(turns, separators=(",", ":")))`) over the same turns.
    assert_eq!(conversation().snapshot_id.as_str(), "ba9ee0164170f47c");
    assert_eq!(conversation().snapshot_id, conversation().snapshot_id);
    let other = ConversationSnapshot::from_prompt("Hi");
    assert_ne!(other.snapshot_id, conversation().snapshot_id);
    assert_eq!(other.snapshot_id.len(), 16);
}

/// An image's pixels cross as base64 in JSON, and its snapshot id and digest are pinned:
/// both were computed with Python (`json.dumps(turns, separators=(",", ":"))` and
/// `hashlib.sha256`) over the same turns and bytes.
#[test]
fn images_serialize_as_base64_with_pinned_ids() {
    let image = Image::new(2, 1, vec![255, 0, 0, 0, 0, 255]).unwrap();
    let snapshot = ConversationSnapshot::new(vec![Turn {
        messages: RVec::from(vec![Message::new(
            Role::User,
            vec![
                Part::Image {
                    image: image.clone(),
                },
                Part::text("Which colours?"),
            ],
        )]),
    }])
    .unwrap();
    let json = serde_json::to_string(&snapshot.turns).unwrap();
    assert!(json.contains(r#"{"type":"image","image":{"width":2,"height":1,"rgb":"/wAAAAD/"}}"#));
    assert_eq!(snapshot.snapshot_id.as_str(), "b14b05d2fa89a208");
    assert_eq!(
        image.digest(),
        "f3af430e13dd816087336909d367c27528063ad18e8488448ef614a0d0a818be"
    );
    let back: ConversationSnapshot =
        serde_json::from_str(&serde_json::to_string(&snapshot).unwrap()).unwrap();
    assert_eq!(back, snapshot);
    assert!(back.has_images() && !back.has_audio());
    assert!(
        format!("{image:?}").len() < 40,
        "Debug leaves the pixels out"
    );
}

#[test]
fn images_must_hold_their_pixels() {
    for (w, h, len) in [(2, 1, 5), (0, 1, 0), (1, 0, 0), (2, 2, 6)] {
        let err = Image::new(w, h, vec![0; len]).unwrap_err();
        assert!(err.message.contains(&format!("{w}x{h}")), "{err}");
    }
}

#[test]
fn empty_conversations_and_turns_are_refused() {
    assert!(ConversationSnapshot::new(vec![]).is_err());
    let err = ConversationSnapshot::new(vec![Turn {
        messages: RVec::new(),
    }])
    .unwrap_err();
    assert!(err.message.contains("turn 0 has no messages"), "{err}");
}

#[test]
fn snapshots_round_trip_and_reject_a_wrong_id() {
    let snapshot = conversation();
    let json = serde_json::to_string(&snapshot).unwrap();
    let back: ConversationSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snapshot);
    let tampered = json.replace(snapshot.snapshot_id.as_str(), "0000000000000000");
    let err = serde_json::from_str::<ConversationSnapshot>(&tampered).unwrap_err();
    assert!(
        err.to_string().contains("does not match its turns"),
        "{err}"
    );
}

#[test]
fn records_and_configs_round_trip() {
    let record = GenerationRecord {
        text: "Paris.".into(),
        token_ids: RVec::from(vec![1, 2]),
        logprobs: RVec::from(vec![-0.5, -0.25]),
        embedding: Some(RVec::from(vec![0.1f32])).into(),
        contextual_embedding: None.into(),
        prompt_tokens: 12,
        cached_prompt_tokens: 4,
        finish_reason: FinishReason::StopString,
    };
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["finish_reason"], "stop_string");
    assert_eq!(
        serde_json::from_value::<GenerationRecord>(json).unwrap(),
        record
    );
    let score = ScoreRecord {
        token_ids: RVec::from(vec![3]),
        logprobs: RVec::from(vec![-1.0]),
        prompt_tokens: 2,
        cached_prompt_tokens: 1,
    };
    assert_eq!(
        serde_json::from_str::<ScoreRecord>(&serde_json::to_string(&score).unwrap()).unwrap(),
        score
    );
    let stats = BackendStats {
        kv_cache_hits: 3,
        ..Default::default()
    };
    assert_eq!(
        serde_json::from_str::<BackendStats>(&serde_json::to_string(&stats).unwrap()).unwrap(),
        stats
    );
    let config: GenerationConfig =
        serde_json::from_str(r#"{"temperature": 0.7, "stop": ["\n"]}"#).unwrap();
    assert_eq!(
        config.max_new_tokens,
        GenerationConfig::default().max_new_tokens
    );
    assert!(serde_json::from_str::<GenerationConfig>(r#"{"temprature": 1}"#).is_err());
}

#[test]
fn the_readme_shows_the_example_plugin_as_it_is() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("plugin-api/examples/echo.rs")).unwrap();
    let code: String = example.lines().skip(3).map(|l| format!("{l}\n")).collect();
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README's plugin example is stale"
    );
    assert!(code.lines().count() < 60);
}

/// An agent's trace: a call, its answer, the final reply, and the tools the model was told of.
fn trace(calls: Vec<ToolCall>, answers: Vec<(&str, &str)>) -> Result<ConversationSnapshot, String> {
    let mut messages = vec![
        Message::text(Role::User, "Umbrella in Paris?"),
        Message {
            tool_calls: calls.into(),
            ..Message::new(Role::Assistant, vec![])
        },
    ];
    messages.extend(answers.into_iter().map(|(id, text)| Message {
        tool_call_id: ROption::RSome(id.into()),
        ..Message::text(Role::Tool, text)
    }));
    let tools = vec![r#"{"type": "function", "function": {"name": "get_weather"}}"#.into()];
    ConversationSnapshot::grounded(
        vec![Turn {
            messages: messages.into(),
        }],
        Grounding {
            tools,
            ..Grounding::default()
        },
    )
    .map_err(|e| e.message.into_string())
}

fn call(id: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "get_weather".into(),
        arguments: arguments.into(),
    }
}

#[test]
fn a_tool_trace_round_trips_with_its_tools_as_written() {
    let snapshot = trace(
        vec![call("c1", r#"{"city": "Paris"}"#)],
        vec![("c1", "Rain.")],
    )
    .unwrap();
    let json = serde_json::to_string(&snapshot).unwrap();
    // The tools stay JSON objects, in their keys' order, not strings holding JSON.
    assert!(
        json.contains(r#""tools":[{"type": "function", "function": {"name": "get_weather"}}]"#),
        "{json}"
    );
    let back: ConversationSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, snapshot);
    // The tools are part of what the model reads, so they are part of the id.
    let bare = ConversationSnapshot::new(snapshot.turns.to_vec()).unwrap();
    assert_ne!(bare.snapshot_id, snapshot.snapshot_id);
}

#[test]
fn mismatched_tool_calls_are_refused_naming_the_message() {
    let cases = [
        (trace(vec![call("c1", "{}")], vec![("c9", "Rain.")]), "messages[2]: the tool message answers call \"c9\", which no assistant message before it made"),
        (trace(vec![call("c1", "{}"), call("c1", "{}")], vec![]), "messages[1]: tool call \"c1\" (get_weather) reuses the id of a call in messages[1]"),
        (trace(vec![call("c1", "{city: Paris}")], vec![]), "messages[1]: tool call \"c1\" (get_weather): its arguments must be a JSON object"),
        (trace(vec![call("c1", "[1]")], vec![]), "its arguments must be a JSON object (it holds [1])"),
        (trace(vec![call("c1", "{}")], vec![("c1", "a"), ("c1", "b")]), "messages[3]: call \"c1\" was already answered by messages[2]"),
    ];
    for (outcome, expected) in cases {
        let err = outcome.unwrap_err();
        assert!(err.contains(expected), "{err:?} should say {expected:?}");
    }
    let orphan = Message::text(Role::Tool, "Rain.");
    let err = ConversationSnapshot::new(vec![Turn {
        messages: vec![orphan].into(),
    }])
    .unwrap_err();
    assert!(err.message.contains("needs `tool_call_id`"), "{err}");
    let user_calls = Message {
        tool_calls: vec![call("c1", "{}")].into(),
        ..Message::text(Role::User, "hi")
    };
    let err = ConversationSnapshot::new(vec![Turn {
        messages: vec![user_calls].into(),
    }])
    .unwrap_err();
    assert!(
        err.message.contains("only assistant messages call tools"),
        "{err}"
    );
}

#[test]
fn documents_need_a_text_and_are_no_message() {
    let turn = || Turn {
        messages: vec![Message::text(Role::User, "Open?")].into(),
    };
    let with = |documents: Vec<&str>| {
        let documents = documents.into_iter().map(Into::into).collect();
        ConversationSnapshot::grounded(
            vec![turn()],
            Grounding {
                documents,
                ..Grounding::default()
            },
        )
        .map_err(|e| e.message.into_string())
    };
    let grounded = with(vec![r#"{"title": "Hours", "text": "Nine."}"#]).unwrap();
    let json = serde_json::to_string(&grounded).unwrap();
    assert!(
        json.contains(r#""documents":[{"title": "Hours", "text": "Nine."}]"#),
        "{json}"
    );
    assert_eq!(
        serde_json::from_str::<ConversationSnapshot>(&json).unwrap(),
        grounded
    );
    assert_ne!(
        grounded.snapshot_id,
        ConversationSnapshot::new(vec![turn()]).unwrap().snapshot_id
    );
    for (documents, says) in [
        (
            vec![r#"{"title": "Hours"}"#],
            "documents[0] is not a JSON object with a string `text`: it has no `text`",
        ),
        (
            vec![r#"{"text": "a"}"#, r#"{"text": 9}"#],
            "documents[1] is not a JSON object with a string `text`: its `text` is 9",
        ),
        (vec!["[]"], "documents[0] is not a JSON object"),
    ] {
        let err = with(documents).unwrap_err();
        assert!(err.contains(says), "{err}");
    }
    let err = ConversationSnapshot::new(vec![Turn {
        messages: vec![Message::text(Role::Document, "Nine.")].into(),
    }])
    .unwrap_err();
    assert!(
        err.message.contains("`document` is not a message's role"),
        "{err}"
    );
}
