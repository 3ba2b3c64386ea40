//! Coalitions (subsets of players) and how a coalition's prompt is rendered: the conversation
//! with absent players deleted or replaced by a placeholder.

use std::fmt;

use lmhost_plugin_api::abi_stable::std_types::RString;
use lmhost_plugin_api::{
    document_text, document_with_text, Audio, ConversationSnapshot, Grounding, Image, Message,
    Part, Role, Turn,
};

use super::media::{self, Piece};
use super::players::Players;
use super::settings::Absence;

/// A subset of `n` players, as a bit set. Ordered and hashable so plans can deduplicate.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coalition {
    n: usize,
    bits: Vec<u64>,
}

impl Coalition {
    pub fn empty(n: usize) -> Self {
        Coalition {
            n,
            bits: vec![0; n.div_ceil(64)],
        }
    }

    pub fn full(n: usize) -> Self {
        let mut c = Self::empty(n);
        (0..n).for_each(|i| c.insert(i));
        c
    }

    /// The coalition whose members are the set bits of `mask` (n ≤ 64).
    pub fn from_mask(n: usize, mask: u64) -> Self {
        let mut c = Self::empty(n);
        (0..n)
            .filter(|i| mask >> i & 1 == 1)
            .for_each(|i| c.insert(i));
        c
    }

    pub fn from_members(n: usize, members: impl IntoIterator<Item = usize>) -> Self {
        let mut c = Self::empty(n);
        members.into_iter().for_each(|i| c.insert(i));
        c
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn contains(&self, i: usize) -> bool {
        i < self.n && self.bits[i / 64] >> (i % 64) & 1 == 1
    }

    pub fn insert(&mut self, i: usize) {
        assert!(i < self.n, "player {i} out of range 0..{}", self.n);
        self.bits[i / 64] |= 1 << (i % 64);
    }

    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn members(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.n).filter(|&i| self.contains(i))
    }
}

impl fmt::Debug for Coalition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits: String = (0..self.n)
            .map(|i| if self.contains(i) { '1' } else { '0' })
            .collect();
        write!(f, "Coalition({bits})")
    }
}

/// The conversation with only `coalition`'s players present; text outside any player stays.
///
/// With `Absence::Delete` (and `Hide`, whose prompts are keyed by it) a message whose players
/// are all absent is dropped (and a turn left empty with it); a conversation left with no
/// message at all becomes one empty message (user, or raw for raw text), since a prompt needs
/// at least one. With `Absence::Pad` each absent player's text becomes the placeholder, with
/// `Absence::Neutral` the fill character as many times as the text has characters; the
/// separators around it stay. An absent tool call goes under every absence, and the `tool`
/// message answering it with it (a call has no text to pad, and an answer without its call is
/// no conversation); a `tool` message whose call stays is kept, emptied where its text goes.
pub fn render(players: &Players, coalition: &Coalition, absence: &Absence) -> ConversationSnapshot {
    let absent_calls = players.absent_calls(coalition);
    let mut turns = Vec::new();
    let mut global = 0;
    for (t, turn) in players.conversation().turns.iter().enumerate() {
        let mut messages = Vec::new();
        for (m, message) in turn.messages.iter().enumerate() {
            let rendered = render_whole(players, (t, m, global), message, coalition, absence);
            messages.extend(with_calls(message, rendered, &absent_calls));
            global += 1;
        }
        if !messages.is_empty() {
            turns.push(Turn {
                messages: messages.into(),
            });
        }
    }
    if turns.is_empty() {
        let role = if players.conversation().is_raw() {
            Role::Raw
        } else {
            Role::User
        };
        turns.push(Turn {
            messages: vec![Message::text(role, "")].into(),
        });
    }
    let conversation = players.conversation();
    let grounding = Grounding {
        tools: conversation.tools.to_vec(),
        documents: documents(players, coalition, absence),
    };
    ConversationSnapshot::grounded(turns, grounding)
        .expect("rendered turns are never empty, and keep each answer with its call")
}

/// The conversation's documents under `coalition`: an absent one is left out (`Delete`,
/// `Hide`) or keeps its place with its `text` stood in for (`Pad`, `Neutral`).
fn documents(players: &Players, coalition: &Coalition, absence: &Absence) -> Vec<RString> {
    let absent = players.absent_documents(coalition);
    let all = players.conversation().documents.iter().enumerate();
    all.filter_map(|(k, document)| {
        if !absent.contains(&k) {
            return Some(document.clone());
        }
        match absence {
            Absence::Delete | Absence::Hide => None,
            Absence::Pad { .. } | Absence::Neutral { .. } => {
                let text = document_text(document).unwrap_or_default();
                let mut stood_in = String::new();
                stand_in(absence, &text, &mut stood_in);
                Some(document_with_text(document, &stood_in).into())
            }
        }
    })
    .collect()
}

