//! Players: the parts of a conversation whose influence is measured. A conversation splits into
//! messages, sentences or words, optionally only within chosen turns and roles, and its images
//! and audio clips, where asked, into regions and segments ([`crate::media`]); text outside
//! the players (other messages, whitespace between players) is always present.

use std::ops::Range;

use lmhost_plugin_api::{
    AudioSpan, ConversationSnapshot, Hideable, Image, ImageBox, Message, Part, Role, TextSpan,
    ToolCall,
};
use serde::Serialize;

use super::coalition::Coalition;
use super::error::ExplainError;
use super::media::{self, MediaSpec, Piece};
pub use super::settings::{Fill, Granularity};

/// Which players to make.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlayerSpec {
    pub granularity: Granularity,
    /// Only messages of these roles hold players; empty means every role.
    pub roles: Vec<Role>,
    /// Only these turns hold players (0 is the first, -1 the last); empty means every turn.
    pub turns: Vec<i64>,
    /// Players inside images and audio clips.
    pub media: MediaSpec,
}

/// One player: a stable id (`m2` a message, `m2.s0` a sentence, `m2.w5` a word, `m2.i0.r5` a
/// region of the message's first image, `m1.a3` a segment of its audio, `m3.call0` the
/// message's first tool call; `m` counts messages across turns from 0; `d1` the second of the
/// conversation's documents) and its text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Player {
    pub id: String,
    pub text: String,
    pub role: Role,
    pub turn: usize,
    /// Index of the message across the whole conversation; of a document (role `document`),
    /// its index among the documents.
    pub message: usize,
    /// Byte range of `text` inside the message's text (empty for a media player).
    #[serde(skip)]
    pub span: Range<usize>,
    /// A media player's box or time span.
    #[serde(flatten)]
    pub piece: Option<Piece>,
    /// A tool call player's index among its message's calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<usize>,
}

/// Where a player lies: a byte span of one message's text (`message` counts messages across
/// turns), a piece of one of its media parts or one of its tool calls; or a whole document
/// (`document`, `message` counting documents); and its id.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub message: usize,
    pub span: Range<usize>,
    pub id: String,
    pub piece: Option<Piece>,
    pub call: Option<usize>,
    pub document: bool,
}

/// Where a message's players lie in its text: before, between and after them is fixed text.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageLayout {
    pub lead: Range<usize>,
    pub players: Vec<(usize, Range<usize>)>,
    pub trail: Range<usize>,
}

/// What `score_hidden` hides of a conversation's players: [`Players::hidden_parts`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HiddenParts {
    pub parts: Hideable,
    /// Per player, the index of its part in `parts`.
    of_player: Vec<u32>,
    /// The audio and images that go with their message's text players (those not split into
    /// players of their own), as their parts: hidden when every one of those players is
    /// absent, as a message goes when all its players do.
    with_players: Vec<(Vec<u32>, Vec<u32>)>,
}

impl HiddenParts {
    /// The parts hidden in a coalition whose `absent` players these are.
    pub fn entry(&self, absent: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = absent.iter().map(|&p| self.of_player[p as usize]).collect();
        for (players, parts) in &self.with_players {
            if players.iter().all(|p| absent.contains(p)) {
                out.extend(parts);
            }
        }
        out
    }
}

/// A part of [`HiddenParts`] by kind and index within its kind, before the kinds are laid end
/// to end.
#[derive(Clone, Copy)]
enum PartOf {
    Span(usize),
    Box(usize),
    Clip(usize),
}

/// The players of one conversation, with what is needed to render coalitions of them.
#[derive(Debug, Clone)]
pub struct Players {
    conversation: ConversationSnapshot,
    players: Vec<Player>,
    /// Per turn, per message: the layout when the message's text holds players.
    layouts: Vec<Vec<Option<MessageLayout>>>,
    /// Which media players there are, and how absent image regions are painted.
    media: MediaSpec,
    /// `(message, part, image)`: each image with region players wholly painted with the fill,
    /// where an absent region's pixels come from.
    blanks: Vec<(usize, usize, Image)>,
    /// The indices of the media players: rendering a coalition looks only at these, not at
    /// every word of a long context.
    media_players: Vec<usize>,
    /// The indices of the tool call players.
    call_players: Vec<usize>,
}

