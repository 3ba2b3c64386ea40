//! Prompting, prefill, decoding and scoring over a loaded model.
//!
//! Prompt processing is shaped for a prefix cache: look up the longest cached prefix, run only
//! the uncovered prompt tokens except the last, store that all-but-last state, then continue
//! with the last prompt token (decode, or score a reply). So every prompt token is computed
//! once, and a stored state never includes a position whose logits a later call needs.

use candle_core::Tensor;
use lmhost_plugin_api::{
    ConversationSnapshot, FinishReason, GenerationConfig, GenerationRecord, PluginError,
    ScoreRecord,
};

use crate::kv::KvState;
use crate::models::{mean_rows, Forward, Logits};
use crate::prompt::{self, ChatTemplate};
use crate::sampling::{log_softmax, Rng, Sampler};
use crate::source::Loaded;

/// Prompt tokens per forward pass while prefilling (bounds activation memory).
const PREFILL_CHUNK: usize = 512;

/// Where prefix states are kept between calls (the prefix cache implements this).
pub trait PrefixStore: Send {
    /// The longest stored prefix of `tokens` (at most `tokens.len() - 1`), cropped to it.
    fn lookup(&mut self, tokens: &[u32]) -> Option<(KvState, usize)>;
    fn store(&mut self, tokens: &[u32], state: KvState);
}

/// A loaded model with its prompt format.
pub struct Engine {
    pub loaded: Loaded,
    template: Option<ChatTemplate>,
    max_context: usize,
}

fn internal(e: candle_core::Error) -> PluginError {
    PluginError::internal(format!("candle: {e}"))
}

fn rows(t: &Tensor) -> Result<Vec<Vec<f32>>, PluginError> {
    t.to_vec2::<f32>().map_err(internal)
}

/// log p(id) from a row of raw logits (-inf for an id outside the model's vocabulary).
fn logprob_of(row: &[f32], id: u32) -> f32 {
    log_softmax(row)
        .get(id as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY)
}

