//! A local text model's front end: a conversation to the prompt ids the model runs, a reply to
//! the ids it is scored as, and the rules that end a sampled reply. candle and onnx both run
//! their models behind one, so a prompt, a score and a stop mean the same on either.

use std::ops::Range;

use lmhost_plugin_api::{
    ConversationSnapshot, FinishReason, GenerationConfig, GenerationRecord, Hideable, Image,
    ImageBox, Part, PluginError, TokenDelta, TokenizeRecord,
};

use crate::gguf::Metadata;
use crate::multimodal::Vision;
use crate::prompt::PromptFormat;
use crate::sampling::{log_softmax_at, Rng, Sampler};
use crate::template::ChatTemplate;
use crate::tokenizer::{TextTokenizer, TokenizerError};

/// What prompting a model needs, read without its weights: how to tokenize, how to render a
/// chat, when to stop. From a GGUF's metadata ([`ModelText::from_gguf`]) or a Hugging Face
/// directory's text files ([`ModelText::from_hf`]).
pub struct ModelText {
    pub tokenizer: TextTokenizer,
    /// The model's own chat template (with its BOS and EOS strings), if it ships one.
    pub chat_template: Option<ChatTemplate>,
    /// Ids that end generation.
    pub eos_ids: Vec<u32>,
}

impl ModelText {
    /// A GGUF's tokenizer (`tokenizer.ggml.*`), its `tokenizer.chat_template` and its
    /// end-of-generation ids; any architecture, vocabulary-only files included. Errors name
    /// what was wrong.
    pub fn from_gguf(meta: &Metadata) -> Result<ModelText, String> {
        const KEY: &str = "tokenizer.chat_template";
        let tokenizer = TextTokenizer::from_gguf(meta).map_err(|e| e.to_string())?;
        let chat_template = match meta.str(KEY) {
            None => None,
            Some(source) => {
                let text =
                    |id: Option<u32>| id.and_then(|i| tokenizer.token(i)).map(str::to_string);
                let template = ChatTemplate::new(source, format!("GGUF metadata `{KEY}`"))
                    .map_err(|e| e.to_string())?;
                Some(
                    template
                        .with_special_tokens(text(tokenizer.bos_id()), text(tokenizer.eos_id())),
                )
            }
        };
        Ok(ModelText {
            eos_ids: tokenizer.eog_ids().to_vec(),
            tokenizer,
            chat_template,
        })
    }
}

/// Tokenizer, prompt format, end-of-sequence ids and context length of one model.
pub struct TextFrontEnd {
    pub tokenizer: TextTokenizer,
    format: PromptFormat,
    eos_ids: Vec<u32>,
    max_context: usize,
    /// The model as users named it, for errors.
    model_id: String,
    /// A vision-language model's processor and image ids; `None` for a text model, which
    /// refuses images.
    vision: Option<Vision>,
}

/// A sampled reply and why it ended.
pub struct Sampled {
    /// Detokenized without control tokens, cut before a stop string that ended it.
    pub text: String,
    pub ids: Vec<u32>,
    /// Of each id, from the raw logits.
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
}

/// A prompt's ids and the reply's ids after it.
pub struct Scoring {
    pub prompt: Vec<u32>,
    pub reply: Vec<u32>,
}

impl Sampled {
    /// The generation record of this reply after a prompt of `prompt_tokens`, `cached` of them
    /// reused (no embeddings).
    pub fn record(self, prompt_tokens: usize, cached: usize) -> GenerationRecord {
        GenerationRecord {
            text: self.text.into(),
            token_ids: self.ids.into(),
            logprobs: self.logprobs.into(),
            embedding: None.into(),
            contextual_embedding: None.into(),
            prompt_tokens: prompt_tokens as u32,
            cached_prompt_tokens: cached as u32,
            finish_reason: self.finish,
        }
    }
}

/// What a `score_hidden` call hides: the `parts` that each entry of `hidden` lists by index,
/// from message `from_message` on.
pub struct Hiding<'a> {
    pub parts: &'a Hideable,
    pub hidden: &'a [Vec<u32>],
    pub from_message: u32,
}