impl Players {
    /// Splits `conversation` as `spec` says. Fails when a turn filter names a turn that does not
    /// exist, or when the filters leave no player.
    pub fn split(
        conversation: &ConversationSnapshot,
        spec: &PlayerSpec,
    ) -> Result<Players, ExplainError> {
        let n_turns = conversation.turns.len();
        let mut chosen_turns = Vec::new();
        for &t in &spec.turns {
            let index = if t < 0 { n_turns as i64 + t } else { t };
            if index < 0 || index >= n_turns as i64 {
                return Err(ExplainError::Players(format!(
                    "turn {t} does not exist: the conversation has {n_turns} turn(s), so turns \
                     must be in 0..={} (or -{n_turns}..=-1 from the end)",
                    n_turns - 1
                )));
            }
            chosen_turns.push(index as usize);
        }
        // Documents belong to no turn: a turn filter leaves them out.
        let documents = spec.turns.is_empty()
            && (spec.roles.is_empty() || spec.roles.contains(&Role::Document));
        let mut units: Vec<Unit> = (0..conversation.documents.len())
            .filter(|_| documents)
            .map(|k| Unit {
                message: k,
                span: 0..0,
                id: format!("d{k}"),
                piece: None,
                call: None,
                document: true,
            })
            .collect();
        let mut global = 0;
        for (t, turn) in conversation.turns.iter().enumerate() {
            for message in turn.messages.iter() {
                let selected = (spec.turns.is_empty() || chosen_turns.contains(&t))
                    && (spec.roles.is_empty() || spec.roles.contains(&message.role));
                if selected {
                    let text = message.text_content();
                    // Every image's regions are checked here; `auto` starts from messages,
                    // images with them, and refines into the regions later (`hierarchy`).
                    let pieces = media::pieces(message, global, &spec.media)?;
                    let pieces = match spec.granularity {
                        Granularity::Auto => Vec::new(),
                        _ => pieces,
                    };
                    // A message of audio or images alone is one player at any granularity,
                    // unless they split into players of their own.
                    let whole = text.is_empty() && (message.has_audio() || message.has_images());
                    let granularity = match whole {
                        true => Granularity::Messages,
                        false => spec.granularity,
                    };
                    // A message of tool calls alone has no text to make a player of.
                    let calls_alone = text.is_empty() && !message.tool_calls.is_empty();
                    let spans = match (whole && !pieces.is_empty()) || calls_alone {
                        true => Vec::new(),
                        false => split_text(&text, granularity),
                    };
                    for (k, span) in spans.into_iter().enumerate() {
                        let id = match granularity {
                            // `auto` starts from messages (see `hierarchy`).
                            Granularity::Messages | Granularity::Auto => format!("m{global}"),
                            Granularity::Sentences => format!("m{global}.s{k}"),
                            Granularity::Words => format!("m{global}.w{k}"),
                        };
                        units.push(Unit {
                            message: global,
                            span,
                            id,
                            piece: None,
                            call: None,
                            document: false,
                        });
                    }
                    units.extend(pieces.into_iter().map(|(id, piece)| Unit {
                        message: global,
                        span: 0..0,
                        id,
                        piece: Some(piece),
                        call: None,
                        document: false,
                    }));
                    units.extend((0..message.tool_calls.len()).map(|k| Unit {
                        message: global,
                        span: 0..0,
                        id: format!("m{global}.call{k}"),
                        piece: None,
                        call: Some(k),
                        document: false,
                    }));
                }
                global += 1;
            }
        }
        if units.is_empty() {
            return Err(ExplainError::Players(format!(
                "no players: splitting into {} with roles {:?} and turns {:?} selects no text; \
                 widen `roles` or `turns`",
                spec.granularity, spec.roles, spec.turns
            )));
        }
        Ok(Players::of_units(conversation, units, &spec.media))
    }