impl Engine {
    pub fn new(loaded: Loaded, max_context: usize) -> Result<Self, PluginError> {
        let template = loaded
            .chat_template
            .as_deref()
            .map(ChatTemplate::new)
            .transpose()
            .map_err(PluginError::unavailable)?;
        let model_max = loaded.model.max_context();
        let max_context = if max_context == 0 {
            model_max
        } else {
            max_context.min(model_max)
        };
        Ok(Engine {
            loaded,
            template,
            max_context,
        })
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// The rendered prompt text for a conversation.
    pub fn prompt_text(&self, snapshot: &ConversationSnapshot) -> Result<String, PluginError> {
        let messages = prompt::messages(snapshot)?;
        match &self.template {
            Some(t) => t.render(
                &messages,
                self.loaded.bos_token.as_deref(),
                self.loaded.eos_token.as_deref(),
            ),
            None => Ok(prompt::fallback(&messages)),
        }
    }

    /// Tokens of `text`; special-token strings in it (chat markers) become their ids.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, PluginError> {
        self.loaded
            .tokenizer
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PluginError::internal(format!("tokenizer: {e}")))
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.loaded
            .tokenizer
            .decode(ids, true)
            .map_err(|e| PluginError::internal(format!("tokenizer: {e}")))
    }

    /// The prompt's tokens, checked to be non-empty and to leave room for `extra` tokens.
    pub fn prompt_ids(
        &self,
        snapshot: &ConversationSnapshot,
        extra: usize,
    ) -> Result<Vec<u32>, PluginError> {
        let text = self.prompt_text(snapshot)?;
        // A template writes its own BOS; the fallback relies on the tokenizer's.
        let ids = self.encode(&text, self.template.is_none())?;
        if ids.is_empty() {
            return Err(PluginError::invalid_input("the prompt is empty (0 tokens)"));
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

    fn forward(
        &self,
        ids: &[u32],
        kv: &mut KvState,
        logits: Logits,
    ) -> Result<Forward, PluginError> {
        self.loaded
            .model
            .forward(ids, kv, logits, false)
            .map_err(internal)
    }

    /// Fills a state with all prompt tokens but the last; returns it and how many came cached.
    pub fn prefill(
        &self,
        prompt: &[u32],
        mut store: Option<&mut dyn PrefixStore>,
    ) -> Result<(KvState, usize), PluginError> {
        let head = &prompt[..prompt.len() - 1];
        let (mut kv, cached) = store
            .as_deref_mut()
            .and_then(|s| s.lookup(prompt))
            .unwrap_or_else(|| (self.loaded.model.new_state(), 0));
        for chunk in head[cached.min(head.len())..].chunks(PREFILL_CHUNK) {
            self.forward(chunk, &mut kv, Logits::None)?;
        }
        if let Some(s) = store {
            if !head.is_empty() {
                s.store(head, kv.clone());
            }
        }
        Ok((kv, cached))
    }

    /// Logits of every position of `ids` from an empty state: the reference the tests use.
    pub fn logits_all(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>, PluginError> {
        let mut kv = self.loaded.model.new_state();
        let out = self.forward(ids, &mut kv, Logits::All)?;
        rows(
            &out.logits
                .ok_or_else(|| PluginError::internal("no logits"))?,
        )
    }

    pub fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        store: Option<&mut dyn PrefixStore>,
    ) -> Result<GenerationRecord, PluginError> {
        let prompt = self.prompt_ids(snapshot, 0)?;
        let (mut kv, cached) = self.prefill(&prompt, store)?;
        let sampler = Sampler {
            temperature: config.temperature,
            top_k: config.top_k as usize,
            top_p: config.top_p,
        };
        let mut rng = Rng::new(config.seed);
        let mut next = prompt[prompt.len() - 1];
        let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
        let mut text = String::new();
        let mut finish = FinishReason::Length;
        while ids.len() < config.max_new_tokens as usize && kv.len() < self.max_context {
            let out = self.forward(&[next], &mut kv, Logits::Last)?;
            let logits = out
                .logits
                .ok_or_else(|| PluginError::internal("no logits"))?;
            let row = rows(&logits)?.pop().unwrap_or_default();
            next = sampler.pick(&row, &mut rng);
            logprobs.push(logprob_of(&row, next));
            ids.push(next);
            if self.loaded.eos_ids.contains(&next) {
                finish = FinishReason::Eos;
                break;
            }
            text = self.decode(&ids)?;
            if let Some(cut) = config
                .stop
                .iter()
                .filter_map(|s| text.find(s.as_str()))
                .min()
            {
                text.truncate(cut);
                finish = FinishReason::StopString;
                break;
            }
        }
        if finish == FinishReason::Eos {
            text = self.decode(&ids)?;
        }
        let (embedding, contextual) = if config.compute_embeddings {
            let (e, c) = self.embeddings(&ids)?;
            (Some(e.into()), Some(c.into()))
        } else {
            (None, None)
        };
        Ok(GenerationRecord {
            text: text.into(),
            token_ids: ids.into(),
            logprobs: logprobs.into(),
            embedding: embedding.into(),
            contextual_embedding: contextual.into(),
            prompt_tokens: prompt.len() as u32,
            cached_prompt_tokens: cached as u32,
            finish_reason: finish,
        })
    }

    /// Static (mean input embedding) and contextual (mean final hidden state of the ids run on
    /// their own) embeddings of `ids`.
    pub fn embeddings(&self, ids: &[u32]) -> Result<(Vec<f32>, Vec<f32>), PluginError> {
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let model = &self.loaded.model;
        let stat = mean_rows(&model.embed(ids).map_err(internal)?).map_err(internal)?;
        let mut kv = model.new_state();
        let out = model
            .forward(ids, &mut kv, Logits::None, true)
            .map_err(internal)?;
        let hidden = out
            .hidden
            .ok_or_else(|| PluginError::internal("no hidden states"))?;
        Ok((stat, mean_rows(&hidden).map_err(internal)?))
    }

    /// Teacher-forced log-probabilities of `reply` after the prompt, in one pass over the reply.
    pub fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        store: Option<&mut dyn PrefixStore>,
    ) -> Result<ScoreRecord, PluginError> {
        let reply_ids = self.encode(reply, false)?;
        let prompt = self.prompt_ids(snapshot, reply_ids.len())?;
        let (mut kv, cached) = self.prefill(&prompt, store)?;
        let mut input = vec![prompt[prompt.len() - 1]];
        input.extend_from_slice(&reply_ids[..reply_ids.len().saturating_sub(1)]);
        let logprobs = if reply_ids.is_empty() {
            Vec::new()
        } else {
            let out = self.forward(&input, &mut kv, Logits::All)?;
            let logits = out
                .logits
                .ok_or_else(|| PluginError::internal("no logits"))?;
            rows(&logits)?
                .iter()
                .zip(&reply_ids)
                .map(|(row, &id)| logprob_of(row, id))
                .collect()
        };
        Ok(ScoreRecord {
            token_ids: reply_ids.into(),
            logprobs: logprobs.into(),
            prompt_tokens: prompt.len() as u32,
            cached_prompt_tokens: cached as u32,
        })
    }
}