/// Message `message` (number `m` of turn `t`, `global` across turns) under `coalition`, its
/// tool calls as they were; `None` where it is dropped.
fn render_whole(
    players: &Players,
    (t, m, global): (usize, usize, usize),
    message: &Message,
    coalition: &Coalition,
    absence: &Absence,
) -> Option<Message> {
    let pieces = players.pieces(global);
    if !pieces.is_empty() {
        // Media players keep their message: an absent one is painted or silenced.
        let text = match players.layout(t, m) {
            Some(_) => render_message(players, t, m, message, coalition, absence),
            None => Some(message.text_content()),
        };
        let parts = rebuilt_parts(message, text.unwrap_or_default(), |k, part| {
            let absent = pieces
                .iter()
                .filter(|(i, piece)| piece.part() == k && !coalition.contains(*i))
                .map(|(_, piece)| *piece);
            Some(with_absent(players, global, k, part, absent))
        });
        return Some(message.with_parts(parts));
    }
    let Some(text) = render_message(players, t, m, message, coalition, absence) else {
        return (!players.message_has_players(t, m)).then(|| message.clone());
    };
    let present = players
        .layout(t, m)
        .is_some_and(|layout| layout.players.iter().any(|&(p, _)| coalition.contains(p)));
    if present && text == message.text_content() {
        // Unchanged: keep the original, non-text parts included.
        return Some(message.clone());
    }
    let parts = rebuilt_parts(message, text, |_, part| kept_or_blank(part, present));
    Some(message.with_parts(parts))
}

/// `original` as `rendered`, without the calls in `absent`: a `tool` message goes with its
/// call, and stays (empty, if its text went) while the call does; a message left with neither
/// text nor calls goes.
fn with_calls(original: &Message, rendered: Option<Message>, absent: &[&str]) -> Option<Message> {
    if let Some(id) = original.tool_call_id.as_ref().into_option() {
        return match absent.contains(&id.as_str()) {
            true => None,
            false => Some(rendered.unwrap_or_else(|| original.with_parts(Vec::new()))),
        };
    }
    if original.tool_calls.is_empty() {
        return rendered;
    }
    let mut message = rendered.unwrap_or_else(|| original.with_parts(Vec::new()));
    message.tool_calls = (original.tool_calls.iter())
        .filter(|call| !absent.contains(&call.id.as_str()))
        .cloned()
        .collect();
    let empty = message.parts.is_empty() && message.tool_calls.is_empty();
    (!empty).then_some(message)
}

/// A rendered message's parts: its text, with its audio and images where they were (those
/// before the message's first text part stay before the text, the rest follow it), each as
/// `media` makes it of its index and part (`None` drops it).
fn rebuilt_parts(
    original: &Message,
    text: String,
    media: impl Fn(usize, &Part) -> Option<Part>,
) -> Vec<Part> {
    let first_text = original
        .parts
        .iter()
        .position(|part| matches!(part, Part::Text { .. }))
        .unwrap_or(original.parts.len());
    let media = |range: std::ops::Range<usize>| {
        (range.clone().zip(&original.parts[range]))
            .filter(|(_, part)| !matches!(part, Part::Text { .. }))
            .filter_map(|(k, part)| media(k, part))
    };
    let text = (!text.is_empty()).then(|| Part::text(text));
    media(0..first_text)
        .chain(text)
        .chain(media(first_text..original.parts.len()))
        .collect()
}

/// Media part `part` (number `k` of message `message`) with its `absent` pieces painted with the
/// fill or silenced.
fn with_absent<'a>(
    players: &Players,
    message: usize,
    k: usize,
    part: &Part,
    absent: impl Iterator<Item = &'a Piece>,
) -> Part {
    let (mut boxes, mut ranges) = (Vec::new(), Vec::new());
    for piece in absent {
        match piece {
            Piece::Region { bounds, .. } => boxes.push(*bounds),
            Piece::Segment { samples, .. } => ranges.push(samples.clone()),
        }
    }
    match part {
        Part::Image { image } if !boxes.is_empty() => {
            let blank = players
                .blank(message, k)
                .expect("a split image has its blank");
            Part::Image {
                image: media::painted(image, blank, &boxes),
            }
        }
        Part::Audio { audio } if !ranges.is_empty() => Part::Audio {
            audio: media::silenced(audio, &ranges),
        },
        _ => part.clone(),
    }
}