    /// Players made of `units` (disjoint, in conversation order: documents first, then within
    /// a message its text players, its media players and its tool calls); the rest of the
    /// conversation stays. Absent image regions are painted with `media.fill`.
    pub fn of_units(
        conversation: &ConversationSnapshot,
        units: Vec<Unit>,
        media: &MediaSpec,
    ) -> Players {
        let mut players: Vec<Player> = Vec::with_capacity(units.len());
        let mut layouts = Vec::new();
        let mut blanks = Vec::new();
        let mut global = 0;
        let mut units = units.into_iter().peekable();
        while let Some(unit) = units.next_if(|u| u.document) {
            let text = (conversation.documents.get(unit.message))
                .and_then(|d| lmhost_plugin_api::document_text(d).ok())
                .unwrap_or_default();
            players.push(Player {
                span: 0..text.len(),
                text,
                id: unit.id,
                role: Role::Document,
                turn: 0,
                message: unit.message,
                piece: None,
                call: None,
            });
        }
        for (t, turn) in conversation.turns.iter().enumerate() {
            let mut turn_layouts = Vec::new();
            for message in turn.messages.iter() {
                let text = message.text_content();
                let first = players.len();
                let mine: Vec<Unit> =
                    std::iter::from_fn(|| units.next_if(|u| u.message == global)).collect();
                // Media parts with players of their own are not shown with the text's.
                let split: Vec<usize> = mine
                    .iter()
                    .filter_map(|u| u.piece.as_ref().map(Piece::part))
                    .collect();
                for unit in mine {
                    let shown = match (&unit.piece, unit.call) {
                        (_, Some(k)) => call_text(&message.tool_calls[k]),
                        (Some(piece), None) => piece.text(),
                        (None, None) => player_text(
                            message,
                            &text[unit.span.clone()],
                            unit.span == (0..text.len()),
                            &split,
                        ),
                    };
                    players.push(Player {
                        text: shown,
                        id: unit.id,
                        role: message.role,
                        turn: t,
                        message: global,
                        span: unit.span,
                        piece: unit.piece,
                        call: unit.call,
                    });
                }
                let mine = &players[first..];
                blanks.extend(blanks_of(message, global, mine, media.fill));
                let texts: Vec<usize> = (first..players.len())
                    .filter(|&i| players[i].piece.is_none() && players[i].call.is_none())
                    .collect();
                let layout = texts
                    .first()
                    .zip(texts.last())
                    .map(|(&a, &z)| MessageLayout {
                        lead: 0..players[a].span.start,
                        players: texts
                            .iter()
                            .map(|&i| (i, players[i].span.clone()))
                            .collect(),
                        trail: players[z].span.end..text.len(),
                    });
                turn_layouts.push(layout);
                global += 1;
            }
            layouts.push(turn_layouts);
        }
        let media_players = (0..players.len())
            .filter(|&i| players[i].piece.is_some())
            .collect();
        let call_players = (0..players.len())
            .filter(|&i| players[i].call.is_some())
            .collect();
        Players {
            conversation: conversation.clone(),
            players,
            layouts,
            media: media.clone(),
            blanks,
            media_players,
            call_players,
        }
    }

    /// Which media players there are, and how absent image regions are painted.
    pub fn media(&self) -> &MediaSpec {
        &self.media
    }

    /// The media players of message `message` (counted across turns): their indices and pieces.
    pub fn pieces(&self, message: usize) -> Vec<(usize, &Piece)> {
        (self.media_players.iter())
            .map(|&i| (i, &self.players[i]))
            .filter(|(_, p)| p.message == message)
            .filter_map(|(i, p)| p.piece.as_ref().map(|piece| (i, piece)))
            .collect()
    }

    /// Image part `part` of message `message` wholly painted with the fill.
    pub fn blank(&self, message: usize, part: usize) -> Option<&Image> {
        (self.blanks.iter())
            .find(|(m, p, _)| *m == message && *p == part)
            .map(|(.., image)| image)
    }

    /// Where each player lies, to make players of some of them or of their parts.
    pub fn units(&self) -> Vec<Unit> {
        self.players
            .iter()
            .map(|p| Unit {
                message: p.message,
                span: p.span.clone(),
                id: p.id.clone(),
                piece: p.piece.clone(),
                call: p.call,
                document: p.role == Role::Document,
            })
            .collect()
    }

