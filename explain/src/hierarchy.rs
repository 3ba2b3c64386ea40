//! Hierarchical players (`players = "auto"`): explain the messages, then refine the strongest
//! into their parts, and the strongest parts into theirs, down to sentences or words, so the
//! evaluations go where the attribution is instead of over every sentence of a long context.
//!
//! A message's parts are its sentences (a one-sentence message's: its words); more than
//! [`FANOUT`] parts are grouped into [`FANOUT`] runs of consecutive ones, which the next level
//! refines in turn. Where image or audio players are asked for, a message's images and clips
//! are parts of it too, each whole (`m2.i0`, `m2.c0`), and their parts are an image's regions
//! (`m2.i0.r5`) and a clip's segments (`m2.a3`). Every level is a small game, cheap for any estimator (exact: 16 coalitions
//! when one player is refined): the refined players' parts are its players, and the rest of
//! the conversation stays present. So a level's values share out the effect of removing the refined
//! players together, v(all) − v(all without them), the way its estimand says.

use super::media::{self, AudioPlayers, ImagePlayers, Piece};
use super::players::{sentences, words, Players, Unit};
use super::{Explanation, Granularity};

/// The most parts one player is refined into.
pub const FANOUT: usize = 4;

/// The parts of `unit`, a player in message text `text`: its sentences, or its words when it
/// holds one sentence (none below `floor`), in runs of consecutive ones when there are more than
/// [`FANOUT`]; empty when it cannot split (one word, or one sentence with `floor` sentences).
pub fn parts(text: &str, unit: &Unit, floor: Granularity) -> Vec<Unit> {
    let inside = |spans: Vec<std::ops::Range<usize>>| -> Vec<(usize, std::ops::Range<usize>)> {
        spans
            .into_iter()
            .enumerate()
            .filter(|(_, s)| s.start >= unit.span.start && s.end <= unit.span.end)
            .collect()
    };
    let mut items = inside(sentences(text));
    let mut kind = "s";
    if items.len() < 2 {
        if floor != Granularity::Words {
            return Vec::new();
        }
        items = inside(words(text));
        kind = "w";
    }
    if items.len() < 2 {
        return Vec::new();
    }
    let runs = items.len().min(FANOUT);
    (0..runs)
        .map(|r| {
            let run = &items[r * items.len() / runs..(r + 1) * items.len() / runs];
            let (first, last) = (&run[0], &run[run.len() - 1]);
            let id = if run.len() == 1 {
                format!("m{}.{kind}{}", unit.message, first.0)
            } else {
                format!("m{}.{kind}{}-{}", unit.message, first.0, last.0)
            };
            Unit {
                message: unit.message,
                span: first.1.start..last.1.end,
                id,
                piece: None,
                call: None,
                document: false,
            }
        })
        .collect()
}

/// The next level's players: the parts of the `top` strongest players (by |value|) of
/// `explanation` that can split, in conversation order, each with its parent's id; `None` when
/// none can.
pub fn refine(
    players: &Players,
    explanation: &Explanation,
    top: usize,
    floor: Granularity,
) -> Option<(Players, Vec<String>)> {
    let units = players.units();
    let split = |i: usize| media_parts(players, &units[i], floor);
    let mut strongest: Vec<usize> = (0..units.len()).collect();
    strongest.sort_by_key(|&i| explanation.attributions[i].rank);
    // Each player's parts are found once, and only until `top` of them can split.
    let mut chosen: Vec<(usize, Vec<Unit>)> = strongest
        .into_iter()
        .map(|i| (i, split(i)))
        .filter(|(_, parts)| !parts.is_empty())
        .take(top)
        .collect();
    if chosen.is_empty() {
        return None;
    }
    chosen.sort_unstable_by_key(|&(i, _)| i); // players are in conversation order
    let (parts, parents): (Vec<Unit>, Vec<String>) = chosen
        .into_iter()
        .flat_map(|(i, parts)| {
            let parent = &units[i].id;
            parts.into_iter().map(move |part| (part, parent.clone()))
        })
        .unzip();
    Some((
        Players::of_units(players.conversation(), parts, players.media()),
        parents,
    ))
}