/// Whether two `[x0, y0, x1, y1]` boxes share some area.
fn overlaps(a: &[f64; 4], b: &[f64; 4]) -> bool {
    a[0] < b[2] && b[0] < a[2] && a[1] < b[3] && b[1] < a[3]
}

/// A prompt scored with spans hidden: see [`TextFrontEnd::hidden_scoring`].
pub struct HiddenScoring {
    pub prompt: Vec<u32>,
    pub reply: Vec<u32>,
    /// Positions `from..` (at most the prompt's last) are computed for each entry.
    pub from: usize,
    /// Per entry, the positions the rows from `from` on do not attend to.
    pub hidden: Vec<Vec<Range<usize>>>,
}

/// The ids a reply is scored as: on its own after a chat template's turn marker, and as a
/// continuation (no SentencePiece space prefix) after raw text.
pub struct ReplyIds {
    chat: Vec<u32>,
    raw: Vec<u32>,
}

impl ReplyIds {
    /// The reply's ids after `snapshot`'s prompt.
    pub fn after(&self, snapshot: &ConversationSnapshot) -> &[u32] {
        if snapshot.is_raw() {
            &self.raw
        } else {
            &self.chat
        }
    }
}

/// log p(id) from a row of raw logits (-inf for an id outside the model's vocabulary).
pub fn logprob_of(row: &[f32], id: u32) -> f32 {
    log_softmax_at(row, id as usize).unwrap_or(f32::NEG_INFINITY)
}

fn tokenizer_error(e: impl std::fmt::Display) -> PluginError {
    PluginError::internal(format!("tokenizer: {e}"))
}

impl TextFrontEnd {
    /// `template_option` is the backend's `chat_template` option (a file, or `"plain"`), which
    /// overrides the model's own template. `max_context` 0 means the model's `model_max`.
    pub fn new(
        text: ModelText,
        template_option: Option<&str>,
        (max_context, model_max): (usize, usize),
        model_id: &str,
    ) -> Result<Self, PluginError> {
        let ModelText {
            tokenizer,
            chat_template,
            eos_ids,
        } = text;
        let max_context = if max_context == 0 {
            model_max
        } else {
            max_context.min(model_max)
        };
        Ok(TextFrontEnd {
            tokenizer,
            format: PromptFormat::choose(template_option, chat_template)?,
            eos_ids,
            max_context,
            model_id: model_id.to_string(),
            vision: None,
        })
    }

    /// This front end for a vision-language model: prompts with images render through
    /// `vision`'s processor, and each image's placeholders become its ids.
    pub fn with_vision(self, vision: Vision) -> Self {
        TextFrontEnd {
            vision: Some(vision),
            ..self
        }
    }

    /// Whether prompts may hold images.
    pub fn sees_images(&self) -> bool {
        self.vision.is_some()
    }

    /// A vision-language model's processor and image ids.
    pub fn vision(&self) -> Option<&Vision> {
        self.vision.as_ref()
    }

    /// The prompt's text and whether the tokenizer adds its special tokens, and, where it has
    /// images, its ids with each image's placeholders standing for that image's features.
    fn render(
        &self,
        snapshot: &ConversationSnapshot,
    ) -> Result<(crate::prompt::Prompt, Option<Vec<u32>>), PluginError> {
        let Some(vision) = self.vision.as_ref() else {
            return Ok((self.format.render(snapshot, &self.model_id)?, None));
        };
        let processor = vision.processor.as_ref();
        let (prompt, images) =
            self.format
                .render_with_images(snapshot, &self.model_id, processor)?;
        let mut ids = self.encode(&prompt.text, prompt.add_special)?;
        place_images(vision, &mut ids, &images)?;
        Ok((prompt, Some(ids)))
    }