    /// The indices of the documents whose players are absent from `coalition`. Document
    /// players come first, so a coalition's rendering looks at them alone, not at every word
    /// of a long context.
    pub fn absent_documents(&self, coalition: &Coalition) -> Vec<usize> {
        (self.players.iter().enumerate())
            .take_while(|(_, p)| p.role == Role::Document)
            .filter(|(i, _)| !coalition.contains(*i))
            .map(|(_, p)| p.message)
            .collect()
    }

    /// The ids of the calls whose players are absent from `coalition`: each goes with the
    /// `tool` message that answers it.
    pub fn absent_calls(&self, coalition: &Coalition) -> Vec<&str> {
        if self.call_players.is_empty() {
            return Vec::new();
        }
        let messages: Vec<&Message> = self.conversation.messages().collect();
        (self.call_players.iter())
            .filter(|&&i| !coalition.contains(i))
            .filter_map(|&i| {
                let p = &self.players[i];
                let call = messages[p.message].tool_calls.get(p.call?)?;
                Some(call.id.as_str())
            })
            .collect()
    }

    /// Refuses tool call and document players where absent players are hidden (`absence =
    /// "hide"`): it hides spans of message text, and they have none.
    pub fn check_hideable(&self) -> Result<(), ExplainError> {
        let whole = self.players.iter().find_map(|p| match (p.call, p.role) {
            (Some(_), _) => Some((p, "tool call", "assistant messages")),
            (None, Role::Document) => Some((p, "document", "documents")),
            _ => None,
        });
        match whole {
            Some((p, kind, leave_out)) => Err(ExplainError::Players(format!(
                "player {} is a {kind}, which `absence = \"hide\"` cannot hide (it hides spans of \
                 message text): use `absence = \"delete\"`, or leave {leave_out} out with `roles`",
                p.id
            ))),
            None => Ok(()),
        }
    }

    /// The text of message `message` (counted across turns).
    pub fn message_text(&self, message: usize) -> String {
        self.conversation
            .messages()
            .nth(message)
            .map(|m| m.text_content())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.players.len()
    }

    pub fn is_empty(&self) -> bool {
        self.players.is_empty()
    }

    pub fn players(&self) -> &[Player] {
        &self.players
    }

    /// Where each player lies, as what the plugin API's `score_hidden` hides: a text span, an
    /// image box or a stretch of audio; and the audio and images that go with their message's
    /// text players, whole.
    pub fn hidden_parts(&self) -> HiddenParts {
        let mut parts = Hideable::default();
        let messages: Vec<&Message> = self.conversation.messages().collect();
        let of_player: Vec<PartOf> = (self.players.iter())
            .map(|p| own_part(p, messages[p.message], &mut parts))
            .collect();
        // A message's players are consecutive; where all are text, its media go with them.
        let mut groups = Vec::new();
        let mut first = 0;
        for mine in self.players.chunk_by(|a, b| a.message == b.message) {
            let players = first..first + mine.len();
            first = players.end;
            if mine.iter().all(|p| p.piece.is_none()) {
                let message = mine[0].message;
                let whole = add_whole_media(messages[message], message as u32, &mut parts);
                if !whole.is_empty() {
                    groups.push((players.map(|k| k as u32).collect(), whole));
                }
            }
        }
        let (spans, boxes) = (parts.spans.len(), parts.boxes.len());
        let index = |part: PartOf| match part {
            PartOf::Span(k) => k,
            PartOf::Box(k) => spans + k,
            PartOf::Clip(k) => spans + boxes + k,
        } as u32;
        HiddenParts {
            of_player: of_player.into_iter().map(index).collect(),
            with_players: (groups.into_iter())
                .map(|(players, whole)| (players, whole.into_iter().map(index).collect()))
                .collect(),
            parts,
        }
    }

    pub fn conversation(&self) -> &ConversationSnapshot {
        &self.conversation
    }

    pub fn layout(&self, turn: usize, message: usize) -> Option<&MessageLayout> {
        self.layouts.get(turn)?.get(message)?.as_ref()
    }