/// The parts of `unit` with media in (none for a document or a tool call): a whole message's are its text's parts (or its text
/// whole, where that cannot split) and its split media, each whole; a whole image's are its
/// regions and a whole clip's its segments (straight away where it is its message's only
/// part); a region's or segment's none.
fn media_parts(players: &Players, unit: &Unit, floor: Granularity) -> Vec<Unit> {
    // A document or a tool call is a player whole.
    if unit.document || unit.call.is_some() {
        return Vec::new();
    }
    let text = players.message_text(unit.message);
    let Some(message) = players.conversation().messages().nth(unit.message) else {
        return Vec::new();
    };
    let spec = players.media();
    if spec.images == ImagePlayers::Whole && spec.audio == AudioPlayers::Whole {
        return parts(&text, unit, floor);
    }
    let as_units = |pieces: Vec<(String, Piece)>| -> Vec<Unit> {
        (pieces.into_iter())
            .map(|(id, piece)| Unit {
                message: unit.message,
                span: 0..0,
                id,
                piece: Some(piece),
                call: None,
                document: false,
            })
            .collect()
    };
    let inner = |piece: &Piece| as_units(media::inner_pieces(message, unit.message, piece, spec));
    let whole_piece = |id: &str| id.contains(".i") && !id.contains(".r") || id.contains(".c");
    match &unit.piece {
        Some(piece) if whole_piece(&unit.id) => inner(piece),
        Some(_) => Vec::new(),
        None if unit.id == format!("m{}", unit.message) => {
            let media = as_units(media::whole_media(message, unit.message, spec));
            let mut found = parts(&text, unit, floor);
            if found.is_empty() && !text.is_empty() && !media.is_empty() {
                // Its text cannot split: one part, beside the media.
                found.push(Unit {
                    id: format!("m{}.t", unit.message),
                    ..unit.clone()
                });
            }
            match (found.is_empty(), media.as_slice()) {
                (true, [only]) => inner(only.piece.as_ref().expect("a media unit's piece")),
                _ => found.into_iter().chain(media).collect(),
            }
        }
        None => parts(&text, unit, floor),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::players::PlayerSpec;
    use crate::{Absence, EstimatorSettings, Job, Plan};
    use lmhost_plugin_api::ConversationSnapshot;

    fn unit(text: &str, span: std::ops::Range<usize>) -> (String, Unit) {
        let unit = Unit {
            message: 2,
            span,
            id: "m2".into(),
            piece: None,
            call: None,
            document: false,
        };
        (text.to_string(), unit)
    }

    fn ids_and_texts(text: &str, parts: &[Unit]) -> Vec<(String, String)> {
        parts
            .iter()
            .map(|p| (p.id.clone(), text[p.span.clone()].to_string()))
            .collect()
    }

    #[test]
    fn a_message_splits_into_sentences_then_runs_of_them_then_words() {
        let (text, whole) = unit("One. Two. Three.", 0..16);
        let got = ids_and_texts(&text, &parts(&text, &whole, Granularity::Words));
        let want = [("m2.s0", "One."), ("m2.s1", "Two."), ("m2.s2", "Three.")];
        assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())));

        let text = "A. B. C. D. E. F. G. H. I. J.";
        let (_, whole) = unit(text, 0..text.len());
        let runs = parts(text, &whole, Granularity::Words);
        let got = ids_and_texts(text, &runs);
        assert_eq!(got[0], ("m2.s0-1".to_string(), "A. B.".to_string()));
        assert_eq!(got[3], ("m2.s7-9".to_string(), "H. I. J.".to_string()));
        // A run refines into its own sentences, keeping their message-wide numbers.
        let inner = ids_and_texts(text, &parts(text, &runs[3], Granularity::Words));
        assert_eq!(inner[0], ("m2.s7".to_string(), "H.".to_string()));

        let text = "The museum opens at nine.";
        let (_, one) = unit(text, 0..text.len());
        let words = ids_and_texts(text, &parts(text, &one, Granularity::Words));
        assert_eq!(words[0], ("m2.w0".to_string(), "The".to_string()));
        assert_eq!(words.len(), 4, "five words in four runs: {words:?}");
        assert!(parts(text, &one, Granularity::Sentences).is_empty());
        let (_, word) = unit(text, 4..10);
        assert!(parts(text, &word, Granularity::Words).is_empty());
    }

    #[test]
    fn the_strongest_player_is_refined_with_the_rest_fixed() {
        let conversation = ConversationSnapshot::from_prompt("Red fish. Blue fish. Big cat.");
        let players = Players::split(
            &conversation,
            &PlayerSpec {
                granularity: Granularity::Auto,
                ..PlayerSpec::default()
            },
        )
        .unwrap();
        // One player: the message; its value is whatever the count of "fish" says.
        let settings = EstimatorSettings::default();
        let fish = |job: &Job| -> Vec<f64> {
            let texts = job.prompts().iter().map(ConversationSnapshot::raw_text);
            texts.map(|t| t.matches("fish").count() as f64).collect()
        };
        let job = Job::new(
            players.clone(),
            Plan::new(1, &settings).unwrap(),
            &Absence::Delete,
            true,
        );
        let top = job.finish(&fish(&job));
        let (level, parents) = refine(&players, &top, 1, Granularity::Words).unwrap();
        assert_eq!(parents, ["m0", "m0", "m0"]);
        let plan = Plan::new(level.len(), &settings).unwrap();
        let job = Job::new(level.clone(), plan, &Absence::Delete, true);
        let e = job.finish(&fish(&job));
        let values: Vec<f64> = e.attributions.iter().map(|a| a.value).collect();
        assert_eq!(values, [1.0, 1.0, 0.0]);
        // "Red fish." is strongest (ties by order): its words come next, the others stay.
        let (words, parents) = refine(&level, &e, 1, Granularity::Words).unwrap();
        let ids: Vec<&str> = words.players().iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            (ids, parents[0].as_str()),
            (vec!["m0.w0", "m0.w1"], "m0.s0")
        );
        let none = crate::Coalition::empty(2);
        let rest = crate::render(&words, &none, &Absence::Delete).raw_text();
        assert_eq!(rest.trim(), "Blue fish. Big cat.");
        assert!(refine(&level, &e, 1, Granularity::Sentences).is_none());
    }
}