/// A media part as it is while any of its message's players is `present`, else (only under
/// `Pad`) its blank counterpart of the same size, as a player's text becomes the placeholder:
/// silence, or a black image; `None` for text (rendered apart) and for empty audio.
fn kept_or_blank(part: &Part, present: bool) -> Option<Part> {
    match part {
        Part::Text { .. } => None,
        Part::Audio { audio } if audio.samples.is_empty() => None,
        Part::Audio { .. } | Part::Image { .. } if present => Some(part.clone()),
        Part::Audio { audio } => Some(Part::Audio {
            audio: Audio {
                samples: vec![0.0; audio.samples.len()].into(),
                sample_rate: audio.sample_rate,
            },
        }),
        Part::Image { image } => Some(Part::Image {
            image: Image {
                width: image.width,
                height: image.height,
                rgb: vec![0; image.rgb.len()].into(),
            },
        }),
    }
}

/// A message's text under a coalition, or `None` when it is dropped or holds no player.
fn render_message(
    players: &Players,
    turn: usize,
    message: usize,
    original: &Message,
    coalition: &Coalition,
    absence: &Absence,
) -> Option<String> {
    let layout = players.layout(turn, message)?;
    let text = original.text_content();
    let mut out = String::new();
    match absence {
        Absence::Pad { .. } | Absence::Neutral { .. } => {
            out.push_str(&text[layout.lead.clone()]);
            for (k, &(player, ref span)) in layout.players.iter().enumerate() {
                if k > 0 {
                    out.push_str(&text[layout.players[k - 1].1.end..span.start]);
                }
                // An empty span is an audio-only message: its audio is silenced instead.
                if coalition.contains(player) || span.is_empty() {
                    out.push_str(&text[span.clone()]);
                } else {
                    stand_in(absence, &text[span.clone()], &mut out);
                }
            }
            out.push_str(&text[layout.trail.clone()]);
        }
        Absence::Delete | Absence::Hide => {
            // Text between two players is a separator (whitespace: kept only between present
            // players) or fixed text (a refinement's players lie among text that stays).
            let gap = |k: usize| &text[layout.players[k - 1].1.end..layout.players[k].1.start];
            let fixed = |t: &str| !t.trim().is_empty();
            let present = |k: usize| coalition.contains(layout.players[k].0);
            let any_fixed = fixed(&text[layout.lead.clone()])
                || fixed(&text[layout.trail.clone()])
                || (1..layout.players.len()).any(|k| fixed(gap(k)));
            if !any_fixed && !(0..layout.players.len()).any(present) {
                return None;
            }
            out.push_str(&text[layout.lead.clone()]);
            let mut since_fixed = false; // a present player since the last fixed text
            for (k, (_, span)) in layout.players.iter().enumerate() {
                if k > 0 && fixed(gap(k)) {
                    out.push_str(gap(k));
                    since_fixed = false;
                }
                if present(k) {
                    if k > 0 && since_fixed && !fixed(gap(k)) {
                        out.push_str(gap(k));
                    }
                    out.push_str(&text[span.clone()]);
                    since_fixed = true;
                }
            }
            out.push_str(&text[layout.trail.clone()]);
        }
    }
    Some(out)
}