    pub(crate) fn message_has_players(&self, turn: usize, message: usize) -> bool {
        self.layout(turn, message).is_some()
    }
}

/// Where player `p` (of `message`) lies, added to `parts`: its text span, its image box or its
/// stretch of audio.
fn own_part(p: &Player, message: &Message, parts: &mut Hideable) -> PartOf {
    let global = p.message as u32;
    match &p.piece {
        None => {
            parts.spans.push(TextSpan {
                message: global,
                start: p.span.start as u32,
                end: p.span.end as u32,
            });
            PartOf::Span(parts.spans.len() - 1)
        }
        Some(Piece::Region { part, bounds, .. }) => {
            parts.boxes.push(ImageBox {
                message: global,
                image: media::kind_index(message, *part) as u32,
                bounds: *bounds,
            });
            PartOf::Box(parts.boxes.len() - 1)
        }
        Some(Piece::Segment { part, samples, .. }) => {
            parts.clips.push(AudioSpan {
                message: global,
                audio: media::kind_index(message, *part) as u32,
                start: samples.start as u32,
                end: samples.end as u32,
            });
            PartOf::Clip(parts.clips.len() - 1)
        }
    }
}

/// Every image and audio clip of `message` (number `global`) whole, added to `parts`.
fn add_whole_media(message: &Message, global: u32, parts: &mut Hideable) -> Vec<PartOf> {
    let (mut images, mut clips) = (0, 0);
    let mut out = Vec::new();
    for part in message.parts.iter() {
        match part {
            Part::Image { image } => {
                if image.width > 0 && image.height > 0 {
                    parts.boxes.push(ImageBox {
                        message: global,
                        image: images,
                        bounds: [0, 0, image.width, image.height],
                    });
                    out.push(PartOf::Box(parts.boxes.len() - 1));
                }
                images += 1;
            }
            Part::Audio { audio } => {
                if !audio.samples.is_empty() {
                    parts.clips.push(AudioSpan {
                        message: global,
                        audio: clips,
                        start: 0,
                        end: audio.samples.len() as u32,
                    });
                    out.push(PartOf::Clip(parts.clips.len() - 1));
                }
                clips += 1;
            }
            Part::Text { .. } => {}
        }
    }
    out
}

/// The images of `message` (number `global`) that `players` (its players) cut into regions,
/// each wholly painted with `fill`.
fn blanks_of(
    message: &Message,
    global: usize,
    players: &[Player],
    fill: Fill,
) -> Vec<(usize, usize, Image)> {
    let mut parts: Vec<usize> = (players.iter())
        .filter_map(|p| match &p.piece {
            Some(Piece::Region { part, .. }) => Some(*part),
            _ => None,
        })
        .collect();
    parts.dedup();
    parts
        .into_iter()
        .filter_map(|part| match &message.parts[part] {
            Part::Image { image } => Some((global, part, media::filled(image, fill))),
            _ => None,
        })
        .collect()
}

/// What a report shows for a player: its text, and where it is its message's whole text, the
/// message's audio and images too, in their places (`[image 640x480] What is this?`,
/// `[audio 3.2 s]`): they stay or go with the message's players. Parts in `split` have
/// players of their own.
fn player_text(message: &Message, text: &str, whole: bool, split: &[usize]) -> String {
    if !whole {
        return text.to_string();
    }
    let mut shown = Vec::new();
    let mut text_shown = false;
    let parts = (message.parts.iter().enumerate()).filter(|(k, _)| !split.contains(k));
    for (_, part) in parts {
        match part {
            Part::Text { .. } if !text_shown && !text.is_empty() => {
                shown.push(text.to_string());
                text_shown = true;
            }
            Part::Audio { audio } if audio.sample_rate > 0 => shown.push(format!(
                "[audio {:.1} s]",
                audio.samples.len() as f64 / f64::from(audio.sample_rate)
            )),
            Part::Image { image } => {
                shown.push(format!("[image {}x{}]", image.width, image.height))
            }
            _ => {}
        }
    }
    shown.join(" ")
}

