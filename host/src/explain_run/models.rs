//! A backend seen as the explain crate's [`Model`]: each coalition's prompt scored or generated
//! as is, or (`absence = "hide"`) the whole conversation with the absent players hidden.

use lmhost_plugin_api::{
    Capabilities, ConversationSnapshot, GenerationConfig, GenerationRecord, ScoreRecord,
};

use std::collections::HashMap;

use super::store::prompt_key;
use crate::backend::Backend;
use crate::explain::{HiddenParts, Model};

/// A backend seen as the explain crate's [`Model`].
pub(super) struct BackendModel<'a> {
    pub(super) backend: &'a Backend,
    pub(super) generation: &'a GenerationConfig,
}

impl Model for BackendModel<'_> {
    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    fn generate(
        &self,
        prompt: &ConversationSnapshot,
        embeddings: bool,
    ) -> std::result::Result<GenerationRecord, String> {
        self.backend
            .generate(prompt, &self.config(embeddings))
            .map_err(|e| e.to_string())
    }

    fn generate_batch(
        &self,
        prompts: &[ConversationSnapshot],
        embeddings: bool,
    ) -> std::result::Result<Vec<GenerationRecord>, String> {
        self.backend
            .generate_batch(prompts, &self.config(embeddings))
            .map_err(|e| e.to_string())
    }

    fn score(
        &self,
        prompt: &ConversationSnapshot,
        reply: &str,
    ) -> std::result::Result<ScoreRecord, String> {
        self.backend.score(prompt, reply).map_err(|e| e.to_string())
    }

    fn score_batch(
        &self,
        prompts: &[ConversationSnapshot],
        reply: &str,
    ) -> std::result::Result<Vec<ScoreRecord>, String> {
        self.backend
            .score_batch(prompts, reply)
            .map_err(|e| e.to_string())
    }
}

/// A backend seen as a [`Model`] that scores a coalition's prompt (its `Delete` rendering,
/// found by key) as the whole conversation with the coalition's absent players hidden from
/// the last message and the answer (`absence = "hide"`, the backend's `score_hidden`): the
/// messages before the last are computed once for every coalition of every level.
pub(super) struct HidingModel<'a> {
    pub(super) backend: &'a Backend,
    pub(super) conversation: &'a ConversationSnapshot,
    pub(super) parts: HiddenParts,
    /// The absent players of each prompt, by prompt key.
    pub(super) absent: HashMap<String, Vec<u32>>,
}

impl Model for HidingModel<'_> {
    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    fn generate(
        &self,
        _: &ConversationSnapshot,
        _: bool,
    ) -> std::result::Result<GenerationRecord, String> {
        Err("absence = \"hide\" scores a given answer; it cannot generate".into())
    }

    fn score(
        &self,
        prompt: &ConversationSnapshot,
        reply: &str,
    ) -> std::result::Result<ScoreRecord, String> {
        self.score_batch(std::slice::from_ref(prompt), reply)?
            .pop()
            .ok_or_else(|| "score_hidden returned no record".into())
    }

    fn score_batch(
        &self,
        prompts: &[ConversationSnapshot],
        reply: &str,
    ) -> std::result::Result<Vec<ScoreRecord>, String> {
        let hidden = prompts
            .iter()
            .map(|p| {
                let absent = self
                    .absent
                    .get(&prompt_key(p))
                    .ok_or_else(|| "a prompt that is no coalition of this level".to_string())?;
                Ok(self.parts.entry(absent))
            })
            .collect::<std::result::Result<Vec<Vec<u32>>, String>>()?;
        let last = self.conversation.messages().count().saturating_sub(1) as u32;
        self.backend
            .score_hidden(self.conversation, reply, (&self.parts.parts, &hidden), last)
            .map_err(|e| e.to_string())
    }
}

impl BackendModel<'_> {
    /// The run's generation settings, asking for embeddings when `embeddings` is set.
    fn config(&self, embeddings: bool) -> GenerationConfig {
        let mut config = self.generation.clone();
        config.compute_embeddings |= embeddings;
        config
    }
}
