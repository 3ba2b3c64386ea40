//! `mock`: a deterministic backend, and the smallest complete lmhost plugin.
//!
//! Its "model" is a bag of words: a reply word is likely in proportion to how often it occurs in
//! the text before it (the prompt and the reply so far, as a causal model reads). It sees an
//! image as words too: `red`, `green` or `blue` for each cell of a 4 x 4 grid holding a pixel
//! of that colour (its channel at least 200, the others at most 60); and hears audio as `loud`
//! for each quarter second whose peak reaches 0.5. So an answer can depend on one region of a
//! picture or one stretch of a recording, as explain's tests need. So the same snapshot and config always give the same reply, logprobs and
//! embeddings; different snapshots give different ones; and `score` of a generated reply returns
//! exactly the logprobs `generate` reported, as a real model's would. It remembers the previous
//! prompt to imitate a one-entry prefix cache, which makes prompt ordering measurable.

use std::sync::Mutex;
use std::thread::sleep;
use std::time::Duration;

use lmhost_plugin_api::serde_json::json;
use lmhost_plugin_api::{
    Audio, Backend, BackendStats, Capabilities, ConversationSnapshot, EmbeddingRecord,
    FinishReason, GenerationConfig, GenerationRecord, Hidden, Hideable, Image, KvCacheSettings,
    OptionKind, OptionSpec, Part, PluginContext, PluginError, Role, ScoreRecord, TokenDelta,
    TokenizeRecord,
};

/// Size of the mock vocabulary, for smoothing and embeddings.
const VOCAB: f64 = 1000.0;
const EMBEDDING_DIM: usize = 16;

pub struct Mock {
    model_id: String,
    reply_words: usize,
    latency: Duration,
    token_latency: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    cache_enabled: bool,
    previous_prompt: Vec<u32>,
    stats: BackendStats,
}

impl Backend for Mock {
    const NAME: &'static str = "mock";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");

    fn options() -> Vec<OptionSpec> {
        vec![
            OptionSpec::new(
                "reply_words",
                OptionKind::Integer,
                json!(8),
                "Most words per reply.",
            ),
            OptionSpec::new(
                "latency_ms",
                OptionKind::Integer,
                json!(0),
                "Sleep per call, to act slow.",
            ),
            OptionSpec::new(
                "token_latency_ms",
                OptionKind::Integer,
                json!(0),
                "Sleep before each streamed word, to act like a model decoding.",
            ),
        ]
    }