/// What an absent player's `text` becomes: `Pad`'s placeholder, or `Neutral`'s fill character
/// once for each of its characters.
fn stand_in(absence: &Absence, text: &str, out: &mut String) {
    match absence {
        Absence::Pad { placeholder } => out.push_str(placeholder),
        Absence::Neutral { fill } => out.extend(std::iter::repeat_n(*fill, text.chars().count())),
        Absence::Delete | Absence::Hide => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::players::{Granularity, PlayerSpec};

    fn conversation() -> ConversationSnapshot {
        let messages = vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, "Paris is big. It is old.  Is it?"),
        ];
        ConversationSnapshot::new(vec![Turn {
            messages: messages.into(),
        }])
        .unwrap()
    }

    fn texts(s: &ConversationSnapshot) -> Vec<String> {
        s.messages().map(|m| m.text_content()).collect()
    }

    fn players(granularity: Granularity) -> Players {
        let spec = PlayerSpec {
            granularity,
            ..PlayerSpec::default()
        };
        Players::split(&conversation(), &spec).unwrap()
    }

    #[test]
    fn full_coalition_renders_the_original() {
        for g in [
            Granularity::Messages,
            Granularity::Sentences,
            Granularity::Words,
        ] {
            let p = players(g);
            for absence in [
                Absence::Delete,
                Absence::pad("_"),
                Absence::Neutral { fill: '_' },
            ] {
                let full = render(&p, &Coalition::full(p.len()), &absence);
                assert_eq!(full.turns, conversation().turns, "{g:?} {absence:?}");
            }
        }
    }

    #[test]
    fn delete_drops_messages_and_sentences() {
        let p = players(Granularity::Messages);
        let only_user = render(&p, &Coalition::from_members(2, [1]), &Absence::Delete);
        assert_eq!(texts(&only_user), ["Paris is big. It is old.  Is it?"]);
        let none = render(&p, &Coalition::empty(2), &Absence::Delete);
        assert_eq!(texts(&none), [""]);

        let p = players(Granularity::Sentences);
        assert_eq!(p.len(), 4);
        let c = Coalition::from_members(4, [0, 3]);
        assert_eq!(
            texts(&render(&p, &c, &Absence::Delete)),
            ["Be brief.", "Is it?"]
        );
        let c = Coalition::from_members(4, [1, 2]);
        assert_eq!(
            texts(&render(&p, &c, &Absence::Delete)),
            ["Paris is big. It is old."]
        );
    }

    #[test]
    fn pad_keeps_separators_and_places_the_placeholder() {
        let p = players(Granularity::Words);
        let kept = Coalition::from_members(p.len(), (0..p.len()).filter(|i| i % 2 == 0));
        let padded = render(&p, &kept, &Absence::pad("_"));
        assert_eq!(texts(&padded), ["Be _", "Paris _ big. _ is _  Is _"]);
        let p = players(Granularity::Messages);
        let padded = render(
            &p,
            &Coalition::from_members(2, [1]),
            &Absence::pad("[gone]"),
        );
        assert_eq!(texts(&padded)[0], "[gone]");
    }

    /// nlp-shap's `neutral`: an absent player becomes the fill character once per character
    /// of its text (not per byte), so the prompt keeps its layout.
    #[test]
    fn neutral_fills_each_absent_player_to_its_width() {
        let p = players(Granularity::Words);
        let kept = Coalition::from_members(p.len(), (0..p.len()).filter(|i| i % 2 == 0));
        let neutral = Absence::Neutral { fill: '_' };
        let filled = texts(&render(&p, &kept, &neutral));
        assert_eq!(filled, ["Be ______", "Paris __ big. __ is ____  Is ___"]);
        for (filled, original) in filled.iter().zip(texts(&conversation())) {
            assert_eq!(filled.chars().count(), original.chars().count());
        }
        let mut out = String::new();
        stand_in(&Absence::Neutral { fill: '·' }, "Café déjà", &mut out);
        assert_eq!(out, "·".repeat(9));
    }

    #[test]
    fn absent_audio_is_dropped_or_silenced() {
        let audio = |samples: Vec<f32>| Part::Audio {
            audio: Audio {
                samples: samples.into(),
                sample_rate: 4,
            },
        };
        let messages = vec![
            Message::text(Role::User, "Transcribe this."),
            Message::new(Role::User, vec![audio(vec![0.5, -0.5, 0.25])]),
        ];
        let conversation = ConversationSnapshot::new(vec![Turn {
            messages: messages.into(),
        }])
        .unwrap();
        let p = Players::split(&conversation, &PlayerSpec::default()).unwrap();
        assert_eq!(p.players()[1].text, "[audio 0.8 s]");
        let with_audio = render(&p, &Coalition::full(2), &Absence::pad("_"));
        assert_eq!(with_audio, conversation);
        let deleted = render(&p, &Coalition::from_members(2, [0]), &Absence::Delete);
        assert!(!deleted.has_audio());
        let padded = render(&p, &Coalition::from_members(2, [0]), &Absence::pad("_"));
        let silenced = padded.messages().nth(1).unwrap();
        assert_eq!(silenced.parts.as_slice(), [audio(vec![0.0; 3])]);
    }

    /// An image keeps its place before or after its message's text in every coalition, and
    /// an absent one is dropped (delete) or blacked out at its size (pad).
    #[test]
    fn images_keep_their_place_and_are_dropped_or_blanked() {
        let image = |v: u8| Part::Image {
            image: Image::new(2, 1, vec![v; 6]).unwrap(),
        };
        let messages = vec![
            Message::text(Role::System, "Describe pictures."),
            Message::new(
                Role::User,
                vec![image(200), Part::text("What is this? Be brief.")],
            ),
            Message::new(Role::User, vec![image(90)]),
        ];
        let conversation = ConversationSnapshot::new(vec![Turn {
            messages: messages.into(),
        }])
        .unwrap();
        let sentences = PlayerSpec {
            granularity: Granularity::Sentences,
            ..PlayerSpec::default()
        };
        let p = Players::split(&conversation, &sentences).unwrap();
        assert_eq!(p.players()[3].text, "[image 2x1]");
        // A message player shows the message's image where it stands.
        let messages = Players::split(&conversation, &PlayerSpec::default()).unwrap();
        let shown = &messages.players()[1].text;
        assert_eq!(shown, "[image 2x1] What is this? Be brief.");
        // The user's second sentence absent: the image still comes first.
        let some = Coalition::from_members(p.len(), [0, 1, 3]);
        let rendered = render(&p, &some, &Absence::Delete);
        let asked = rendered.messages().nth(1).unwrap();
        assert_eq!(
            asked.parts.as_slice(),
            [image(200), Part::text("What is this?")]
        );
        let deleted = render(&p, &Coalition::from_members(p.len(), [0]), &Absence::Delete);
        assert!(!deleted.has_images());
        let padded = render(
            &p,
            &Coalition::from_members(p.len(), [0, 1, 2]),
            &Absence::pad("_"),
        );
        let blanked = padded.messages().nth(2).unwrap();
        assert_eq!(blanked.parts.as_slice(), [image(0)]);
    }

    /// An agent's trace: the user asks, the assistant calls two tools, each answers, and the
    /// user asks again.
    fn trace() -> ConversationSnapshot {
        use lmhost_plugin_api::abi_stable::std_types::ROption;
        use lmhost_plugin_api::ToolCall;
        let call = |id: &str, name: &str, arguments: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        };
        let answer = |id: &str, text: &str| Message {
            tool_call_id: ROption::RSome(id.into()),
            ..Message::text(Role::Tool, text)
        };
        let messages = vec![
            Message::text(Role::User, "Can I cycle to my meeting?"),
            Message {
                tool_calls: vec![
                    call("w", "get_weather", r#"{"city": "Lyon"}"#),
                    call("c", "list_events", r#"{"date": "2026-12-08"}"#),
                ]
                .into(),
                ..Message::new(Role::Assistant, vec![])
            },
            answer("w", "Dry. Light wind."),
            answer("c", "15:00 Design review."),
            Message::text(Role::User, "So?"),
        ];
        let tools = vec![r#"{"type": "function"}"#.into()];
        ConversationSnapshot::grounded(
            vec![Turn {
                messages: messages.into(),
            }],
            Grounding {
                tools,
                ..Grounding::default()
            },
        )
        .unwrap()
    }

    /// Each player's id and text, in order.
    fn id_texts(p: &Players) -> Vec<(&str, &str)> {
        (p.players().iter())
            .map(|p| (p.id.as_str(), p.text.as_str()))
            .collect()
    }

    /// What a rendering keeps: each message's role, text and the names of its calls.
    fn outline(s: &ConversationSnapshot) -> Vec<String> {
        s.messages()
            .map(|m| {
                let calls: Vec<&str> = m.tool_calls.iter().map(|c| c.name.as_str()).collect();
                format!("{}: {} {calls:?}", m.role.as_str(), m.text_content())
            })
            .collect()
    }

    #[test]
    fn a_tool_call_is_a_player_that_goes_with_its_answer() {
        let p = Players::split(&trace(), &PlayerSpec::default()).unwrap();
        let ids = id_texts(&p);
        assert_eq!(
            ids,
            [
                ("m0", "Can I cycle to my meeting?"),
                ("m1.call0", r#"get_weather({"city": "Lyon"})"#),
                ("m1.call1", r#"list_events({"date": "2026-12-08"})"#),
                ("m2", "Dry. Light wind."),
                ("m3", "15:00 Design review."),
                ("m4", "So?"),
            ]
        );
        let without_weather = Coalition::from_members(6, [0, 2, 3, 4, 5]);
        for absence in [Absence::Delete, Absence::pad("_")] {
            let s = render(&p, &without_weather, &absence);
            assert_eq!(
                outline(&s),
                [
                    "user: Can I cycle to my meeting? []",
                    "assistant:  [\"list_events\"]",
                    "tool: 15:00 Design review. []",
                    "user: So? []",
                ],
                "{absence:?}"
            );
            assert_eq!(s.tools, trace().tools, "the tools stay");
        }
        let no_calls = render(
            &p,
            &Coalition::from_members(6, [0, 3, 4, 5]),
            &Absence::Delete,
        );
        assert_eq!(
            outline(&no_calls),
            ["user: Can I cycle to my meeting? []", "user: So? []"]
        );
    }

    #[test]
    fn an_absent_tool_answer_leaves_its_call_answered_empty() {
        let p = Players::split(&trace(), &PlayerSpec::default()).unwrap();
        let without_answer = Coalition::from_members(6, [0, 1, 2, 4, 5]);
        let deleted = render(&p, &without_answer, &Absence::Delete);
        assert_eq!(outline(&deleted)[2], "tool:  []");
        assert_eq!(outline(&deleted).len(), 5);
        let padded = render(&p, &without_answer, &Absence::pad("_"));
        assert_eq!(outline(&padded)[2], "tool: _ []");
    }

    #[test]
    fn hide_refuses_tool_call_players() {
        let p = Players::split(&trace(), &PlayerSpec::default()).unwrap();
        let err = p.check_hideable().unwrap_err().to_string();
        assert!(err.contains("player m1.call0 is a tool call"), "{err}");
        let spec = PlayerSpec {
            roles: vec![Role::Tool],
            ..PlayerSpec::default()
        };
        let results = Players::split(&trace(), &spec).unwrap();
        assert_eq!(results.len(), 2, "`roles = [\"tool\"]` selects the answers");
        results.check_hideable().unwrap();
    }

    /// A question over two retrieved documents.
    fn retrieval() -> ConversationSnapshot {
        let documents = vec![
            r#"{"doc_id": "a", "text": "Opens at 9 am.", "title": "Notice"}"#.into(),
            r#"{"text": "Closed on Mondays."}"#.into(),
        ];
        let turn = Turn {
            messages: vec![Message::text(Role::User, "When does it open?")].into(),
        };
        ConversationSnapshot::grounded(
            vec![turn],
            Grounding {
                documents,
                ..Grounding::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn a_document_is_a_player_that_goes_or_is_stood_in_for() {
        let p = Players::split(&retrieval(), &PlayerSpec::default()).unwrap();
        let ids = id_texts(&p);
        assert_eq!(
            ids,
            [
                ("d0", "Opens at 9 am."),
                ("d1", "Closed on Mondays."),
                ("m0", "When does it open?")
            ]
        );
        let without_first = Coalition::from_members(3, [1, 2]);
        let deleted = render(&p, &without_first, &Absence::Delete);
        assert_eq!(deleted.documents.as_slice(), &retrieval().documents[1..]);
        let padded = render(&p, &without_first, &Absence::pad("_"));
        // The other fields stay as written, in their order.
        assert_eq!(
            padded.documents[0].as_str(),
            r#"{"doc_id": "a", "text": "_", "title": "Notice"}"#
        );
        let neutral = render(&p, &without_first, &Absence::Neutral { fill: '_' });
        assert_eq!(
            lmhost_plugin_api::document_text(&neutral.documents[0]).unwrap(),
            "______________"
        );
        assert_eq!(
            render(&p, &Coalition::full(3), &Absence::Delete),
            retrieval()
        );
        let err = p.check_hideable().unwrap_err().to_string();
        assert!(err.contains("player d0 is a document"), "{err}");
    }

    #[test]
    fn documents_are_chosen_by_role_and_left_out_by_a_turn_filter() {
        let only = |spec: PlayerSpec| -> Vec<String> {
            let p = Players::split(&retrieval(), &spec).unwrap();
            p.players().iter().map(|p| p.id.clone()).collect()
        };
        let documents = PlayerSpec {
            roles: vec![Role::Document],
            ..PlayerSpec::default()
        };
        assert_eq!(only(documents), ["d0", "d1"]);
        let last_turn = PlayerSpec {
            turns: vec![-1],
            ..PlayerSpec::default()
        };
        assert_eq!(only(last_turn), ["m0"]);
    }
}
