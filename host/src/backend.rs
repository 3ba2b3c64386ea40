//! The host's handle on a backend: plugin errors become host errors that name the plugin, and
//! every request is validated before it crosses the boundary.

use lmhost_plugin_api::abi_stable::sabi_trait::TD_Opaque;
use lmhost_plugin_api::abi_stable::std_types::{RSlice, RStr, RString, RVec};
use lmhost_plugin_api::{
    AudioSpan, BackendBox, BackendStats, Capabilities, ConversationSnapshot, EmbeddingRecord,
    GenerationConfig, GenerationRecord, Hideable, ImageBox, KvCacheSettings, Message, Part,
    PluginError, ScoreRecord, TextSpan, TokenDelta, TokenSink, TokenSink_TO, TokenizeRecord,
};

use crate::error::{Error, Result};

/// A backend made by a plugin. Shareable across threads; dropping it closes the backend.
pub struct Backend {
    plugin: String,
    inner: BackendBox,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backend({})", self.plugin)
    }
}

impl Backend {
    pub(crate) fn new(plugin: String, inner: BackendBox) -> Self {
        Backend { plugin, inner }
    }

    /// The name of the plugin that made this backend.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    pub fn model_id(&self) -> String {
        self.inner.model_id().into_string()
    }

    pub fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    pub fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
    ) -> Result<GenerationRecord> {
        config.validate().map_err(|e| self.wrap(e))?;
        self.inner
            .generate(snapshot, config)
            .into_result()
            .map_err(|e| self.wrap(e))
    }

    /// `generate`, calling `on_token` with the tokens as they come; its `false` stops
    /// generation (within one token on a streaming backend). A backend that does not stream
    /// calls it once, with the whole reply.
    pub fn generate_stream(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        on_token: impl FnMut(&TokenDelta) -> bool + Send,
    ) -> Result<GenerationRecord> {
        config.validate().map_err(|e| self.wrap(e))?;
        let mut sink = Sink(on_token);
        self.inner
            .generate_stream(
                snapshot,
                config,
                TokenSink_TO::from_ptr(&mut sink, TD_Opaque),
            )
            .into_result()
            .map_err(|e| self.wrap(e))
    }

    /// `generate` after each prompt, in order, decoded together where the backend can.
    pub fn generate_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        config: &GenerationConfig,
    ) -> Result<Vec<GenerationRecord>> {
        config.validate().map_err(|e| self.wrap(e))?;
        let records = self
            .inner
            .generate_batch(snapshots.into(), config)
            .into_result()
            .map_err(|e| self.wrap(e))?;
        self.counted(records.into_vec(), snapshots.len(), "generate_batch")
    }

    pub fn score(&self, snapshot: &ConversationSnapshot, reply: &str) -> Result<ScoreRecord> {
        self.inner
            .score(snapshot, RStr::from_str(reply))
            .into_result()
            .map_err(|e| self.wrap(e))
    }

    /// `score` of `reply` after each prompt, in order, batched where the backend can.
    pub fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>> {
        let records = self
            .inner
            .score_batch(snapshots.into(), RStr::from_str(reply))
            .into_result()
            .map_err(|e| self.wrap(e))?;
        self.counted(records.into_vec(), snapshots.len(), "score_batch")
    }

    /// `score` of `reply` after `snapshot` once per entry of `hidden`, with the `parts` it lists
    /// hidden from messages `from_message..` and the reply (see the plugin API's
    /// `score_hidden`). The parts, indexes and message are checked here, so the plugin gets
    /// only valid ones.
    pub fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        (parts, hidden): (&Hideable, &[Vec<u32>]),
        from_message: u32,
    ) -> Result<Vec<ScoreRecord>> {
        let invalid = |e| self.wrap(PluginError::invalid_input(e));
        check_spans(snapshot, &parts.spans).map_err(invalid)?;
        check_boxes(snapshot, &parts.boxes).map_err(invalid)?;
        check_clips(snapshot, &parts.clips).map_err(invalid)?;
        let messages = snapshot.messages().count();
        if from_message as usize >= messages {
            return Err(self.wrap(PluginError::invalid_input(format!(
                "score_hidden recomputes from message {from_message}, but the conversation has \
                 {messages} messages"
            ))));
        }
        if let Some(i) = hidden.iter().flatten().find(|&&i| parts.get(i).is_none()) {
            return Err(self.wrap(PluginError::invalid_input(format!(
                "hidden part {i} is not one of the {} spans, {} boxes and {} clips given",
                parts.spans.len(),
                parts.boxes.len(),
                parts.clips.len()
            ))));
        }
        let hidden: Vec<RVec<u32>> = hidden.iter().map(|h| RVec::from(h.clone())).collect();
        let records = self
            .inner
            .score_hidden(
                snapshot,
                RStr::from_str(reply),
                parts,
                hidden.as_slice().into(),
                from_message,
            )
            .into_result()
            .map_err(|e| self.wrap(e))?;
        self.counted(records.into_vec(), hidden.len(), "score_hidden")
    }

    /// A batch call's `records`, refused unless there is one per prompt.
    fn counted<T>(&self, records: Vec<T>, prompts: usize, call: &str) -> Result<Vec<T>> {
        if records.len() != prompts {
            return Err(self.wrap(PluginError::internal(format!(
                "{call} returned {} records for {prompts} prompts",
                records.len()
            ))));
        }
        Ok(records)
    }

    /// The token ids the model runs for `snapshot`'s prompt (see the plugin API's `tokenize`).
    pub fn tokenize(
        &self,
        snapshot: &ConversationSnapshot,
        add_special: bool,
    ) -> Result<TokenizeRecord> {
        let record = self
            .inner
            .tokenize(snapshot, add_special)
            .into_result()
            .map_err(|e| self.wrap(e))?;
        if record.pieces.len() != record.token_ids.len() {
            return Err(self.wrap(PluginError::internal(format!(
                "tokenize returned {} pieces for {} ids",
                record.pieces.len(),
                record.token_ids.len()
            ))));
        }
        Ok(record)
    }

    /// Loads now what the backend would load on first use; a server calls it before it listens.
    pub fn load(&self) -> Result<()> {
        self.inner.load().into_result().map_err(|e| self.wrap(e))
    }

    /// The text of `ids`, special tokens included.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .detokenize(RSlice::from_slice(ids))
            .into_result()
            .map(|text| text.into_string())
            .map_err(|e| self.wrap(e))
    }

    /// One vector per text (`Unsupported` from a backend that cannot embed).
    pub fn embed(&self, texts: &[String]) -> Result<Vec<EmbeddingRecord>> {
        let texts: Vec<RString> = texts.iter().map(|t| RString::from(t.as_str())).collect();
        self.inner
            .embed(RSlice::from_slice(&texts))
            .into_result()
            .map(RVec::into_vec)
            .map_err(|e| self.wrap(e))
    }

    pub fn set_kv_cache(&self, settings: KvCacheSettings) -> Result<()> {
        self.inner
            .set_kv_cache(settings)
            .into_result()
            .map_err(|e| self.wrap(e))
    }

    pub fn stats(&self) -> BackendStats {
        self.inner.stats()
    }

    fn wrap(&self, source: PluginError) -> Error {
        Error::Plugin {
            plugin: self.plugin.clone(),
            source,
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.inner.close();
    }
}