    fn new(context: PluginContext) -> Result<Self, PluginError> {
        let options = context.options()?;
        let int =
            |key: &str, default: u64| options.get(key).and_then(|v| v.as_u64()).unwrap_or(default);
        Ok(Mock {
            model_id: context.model_id.to_string(),
            reply_words: int("reply_words", 8).max(1) as usize,
            latency: Duration::from_millis(int("latency_ms", 0)),
            token_latency: Duration::from_millis(int("token_latency_ms", 0)),
            state: Mutex::default(),
        })
    }

    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            returns_logprobs: true,
            scores_continuations: true,
            audio_input: true,
            image_input: true,
            hides: true,
            prefix_cache: true,
            embeddings: true,
        }
    }

    /// Hands out the reply a word at a time (after `token_latency_ms` each), stopping early
    /// when `sink` says so: how a real backend streams.
    fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        let (mut record, words) = self.reply(snapshot, config)?;
        for (i, word) in words.iter().enumerate() {
            sleep(self.token_latency);
            let text = if i == 0 {
                word.clone()
            } else {
                format!(" {word}")
            };
            let go_on = sink(&TokenDelta {
                token_ids: vec![record.token_ids[i]].into(),
                logprobs: vec![record.logprobs[i]].into(),
                text: text.into(),
            });
            if !go_on && i + 1 < words.len() {
                record.text = words[..=i].join(" ").into();
                record.token_ids.truncate(i + 1);
                record.logprobs.truncate(i + 1);
                record.finish_reason = FinishReason::Length;
                break;
            }
        }
        self.state.lock().map_err(poisoned)?.stats.generated_tokens +=
            record.token_ids.len() as u64;
        Ok(record)
    }

    /// One prompt at a time, each through the prefix cache.
    fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let words: Vec<&str> = reply.split_whitespace().collect();
        snapshots
            .iter()
            .map(|snapshot| {
                let prompt = prompt_words(snapshot);
                let cached = self.run_prompt(&prompt);
                Ok(ScoreRecord {
                    token_ids: words.iter().map(|w| token_id(w)).collect(),
                    logprobs: continuation_logprobs(&prompt, &words).into(),
                    prompt_tokens: prompt.len() as u32,
                    cached_prompt_tokens: cached,
                })
            })
            .collect()
    }

    /// A bag of words forgets what it cannot see or hear: each entry scores the reply with the
    /// words of its hidden spans, image boxes and audio stretches left out of the prompt (the
    /// mock keeps no state for the messages before `from_message` to have seen them).
    fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        parts: &Hideable,
        hidden: &[Vec<u32>],
        _from_message: u32,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let words: Vec<&str> = reply.split_whitespace().collect();
        let placed = placed_words(snapshot);
        hidden
            .iter()
            .map(|entry| {
                let hidden = parts.hidden(entry);
                let prompt: Vec<String> = (placed.iter())
                    .filter(|w| !w.hidden_by(&hidden))
                    .map(|w| w.text.clone())
                    .collect();
                Ok(ScoreRecord {
                    token_ids: words.iter().map(|w| token_id(w)).collect(),
                    logprobs: continuation_logprobs(&prompt, &words).into(),
                    prompt_tokens: prompt.len() as u32,
                    cached_prompt_tokens: 0,
                })
            })
            .collect()
    }

    fn set_kv_cache(&self, settings: KvCacheSettings) -> Result<(), PluginError> {
        let mut state = self.state.lock().map_err(poisoned)?;
        *state = State {
            cache_enabled: settings.enabled,
            ..State::default()
        };
        Ok(())
    }

    fn stats(&self) -> BackendStats {
        self.state.lock().map(|s| s.stats).unwrap_or_default()
    }

    /// The prompt's words (role markers included), each word a token; a raw text's pieces
    /// spell it (each word with the whitespace after it). Ids are hashes, so `detokenize` is
    /// left unsupported: the default says so.
    fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        _add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        let words = prompt_words(snapshot);
        let pieces = if snapshot.is_raw() {
            spelled(&snapshot.raw_text())
        } else {
            words.clone()
        };
        Ok(TokenizeRecord::text(
            words.iter().map(|w| token_id(w)).collect(),
            pieces.into_iter().map(Into::into).collect(),
        ))
    }

    /// The mean of the text's word embeddings: the same text, the same vector.
    fn embed(&self, texts: &[String]) -> Result<Vec<EmbeddingRecord>, PluginError> {
        Ok(texts
            .iter()
            .map(|text| {
                let ids: Vec<u32> = text.split_whitespace().map(token_id).collect();
                EmbeddingRecord {
                    embedding: mean_embedding(&ids, 0).into(),
                    prompt_tokens: ids.len() as u32,
                }
            })
            .collect())
    }
}