/// What a report shows for a tool call player: `get_weather({"city": "Paris"})`.
pub fn call_text(call: &ToolCall) -> String {
    format!("{}({})", call.name, call.arguments)
}

/// Byte ranges of the players in one message's text.
fn split_text(text: &str, granularity: Granularity) -> Vec<Range<usize>> {
    match granularity {
        Granularity::Messages | Granularity::Auto => std::iter::once(0..text.len()).collect(),
        Granularity::Words => words(text),
        Granularity::Sentences => sentences(text),
    }
}

/// Maximal runs of non-whitespace.
pub(crate) fn words(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                out.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(s..text.len());
    }
    out
}

/// Sentences: a word ending in `.`, `!`, `?` or `…` (before closing quotes or brackets) ends
/// one, and so does a line break.
pub(crate) fn sentences(text: &str) -> Vec<Range<usize>> {
    let words = words(text);
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (k, word) in words.iter().enumerate() {
        let s = *start.get_or_insert(word.start);
        let core = text[word.clone()].trim_end_matches(['"', '\'', ')', ']', '»', '”', '’']);
        let terminal = core.ends_with(['.', '!', '?', '…']);
        let gap_end = words.get(k + 1).map_or(text.len(), |w| w.start);
        let line_break = text[word.end..gap_end].contains('\n');
        if terminal || line_break || k + 1 == words.len() {
            out.push(s..word.end);
            start = None;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::abi_stable::std_types::RVec;
    use lmhost_plugin_api::{Message, Turn};

    fn conversation() -> ConversationSnapshot {
        let turn = |messages: Vec<Message>| Turn {
            messages: RVec::from(messages),
        };
        ConversationSnapshot::new(vec![
            turn(vec![
                Message::text(Role::System, "You are terse."),
                Message::text(Role::User, "Hi there. How are you?"),
                Message::text(Role::Assistant, "Fine!"),
            ]),
            turn(vec![Message::text(
                Role::User,
                "Read this:\nThe sky is \"blue.\" Why?",
            )]),
        ])
        .unwrap()
    }

    fn split(granularity: Granularity, roles: Vec<Role>, turns: Vec<i64>) -> Vec<(String, String)> {
        let spec = PlayerSpec {
            granularity,
            roles,
            turns,
            ..PlayerSpec::default()
        };
        Players::split(&conversation(), &spec)
            .unwrap()
            .players()
            .iter()
            .map(|p| (p.id.clone(), p.text.clone()))
            .collect()
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn messages_are_players_with_global_ids() {
        let got = split(Granularity::Messages, vec![], vec![]);
        assert_eq!(got.len(), 4);
        assert_eq!(got[3].0, "m3");
        assert_eq!(got[1].1, "Hi there. How are you?");
    }

    #[test]
    fn sentences_end_at_punctuation_quotes_and_line_breaks() {
        let got = split(Granularity::Sentences, vec![Role::User], vec![]);
        assert_eq!(
            got,
            pairs(&[
                ("m1.s0", "Hi there."),
                ("m1.s1", "How are you?"),
                ("m3.s0", "Read this:"),
                ("m3.s1", "The sky is \"blue.\""),
                ("m3.s2", "Why?"),
            ])
        );
    }

    #[test]
    fn words_limited_to_the_last_turn() {
        let got = split(Granularity::Words, vec![], vec![-1]);
        assert_eq!(got.len(), 7);
        assert_eq!(got[0], ("m3.w0".to_string(), "Read".to_string()));
        assert_eq!(got[6], ("m3.w6".to_string(), "Why?".to_string()));
    }

    #[test]
    fn bad_filters_are_named() {
        let spec = PlayerSpec {
            turns: vec![5],
            ..PlayerSpec::default()
        };
        let err = Players::split(&conversation(), &spec).unwrap_err();
        assert!(err.to_string().contains("turn 5 does not exist"), "{err}");
        let spec = PlayerSpec {
            roles: vec![Role::Assistant],
            turns: vec![1],
            ..PlayerSpec::default()
        };
        let err = Players::split(&conversation(), &spec).unwrap_err();
        assert!(err.to_string().contains("no players"), "{err}");
    }
}