/// Refuses a span outside its message's text or off a character boundary.
fn check_spans(
    snapshot: &ConversationSnapshot,
    spans: &[TextSpan],
) -> std::result::Result<(), String> {
    let texts: Vec<String> = snapshot.messages().map(|m| m.text_content()).collect();
    for (i, span) in spans.iter().enumerate() {
        let Some(text) = texts.get(span.message as usize) else {
            return Err(format!(
                "span {i} is in message {}, but the conversation has {} messages",
                span.message,
                texts.len()
            ));
        };
        let (start, end) = (span.start as usize, span.end as usize);
        if start > end
            || end > text.len()
            || !text.is_char_boundary(start)
            || !text.is_char_boundary(end)
        {
            return Err(format!(
                "span {i} ({start}..{end}) is not a range of character boundaries of message {}'s \
                 {} bytes of text",
                span.message,
                text.len()
            ));
        }
    }
    Ok(())
}

/// Media part number `k` of its kind (as `pick` finds them) in message `message`.
fn nth_media<'a, T>(
    messages: &[&'a Message],
    (message, k): (u32, u32),
    pick: impl Fn(&'a Part) -> Option<&'a T>,
) -> Option<&'a T> {
    let message = messages.get(message as usize)?;
    message.parts.iter().filter_map(pick).nth(k as usize)
}