impl Mock {
    /// The whole reply to `snapshot` and its words.
    fn reply(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<(GenerationRecord, Vec<String>), PluginError> {
        let prompt = prompt_words(snapshot);
        let cached = self.run_prompt(&prompt);
        // Replies draw on message words, not on the role markers.
        let content: Vec<String> = (placed_words(snapshot).into_iter())
            .filter(|w| !matches!(w.from, Source::Marker))
            .map(|w| w.text)
            .collect();
        let content = if content.is_empty() {
            prompt.clone()
        } else {
            content
        };
        // Greedy replies depend on the snapshot alone; sampled ones on the seed too.
        let salt = if config.temperature > 0.0 {
            config.seed
        } else {
            0
        };
        let mut words = Vec::new();
        let mut finish_reason = FinishReason::Eos;
        // An empty prompt gives no words to draw on: the reply ends at once.
        let reply_words = if content.is_empty() {
            0
        } else {
            self.reply_words
        };
        for i in 0..reply_words {
            if words.len() == config.max_new_tokens as usize {
                finish_reason = FinishReason::Length;
                break;
            }
            let pick = fnv(&[
                snapshot.snapshot_id.as_bytes(),
                &salt.to_le_bytes(),
                &i.to_le_bytes(),
            ]);
            words.push(content[pick as usize % content.len()].clone());
            let text = words.join(" ");
            if let Some(stop) = config.stop.iter().find(|s| text.contains(s.as_str())) {
                let cut = text.find(stop.as_str()).unwrap_or(text.len());
                words = text[..cut].split_whitespace().map(str::to_string).collect();
                finish_reason = FinishReason::StopString;
                break;
            }
        }
        let token_ids: Vec<u32> = words.iter().map(|w| token_id(w)).collect();
        let logprobs = continuation_logprobs(&prompt, &words);
        let embeddings = config.compute_embeddings.then(|| {
            (
                mean_embedding(&token_ids, 0).into(),
                mean_embedding(&token_ids, fnv(&[snapshot.snapshot_id.as_bytes()])).into(),
            )
        });
        let record = GenerationRecord {
            text: words.join(" ").into(),
            token_ids: token_ids.into(),
            logprobs: logprobs.into(),
            embedding: embeddings.clone().map(|e| e.0).into(),
            contextual_embedding: embeddings.map(|e| e.1).into(),
            prompt_tokens: prompt.len() as u32,
            cached_prompt_tokens: cached,
            finish_reason,
        };
        Ok((record, words))
    }

    /// Accounts a prompt: the tokens it shares with the previous prompt count as cached.
    fn run_prompt(&self, prompt: &[String]) -> u32 {
        sleep(self.latency);
        let ids: Vec<u32> = prompt.iter().map(|w| token_id(w)).collect();
        let Ok(mut state) = self.state.lock() else {
            return 0;
        };
        let shared = ids
            .iter()
            .zip(&state.previous_prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let cached = if state.cache_enabled {
            shared.min(ids.len().saturating_sub(1))
        } else {
            0
        };
        let enabled = state.cache_enabled;
        let stats = &mut state.stats;
        stats.prompt_tokens += ids.len() as u64;
        stats.kv_cache_reused_tokens += cached as u64;
        stats.kv_cache_hits += u64::from(cached > 0);
        stats.kv_cache_misses += u64::from(enabled && cached == 0);
        state.previous_prompt = ids;
        cached as u32
    }
}

/// The prompt as words, with each chat message introduced by its role (raw text has none),
/// and its images and audio as the words the mock sees and hears in them.
fn prompt_words(snapshot: &ConversationSnapshot) -> Vec<String> {
    placed_words(snapshot).into_iter().map(|w| w.text).collect()
}

/// A prompt word and where it came from, so that `score_hidden` can hide it.
struct Word {
    text: String,
    message: usize,
    from: Source,
}

enum Source {
    /// A message's role marker.
    Marker,
    /// A word of a document or of a tool call (its function's name or its arguments): read,
    /// never hidden.
    Fixed,
    /// Samples `start..end` of the message's audio clip `clip`.
    Sound(usize, std::ops::Range<usize>),
    /// Bytes of the message's text.
    Text(std::ops::Range<usize>),
    /// A cell `[x0, y0, x1, y1]` of the message's image `image`.
    Cell(usize, [u32; 4]),
}

impl Word {
    /// Whether a hidden span, box or stretch of audio covers it.
    fn hidden_by(&self, hidden: &Hidden<'_>) -> bool {
        let message = self.message as u32;
        match &self.from {
            Source::Marker | Source::Fixed => false,
            Source::Text(r) => hidden.spans.iter().any(|s| {
                s.message == message && (s.start as usize) < r.end && r.start < s.end as usize
            }),
            Source::Cell(image, [x0, y0, x1, y1]) => hidden.boxes.iter().any(|b| {
                let [bx0, by0, bx1, by1] = b.bounds;
                b.message == message
                    && b.image as usize == *image
                    && *x0 < bx1
                    && bx0 < *x1
                    && *y0 < by1
                    && by0 < *y1
            }),
            Source::Sound(clip, r) => hidden.clips.iter().any(|c| {
                c.message == message
                    && c.audio as usize == *clip
                    && (c.start as usize) < r.end
                    && r.start < c.end as usize
            }),
        }
    }
}

/// The prompt's words in order, each with where it came from.
fn placed_words(snapshot: &ConversationSnapshot) -> Vec<Word> {
    // The documents come first, as templates give them.
    let documents =
        (snapshot.documents.iter()).filter_map(|d| lmhost_plugin_api::document_text(d).ok());
    let mut words: Vec<Word> = documents
        .flat_map(|text| {
            (spans_of(&text).map(|(_, w)| Word {
                text: w.to_string(),
                message: 0,
                from: Source::Fixed,
            }))
            .collect::<Vec<_>>()
        })
        .collect();
    for (m, message) in snapshot.messages().enumerate() {
        let word = |text: String, from| Word {
            text,
            message: m,
            from,
        };
        if message.role != Role::Raw {
            words.push(word(format!("{}:", message.role.as_str()), Source::Marker));
        }
        let (mut offset, mut images, mut clips) = (0, 0, 0);
        for part in message.parts.iter() {
            match part {
                Part::Text { text } => {
                    for (start, piece) in spans_of(text) {
                        let at = offset + start..offset + start + piece.len();
                        words.push(word(piece.to_string(), Source::Text(at)));
                    }
                    offset += text.len();
                }
                Part::Image { image } => {
                    for (name, cell) in seen(image) {
                        words.push(word(name, Source::Cell(images, cell)));
                    }
                    images += 1;
                }
                Part::Audio { audio } => {
                    for (name, samples) in heard(audio) {
                        words.push(word(name, Source::Sound(clips, samples)));
                    }
                    clips += 1;
                }
            }
        }
        // A call reads as its function's name and the words of its arguments.
        for call in message.tool_calls.iter() {
            let called = std::iter::once(call.name.as_str())
                .chain(spans_of(&call.arguments).map(|(_, w)| w));
            words.extend(called.map(|w| word(w.to_string(), Source::Fixed)));
        }
    }
    words
}

/// The whitespace-separated words of `text` with their byte offsets.
fn spans_of(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split_whitespace()
        .map(move |w| (w.as_ptr() as usize - text.as_ptr() as usize, w))
}

/// The colours of an image's 4 x 4 cells: a word per colour per cell that holds a pixel of
/// it, with the cell's box.
fn seen(image: &Image) -> Vec<(String, [u32; 4])> {
    let (w, h) = (image.width as usize, image.height as usize);
    let mut words = Vec::new();
    for cell in 0..16 {
        let (row, col) = (cell / 4, cell % 4);
        let ys = row * h / 4..(row + 1) * h / 4;
        let xs = col * w / 4..(col + 1) * w / 4;
        for (channel, name) in ["red", "green", "blue"].iter().enumerate() {
            let found = ys.clone().any(|y| {
                xs.clone().any(|x| {
                    let pixel = &image.rgb[(y * w + x) * 3..][..3];
                    (0..3).all(|c| match c == channel {
                        true => pixel[c] >= 200,
                        false => pixel[c] <= 60,
                    })
                })
            });
            if found {
                let bounds = [xs.start, ys.start, xs.end, ys.end].map(|v| v as u32);
                words.push((name.to_string(), bounds));
            }
        }
    }
    words
}

/// `loud` for each quarter second of `audio` whose peak reaches 0.5, with its samples.
fn heard(audio: &Audio) -> Vec<(String, std::ops::Range<usize>)> {
    let quarter = (audio.sample_rate as usize / 4).max(1);
    (audio.samples.chunks(quarter).enumerate())
        .filter(|(_, chunk)| chunk.iter().any(|s| s.abs() >= 0.5))
        .map(|(k, chunk)| ("loud".to_string(), k * quarter..k * quarter + chunk.len()))
        .collect()
}

/// Raw text's words, each with the whitespace after it (the first with any before it too), so
/// the pieces spell the text and there is one per word.
fn spelled(text: &str) -> Vec<String> {
    let mut starts = Vec::new();
    let mut in_word = false;
    for (i, c) in text.char_indices() {
        if !c.is_whitespace() && !in_word {
            starts.push(if starts.is_empty() { 0 } else { i });
        }
        in_word = !c.is_whitespace();
    }
    let ends = starts.iter().skip(1).copied().chain([text.len()]);
    starts
        .iter()
        .zip(ends)
        .map(|(&a, b)| text[a..b].to_string())
        .collect()
}

/// Each word's logprob given the prompt and the words before it, as a causal model's would be:
/// so scoring text as one raw prompt or as a prompt and its continuation agrees.
fn continuation_logprobs(prompt: &[String], words: &[impl AsRef<str>]) -> Vec<f32> {
    let mut context = prompt.to_vec();
    words
        .iter()
        .map(|word| {
            let logprob = logprob(&context, word.as_ref());
            context.push(word.as_ref().to_string());
            logprob
        })
        .collect()
}

/// log p(word | context): smoothed frequency of the word in the context.
fn logprob(prompt: &[String], word: &str) -> f32 {
    let count = prompt.iter().filter(|w| w.as_str() == word).count() as f64;
    ((count + 0.1) / (prompt.len() as f64 + 0.1 * VOCAB)).ln() as f32
}

fn token_id(word: &str) -> u32 {
    (fnv(&[word.as_bytes()]) % VOCAB as u64) as u32
}

/// Mean of pseudo-random unit-range vectors, one per token id, offset by `salt`.
fn mean_embedding(ids: &[u32], salt: u64) -> Vec<f32> {
    let mut mean = [0.0f32; EMBEDDING_DIM];
    for &id in ids {
        for (d, slot) in mean.iter_mut().enumerate() {
            let h = fnv(&[&id.to_le_bytes(), &d.to_le_bytes(), &salt.to_le_bytes()]);
            *slot += (h % 2001) as f32 / 1000.0 - 1.0;
        }
    }
    let n = ids.len().max(1) as f32;
    mean.iter().map(|v| v / n).collect()
}

/// FNV-1a with a splitmix64 finish (FNV's low bits mix poorly): stable across runs,
/// platforms and Rust versions, unlike `DefaultHasher`.
fn fnv(chunks: &[&[u8]]) -> u64 {
    let h = chunks
        .iter()
        .flat_map(|c| c.iter())
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    let h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn poisoned<T>(_: T) -> PluginError {
    PluginError::internal("mock state lock poisoned by an earlier panic")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_pieces_spell_the_text_one_per_word() {
        let text = "  red green\nblue  ";
        let pieces = spelled(text);
        assert_eq!(pieces, ["  red ", "green\n", "blue  "]);
        assert_eq!(pieces.concat(), text);
        assert!(spelled(" \t").is_empty());
    }

    #[test]
    fn a_continuation_scores_as_the_whole_text_does() {
        let words = |t: &str| t.split_whitespace().map(String::from).collect::<Vec<_>>();
        let whole = continuation_logprobs(&words("red"), &words("green red red"));
        let tail = continuation_logprobs(&words("red green"), &words("red red"));
        assert_eq!(&whole[1..], tail.as_slice());
    }

    fn mock() -> Mock {
        Mock {
            model_id: "m".into(),
            reply_words: 2,
            latency: Duration::ZERO,
            token_latency: Duration::ZERO,
            state: Mutex::new(State {
                cache_enabled: true,
                ..State::default()
            }),
        }
    }

    /// An empty prompt has no token to keep out of the cache, and no word to reply with.
    #[test]
    fn an_empty_prompt_gets_an_empty_reply() {
        let mock = mock();
        let (record, words) = mock
            .reply(&ConversationSnapshot::raw(""), &GenerationConfig::default())
            .unwrap();
        assert!(words.is_empty());
        assert_eq!(record.finish_reason, FinishReason::Eos);
        assert_eq!(mock.run_prompt(&[]), 0);
        assert_eq!(mock.run_prompt(&[]), 0);
        let words = ["a".to_string(), "b".to_string()];
        mock.run_prompt(&words);
        assert_eq!(mock.run_prompt(&words), 1);
    }
}