    /// Longest prompt + reply, in tokens.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Tokens of `text`; special-token strings in it (chat markers) become their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, PluginError> {
        self.tokenizer
            .encode(text, add_special, true)
            .map_err(tokenizer_error)
    }

    /// The text of `ids`; `skip_special` drops control tokens (an end-of-turn marker).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, PluginError> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(tokenizer_error)
    }

    /// The text of `ids` as a user asked for it: ids outside the vocabulary are refused.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String, PluginError> {
        let vocab = self.tokenizer.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(PluginError::invalid_input(format!(
                "token id {id} is outside the vocabulary of {vocab} tokens"
            )));
        }
        self.decode(ids, false)
    }

    /// The prompt's tokens as the model runs them (`add_special`), or its text's tokens alone.
    pub fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord, PluginError> {
        let (prompt, images) = match &self.vision {
            Some(vision) => {
                let processor = vision.processor.as_ref();
                let (prompt, images) =
                    (self.format).render_with_images(snapshot, &self.model_id, processor)?;
                let sizes: Vec<(u32, u32)> = images.iter().map(|i| (i.height, i.width)).collect();
                (
                    prompt,
                    Some((processor, processor.num_multimodal_tokens(&sizes))),
                )
            }
            None => (self.format.render(snapshot, &self.model_id)?, None),
        };
        let ids = self.encode(&prompt.text, add_special && prompt.add_special)?;
        let pieces = ids
            .iter()
            .map(|&id| self.decode(&[id], false).map(Into::into))
            .collect::<Result<Vec<_>, _>>()?;
        let mut record = TokenizeRecord::text(ids, pieces);
        if let Some((processor, counts)) = images {
            let modalities = processor.modalities(&record.token_ids);
            record.mm_token_type_ids = modalities.into_iter().map(|m| m as u8).collect();
            record.images = counts.into();
        }
        Ok(record)
    }

    /// The prompt's tokens, checked to be non-empty and to leave room for `extra` tokens.
    pub fn prompt_ids(
        &self,
        snapshot: &ConversationSnapshot,
        extra: usize,
    ) -> Result<Vec<u32>, PluginError> {
        let (prompt, imaged) = self.render(snapshot)?;
        let mut ids = match imaged {
            Some(ids) => ids,
            None => self.encode(&prompt.text, prompt.add_special)?,
        };
        if ids.is_empty() && prompt.add_special {
            // Empty raw text starts from the model's start-of-text token, so that it can still
            // be continued (an explanation's empty coalition is such a prompt).
            ids.extend(self.tokenizer.bos_id());
        }
        if ids.is_empty() {
            return Err(PluginError::invalid_input(
                "the prompt is empty (0 tokens, and the model has no BOS token to start from)",
            ));
        }
        if ids.len() + extra > self.max_context {
            return Err(PluginError::invalid_input(format!(
                "the prompt has {} tokens{}, more than the context of {} tokens",
                ids.len(),
                if extra > 0 {
                    format!(" (+{extra} reply tokens)")
                } else {
                    String::new()
                },
                self.max_context
            )));
        }
        Ok(ids)
    }

    /// The ids `reply` is scored as (the same after every prompt of a kind).
    pub fn reply_ids(&self, reply: &str) -> Result<ReplyIds, PluginError> {
        Ok(ReplyIds {
            chat: self.encode(reply, false)?,
            raw: self
                .tokenizer
                .encode_continuation(reply)
                .map_err(tokenizer_error)?,
        })
    }

    /// Each prompt of a batch with the reply after it. A prompt that cannot be scored (too
    /// long) fails the call, naming it.
    pub fn scoring_items(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<Scoring>, PluginError> {
        let replies = self.reply_ids(reply)?;
        snapshots
            .iter()
            .enumerate()
            .map(|(i, snapshot)| {
                let reply = replies.after(snapshot);
                let prompt = self.prompt_ids(snapshot, reply.len()).map_err(|e| {
                    if snapshots.len() > 1 {
                        PluginError::new(e.kind, format!("prompt {i} of the batch: {}", e.message))
                    } else {
                        e
                    }
                })?;
                Ok(Scoring {
                    prompt,
                    reply: reply.to_vec(),
                })
            })
            .collect()
    }

    /// A prompt scored with parts of it hidden (the plugin API's `score_hidden`): its ids, the
    /// reply's, the first position computed again for each entry (the first token of message
    /// `from_message`'s text), and per entry of `hidden` the positions whose tokens overlap a
    /// hidden span or are an image's placeholders whose cells overlap a hidden box, as ranges.
    pub fn hidden_scoring(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        hiding: &Hiding<'_>,
    ) -> Result<HiddenScoring, PluginError> {
        let (prompt, images) = match &self.vision {
            Some(vision) => {
                let processor = vision.processor.as_ref();
                (self.format).render_with_images(snapshot, &self.model_id, processor)?
            }
            None => (self.format.render(snapshot, &self.model_id)?, Vec::new()),
        };
        let starts = message_starts(snapshot, &prompt.text)?;
        let (mut ids, offsets) = self
            .tokenizer
            .encode_with_offsets(&prompt.text, prompt.add_special)
            .map_err(tokenizer_error)?;
        let placed = match &self.vision {
            Some(vision) => place_images(vision, &mut ids, &images)?,
            None => Vec::new(),
        };
        let reply = self.reply_ids(reply)?.after(snapshot).to_vec();
        if ids.is_empty() || ids.len() + reply.len() > self.max_context {
            return Err(PluginError::invalid_input(format!(
                "the prompt has {} tokens (+{} reply tokens); it needs at least one, and at most \
                 the context of {} tokens in all",
                ids.len(),
                reply.len(),
                self.max_context
            )));
        }
        if !hiding.parts.clips.is_empty() {
            return Err(PluginError::unsupported(format!(
                "model `{}` hears no audio, so it cannot hide parts of a clip",
                self.model_id
            )));
        }
        let in_prompt = (hiding.parts.spans.iter())
            .map(|s| {
                let at = starts.get(s.message as usize).ok_or_else(|| {
                    PluginError::invalid_input(format!(
                        "a span is in message {}, past the last",
                        s.message
                    ))
                })?;
                Ok(at + s.start as usize..at + s.end as usize)
            })
            .collect::<Result<Vec<Range<usize>>, PluginError>>()?;
        let covered = self.covered_placeholders(snapshot, &hiding.parts.boxes, &images, &placed)?;
        self.told_apart(&hiding.parts.boxes, &covered)?;
        let boundary = starts
            .get(hiding.from_message as usize)
            .copied()
            .unwrap_or(prompt.text.len());
        let from = offsets
            .iter()
            .position(|t| t.end > boundary)
            .unwrap_or(ids.len())
            .min(ids.len() - 1);
        let hidden = hiding
            .hidden
            .iter()
            .map(|entry| {
                let mut spans = Vec::new();
                let mut positions = vec![false; ids.len()];
                for &i in entry {
                    let i = i as usize;
                    if let Some(span) = in_prompt.get(i) {
                        spans.push(span);
                    } else if let Some(cells) = covered.get(i - in_prompt.len()) {
                        cells.iter().for_each(|&p| positions[p] = true);
                    } else {
                        return Err(PluginError::invalid_input(format!(
                            "hidden part {i} is not given"
                        )));
                    }
                }
                let flags = (offsets.iter().zip(&positions))
                    .map(|(t, &p)| p || spans.iter().any(|s| t.start < s.end && s.start < t.end));
                Ok(runs(flags))
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        Ok(HiddenScoring {
            prompt: ids,
            reply,
            from,
            hidden,
        })
    }

    /// For each of `boxes`, the prompt positions of its image's placeholders whose cells
    /// overlap it (`images` in prompt order, `placed` their placeholders' positions).
    fn covered_placeholders(
        &self,
        snapshot: &ConversationSnapshot,
        boxes: &[ImageBox],
        images: &[&Image],
        placed: &[Vec<usize>],
    ) -> Result<Vec<Vec<usize>>, PluginError> {
        let Some(vision) = self.vision.as_ref().filter(|_| !boxes.is_empty()) else {
            return match boxes.is_empty() {
                true => Ok(Vec::new()),
                false => Err(PluginError::unsupported(format!(
                    "model `{}` sees no images, so it cannot hide parts of one",
                    self.model_id
                ))),
            };
        };
        // Each message's first image, counted over the conversation.
        let mut first = Vec::new();
        let mut count = 0;
        for message in snapshot.messages() {
            first.push(count);
            count += message
                .parts
                .iter()
                .filter(|p| matches!(p, Part::Image { .. }))
                .count();
        }
        boxes
            .iter()
            .map(|b| {
                let k = first.get(b.message as usize).map(|f| f + b.image as usize);
                let found = k.and_then(|k| Some((images.get(k)?, placed.get(k)?)));
                let Some((image, positions)) = found else {
                    return Err(PluginError::invalid_input(format!(
                        "a box is in image {} of message {}, which the prompt does not hold",
                        b.image, b.message
                    )));
                };
                let (w, h) = (f64::from(image.width), f64::from(image.height));
                let [x0, y0, x1, y1] = b.bounds.map(f64::from);
                let target = [x0 / w, y0 / h, x1 / w, y1 / h];
                let cells = vision
                    .processor
                    .placeholder_cells((image.height, image.width));
                Ok((cells.iter().zip(positions))
                    .filter(|(cell, _)| overlaps(cell, &target))
                    .map(|(_, &p)| p)
                    .collect())
            })
            .collect()
    }

    /// Refuses two boxes of one image that cover the same placeholders (`covered`, each box's):
    /// hiding cannot tell them apart, so their values would be one value split by chance.
    fn told_apart(&self, boxes: &[ImageBox], covered: &[Vec<usize>]) -> Result<(), PluginError> {
        for (i, (a, tokens)) in boxes.iter().zip(covered).enumerate() {
            let twin =
                (boxes.iter().zip(covered).enumerate().skip(i + 1)).find(|(_, (b, other))| {
                    (b.message, b.image) == (a.message, a.image) && other == &tokens
                });
            if let Some((j, (b, _))) = twin {
                return Err(PluginError::invalid_input(format!(
                    "boxes {i} {:?} and {j} {:?} of image {} of message {} cover the same {} \
                     image tokens of model `{}`, so hiding cannot tell them apart; the model's \
                     image tokens are coarser than these regions: use fewer `grid` cells or \
                     larger regions, or paint them (a `fill` with absence \"delete\")",
                    a.bounds,
                    b.bounds,
                    a.image,
                    a.message,
                    tokens.len(),
                    self.model_id
                )));
            }
        }
        Ok(())
    }

    /// Samples a reply after a prompt of `prompt_len` tokens whose last logits row is `row`;
    /// `next(id)` runs the model one token on and returns the following row. Ends at an
    /// end-of-sequence id, a stop string, `max_new_tokens` or the context length, or when
    /// `sink`, handed each token as it comes, answers `false` (then as `Length`: cut short).
    pub fn sample(
        &self,
        config: &GenerationConfig,
        prompt_len: usize,
        mut row: Vec<f32>,
        mut next: impl FnMut(u32) -> Result<Vec<f32>, PluginError>,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<Sampled, PluginError> {
        let sampler = Sampler::of(config);
        let mut rng = Rng::new(config.seed);
        let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
        let mut reply = ReplyText::default();
        // Bytes of `reply.text` handed to `sink`: all but what may still begin a stop string.
        let mut sent = 0;
        loop {
            let id = sampler.pick(&row, &mut rng);
            let logprob = logprob_of(&row, id);
            logprobs.push(logprob);
            ids.push(id);
            let ends = if self.eos_ids.contains(&id) {
                Some(FinishReason::Eos)
            } else if ids.len() >= config.max_new_tokens as usize
                || prompt_len + ids.len() > self.max_context
            {
                Some(FinishReason::Length)
            } else {
                None
            };
            reply
                .extend(&self.tokenizer, &ids, ends.is_some())
                .map_err(tokenizer_error)?;
            let text = &mut reply.text;
            // A stop string begins in text not yet handed out: `settled` held back every
            // possible start.
            let stop = config
                .stop
                .iter()
                .filter_map(|s| text[sent..].find(s.as_str()))
                .min();
            let mut finish = match stop {
                Some(at) => {
                    text.truncate(sent + at);
                    Some(FinishReason::StopString)
                }
                None => ends,
            };
            let settled = match finish {
                Some(_) => text.len(),
                None => sent + settled(&text[sent..], &config.stop),
            };
            let go_on = sink(&TokenDelta {
                token_ids: vec![id].into(),
                logprobs: vec![logprob].into(),
                text: text[sent..settled].into(),
            });
            sent = settled;
            if !go_on {
                finish = finish.or(Some(FinishReason::Length));
            }
            if let Some(finish) = finish {
                return Ok(Sampled {
                    text: reply.text,
                    ids,
                    logprobs,
                    finish,
                });
            }
            row = next(id)?;
        }
    }
}

/// A reply's text, decoded as its ids come (as TGI does): each id decodes in a window with
/// the ids of the last step that added text before it (what a decoder needs to place a
/// leading space or finish a character), and adds what that window's text has past theirs.
/// A token then costs the same at the thousandth id as at the first, where decoding the whole
/// reply every token grew with its length.
#[derive(Default)]
pub struct ReplyText {
    text: String,
    /// Where the window begins: the first id of the last step that added text.
    prefix: usize,
    /// The ids decoded into `text` so far.
    read: usize,
}

/// The most ids text waits for to finish a character: its up to 4 byte-fallback ids, after ids
/// that add no text of their own (a leading space a decoder strips, a skipped control token).
/// Past that the U+FFFD is the text (bytes that are not UTF-8).
const UNFINISHED: usize = 16;

impl ReplyText {
    /// Adds the text (control tokens skipped) of the ids of `ids`, the whole reply so far, past
    /// those already read, unless it ends in an unfinished character (U+FFFD) that more
    /// ids may finish (not at the `last` id, nor after [`UNFINISHED`] ids).
    pub fn extend(
        &mut self,
        tokenizer: &TextTokenizer,
        ids: &[u32],
        last: bool,
    ) -> Result<(), TokenizerError> {
        let before = tokenizer.decode(&ids[self.prefix..self.read], true)?;
        let after = tokenizer.decode(&ids[self.prefix..], true)?;
        let waits = after.ends_with('\u{FFFD}') && ids.len() - self.read < UNFINISHED;
        if after.len() <= before.len() || (waits && !last) {
            return Ok(());
        }
        // Past the two texts' common part: all of `after` past `before`, unless a decoder
        // rewrote the seam (then what was handed out stays as it was).
        let common = before
            .char_indices()
            .zip(after.chars())
            .find(|((_, b), a)| b != a)
            .map_or(before.len(), |((i, _), _)| i);
        self.text.push_str(&after[common..]);
        (self.prefix, self.read) = (self.read, ids.len());
        Ok(())
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Where each message's text begins in the rendered prompt, found in order; a template that
/// rewrites a message's text (so it cannot be found) is refused.
fn message_starts(
    snapshot: &ConversationSnapshot,
    prompt: &str,
) -> Result<Vec<usize>, PluginError> {
    let mut cursor = 0;
    snapshot
        .messages()
        .enumerate()
        .map(|(m, message)| {
            let text = message.text_content();
            let at = prompt[cursor..]
                .find(&text)
                .map(|i| cursor + i)
                .ok_or_else(|| {
                    PluginError::invalid_input(format!(
                    "message {m}'s text does not appear as it is in the prompt the chat template \
                     renders, so its spans cannot be hidden"
                ))
                })?;
            cursor = at + text.len();
            Ok(at)
        })
        .collect()
}

/// Gives each image's placeholders in `ids` (the prompt's tokens, the images in the order their
/// placeholders stand) the image's ids, in order: in one run, or one run per tile between the
/// tiles' markers. Returns each image's placeholder positions.
fn place_images(
    vision: &Vision,
    ids: &mut [u32],
    images: &[&Image],
) -> Result<Vec<Vec<usize>>, PluginError> {
    let processor = vision.processor.as_ref();
    let placeholder = processor.image_token_id();
    let mut slots = (ids.iter_mut().enumerate()).filter(|(_, id)| **id == placeholder);
    let mut placed = Vec::with_capacity(images.len());
    for image in images {
        let count = processor.image_tokens((image.height, image.width)).tokens as usize;
        let first = vision.ids.ids_of(image, count)?;
        let mut positions = Vec::with_capacity(count);
        for k in 0..count as u32 {
            let (at, slot) = slots.next().ok_or_else(|| {
                PluginError::internal("the prompt holds fewer placeholders than its images")
            })?;
            *slot = first + k;
            positions.push(at);
        }
        placed.push(positions);
    }
    if slots.next().is_some() {
        return Err(PluginError::invalid_input(format!(
            "the conversation's text holds the image placeholder `{}`, which stands for image \
             features only",
            processor.image_token()
        )));
    }
    Ok(placed)
}

/// The runs of `true` in `flags`, as index ranges.
fn runs(flags: impl Iterator<Item = bool>) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, flag) in flags.enumerate() {
        match out.last_mut() {
            Some(run) if flag && run.end == i => run.end = i + 1,
            _ if flag => out.push(i..i + 1),
            _ => {}
        }
    }
    out
}

/// How much of a reply's text can be handed out before the tokens that follow: all but an
/// unfinished character (decoded as U+FFFD) and the longest end that could begin a stop string.
fn settled(text: &str, stops: &[impl AsRef<str>]) -> usize {
    let end = text.trim_end_matches('\u{FFFD}').len();
    let text = &text[..end];
    let held = stops
        .iter()
        .flat_map(|stop| {
            let stop = stop.as_ref();
            stop.char_indices()
                .skip(1)
                .map(move |(k, _)| &stop[..k])
                .chain(std::iter::once(stop))
        })
        .filter(|head| text.ends_with(head))
        .map(str::len)
        .max()
        .unwrap_or(0);
    end - held
}

#[cfg(test)]
mod tests {
    use lmhost_plugin_api::{ConversationSnapshot, Message, Role, Turn};

    use super::{message_starts, runs, settled};

    #[test]
    fn messages_are_found_in_order_and_a_rewritten_one_is_refused() {
        let messages = vec![
            Message::text(Role::System, "Be brief."),
            Message::text(Role::User, "Be brief."),
        ];
        let snapshot = ConversationSnapshot::new(vec![Turn {
            messages: messages.into(),
        }])
        .unwrap();
        let prompt = "<s>Be brief.</s><u>Be brief.</u>";
        assert_eq!(message_starts(&snapshot, prompt).unwrap(), vec![3, 19]);
        let err = message_starts(&snapshot, "<s>Be brief.</s><u>BE BRIEF.</u>").unwrap_err();
        assert!(
            err.message.contains("message 1's text does not appear"),
            "{err:?}"
        );
    }

    #[test]
    fn runs_gather_consecutive_flags() {
        let flags = [true, true, false, true, false, false, true];
        assert_eq!(runs(flags.into_iter()), vec![0..2, 3..4, 6..7]);
        assert!(runs([false, false].into_iter()).is_empty());
    }

    #[test]
    fn text_waits_for_unfinished_characters_and_possible_stop_strings() {
        let none: [&str; 0] = [];
        assert_eq!(settled("Hello", &none), 5);
        assert_eq!(settled("caf\u{FFFD}", &none), 3);
        assert_eq!(settled("Hello\nUs", &["\nUser:"]), 5);
        assert_eq!(settled("Hello\n", &["\nUser:", "\n\n"]), 5);
        assert_eq!(settled("Hello, Use", &["\nUser:"]), 10);
        assert_eq!(settled("ab", &["b", "ab"]), 0);
    }
}