fn check_boxes(
    snapshot: &ConversationSnapshot,
    boxes: &[ImageBox],
) -> std::result::Result<(), String> {
    let messages: Vec<&Message> = snapshot.messages().collect();
    for (i, found) in boxes.iter().enumerate() {
        let image = nth_media(&messages, (found.message, found.image), |p| match p {
            Part::Image { image } => Some(image),
            _ => None,
        })
        .ok_or_else(|| {
            format!(
                "box {i} is in image {} of message {}, which the conversation does not have",
                found.image, found.message
            )
        })?;
        let [x0, y0, x1, y1] = found.bounds;
        if x0 >= x1 || y0 >= y1 || x1 > image.width || y1 > image.height {
            return Err(format!(
                "box {i} [{x0}, {y0}, {x1}, {y1}] is not a box of positive area inside its \
                 {}x{} image",
                image.width, image.height
            ));
        }
    }
    Ok(())
}

fn check_clips(
    snapshot: &ConversationSnapshot,
    clips: &[AudioSpan],
) -> std::result::Result<(), String> {
    let messages: Vec<&Message> = snapshot.messages().collect();
    for (i, clip) in clips.iter().enumerate() {
        let audio = nth_media(&messages, (clip.message, clip.audio), |p| match p {
            Part::Audio { audio } => Some(audio),
            _ => None,
        })
        .ok_or_else(|| {
            format!(
                "clip {i} is in audio {} of message {}, which the conversation does not have",
                clip.audio, clip.message
            )
        })?;
        if clip.start >= clip.end || clip.end as usize > audio.samples.len() {
            return Err(format!(
                "clip {i} ({}..{}) is not a non-empty range of its audio's {} samples",
                clip.start,
                clip.end,
                audio.samples.len()
            ));
        }
    }
    Ok(())
}

/// A closure lent to a plugin as its token sink. It must not panic: it runs inside the
/// plugin's call, across the FFI boundary.
struct Sink<F>(F);

impl<F: FnMut(&TokenDelta) -> bool + Send> TokenSink for Sink<F> {
    fn token(&mut self, delta: &TokenDelta) -> bool {
        (self.0)(delta)
    }
}

#[cfg(test)]
mod tests {
    use lmhost_plugin_api::{ConversationSnapshot, TextSpan};

    use super::check_spans;

    #[test]
    fn spans_outside_their_message_or_inside_a_character_are_refused_by_name() {
        let snapshot = ConversationSnapshot::from_prompt("café au lait");
        let span = |message, start, end| TextSpan {
            message,
            start,
            end,
        };
        assert!(check_spans(&snapshot, &[span(0, 0, 5), span(0, 6, 13)]).is_ok());
        let err = check_spans(&snapshot, &[span(0, 0, 4)]).unwrap_err();
        assert!(
            err.contains("span 0 (0..4) is not a range of character boundaries"),
            "{err}"
        );
        let err = check_spans(&snapshot, &[span(0, 0, 2), span(0, 6, 14)]).unwrap_err();
        assert!(
            err.contains("span 1 (6..14)") && err.contains("13 bytes"),
            "{err}"
        );
        let err = check_spans(&snapshot, &[span(1, 0, 1)]).unwrap_err();
        assert!(
            err.contains("message 1, but the conversation has 1 messages"),
            "{err}"
        );
    }
}
