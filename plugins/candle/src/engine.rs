//! Prompting, prefill, decoding and scoring over a loaded model.
//!
//! Prompt processing is shaped for a prefix cache: look up the longest cached prefix, run the
//! uncovered prompt tokens and what follows them (a scored reply) in one pass, store the
//! all-but-last-token prompt state, then continue (decode, or read the reply's logprobs). So
//! every prompt token is computed once, and a stored state never includes a position whose
//! logits a later call needs.
//!
//! Scoring takes prompts in batches: their rows share one packed forward pass (the weights are
//! read once per pass, the dominant cost of a small batch on CPU), and a prompt may take its
//! prefix from an earlier prompt of the same pass, so batching loses no cache reuse.
//!
//! Results do not depend on how a prompt was split: attention computes each row alone over its
//! keys wherever they lie (`sdpa`, [`crate::attention::fused`]; eager and chunked pad their keys,
//! [`crate::attention::KEY_ALIGN`]) and every pass has at least [`MIN_ROWS`] rows, so with f32
//! weights a prompt's logprobs come out bit-identical with the cache on or off, alone or batched.

use std::ops::Range;

use candle_core::Tensor;
use lmhost_plugin_api::{
    ConversationSnapshot, GenerationConfig, GenerationRecord, PluginError, ScoreRecord, TokenDelta,
};
use lmhost_plugin_kit::prefix_cache::{common_prefix, PrefixStore};
use lmhost_plugin_kit::text::{logprob_of, Hiding, TextFrontEnd};

use crate::attention::Hidden;
use crate::kv::KvState;
use crate::models::{mean_rows, CausalLm, Forward, Logits, Seq};
use crate::source::LoadedLm;
use crate::weights;

/// Rows per forward pass of one long sequence (bounds activation memory); a sequence longer
/// than this runs alone, in chunks.
const PREFILL_CHUNK: usize = 512;

/// Tokens (before prefix reuse) that one packed pass of several sequences may hold.
const PASS_TOKENS: usize = 2048;

/// Fewest rows per prompt pass. Below this, GEMM takes kernels for skinny matrices that round
/// differently, so a short pass is padded with throwaway copies of its last token (after it:
/// they cannot influence it) whose state and logits are dropped.
pub const MIN_ROWS: usize = 8;

/// A token sequence to run: a prompt, then what follows it (a reply being scored).
struct Sequence {
    tokens: Vec<u32>,
    prompt_len: usize,
    /// The reply ids whose logprobs are read (all but the last are in `tokens`); empty when
    /// generating.
    scored: Vec<u32>,
    /// Prompt positions hidden from the rows at and after a position (`score_hidden`).
    hide: Option<Hide>,
}

/// Positions `keys` are hidden from the rows at `from..`; the positions before `from` are the
/// prompt's own, seeing everything, so they may come from the cache or be stored there.
struct Hide {
    from: usize,
    keys: Vec<Range<usize>>,
}

/// Where a [`Sequence`] begins: its state, an earlier item of its group whose first positions it
/// takes, and the position of its first computed token.
struct Resume {
    kv: KvState,
    share: Option<(usize, usize)>,
    at: usize,
}

/// A generation's prompt, run: its state, the positions reused, the last row's logits.
pub struct Prefilled {
    prompt_len: usize,
    kv: KvState,
    reused: usize,
    row: Vec<f32>,
}

/// What running a [`Sequence`] leaves: its state over all its tokens, the prompt positions it
/// reused, and the logits of rows `prompt_len - 1..`.
struct Computed {
    kv: KvState,
    reused: usize,
    logits: Tensor,
}

/// A loaded model behind its text front end.
pub struct Engine {
    pub model: Box<dyn CausalLm>,
    pub front: TextFrontEnd,
    /// Generations' prompts run through the decode copies ([`weights::stored_prompts`]).
    stored_prompts: bool,
}

/// A prefix store as prompts run through the decode copies see it: their states under keys of
/// their own (each token id with its top bit set, which no vocabulary reaches), so a score
/// never starts from a state computed with other weights, and such a prompt starts only from
/// its own kind's (its result never depends on what ran before it). One budget for both kinds.
struct DecodeCopyStore<'a>(&'a mut dyn PrefixStore<KvState>);

impl DecodeCopyStore<'_> {
    fn keys(tokens: &[u32]) -> Vec<u32> {
        tokens.iter().map(|t| t | 1 << 31).collect()
    }
}

impl PrefixStore<KvState> for DecodeCopyStore<'_> {
    fn lookup(&mut self, tokens: &[u32], shared: usize) -> Option<(KvState, usize)> {
        self.0.lookup(&DecodeCopyStore::keys(tokens), shared)
    }

    fn store(&mut self, tokens: &[u32], state: KvState) {
        self.0.store(&DecodeCopyStore::keys(tokens), state)
    }

    fn peek(&self, tokens: &[u32]) -> usize {
        self.0.peek(&DecodeCopyStore::keys(tokens))
    }
}

fn internal(e: candle_core::Error) -> PluginError {
    PluginError::internal(format!("candle: {e}"))
}

fn rows(t: &Tensor) -> Result<Vec<Vec<f32>>, PluginError> {
    t.to_vec2::<f32>().map_err(internal)
}

impl Engine {
    /// `chat_template` is the backend option (a file, or `"plain"`), which overrides the model's.
    pub fn new(
        loaded: LoadedLm,
        max_context: usize,
        chat_template: Option<&str>,
        model_id: &str,
    ) -> Result<Self, PluginError> {
        let LoadedLm {
            model,
            text,
            stored_prompts,
            vision,
        } = loaded;
        let mut front = TextFrontEnd::new(
            text,
            chat_template,
            (max_context, model.max_context()),
            model_id,
        )?;
        if let Some(vision) = vision {
            front = front.with_vision(vision);
        }
        Ok(Engine {
            model,
            front,
            stored_prompts,
        })
    }

    /// Runs `f` as a generation's prompt runs: through the decode copies where
    /// [`weights::stored_prompts`] chose them.
    pub fn prompting<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.stored_prompts {
            true => weights::generating(f),
            false => f(),
        }
    }

    fn forward(
        &self,
        ids: &[u32],
        kv: &mut KvState,
        logits: Logits,
    ) -> Result<Forward, PluginError> {
        self.model.forward(ids, kv, logits, false).map_err(internal)
    }

    /// Runs `items` in packed passes, reusing cached prefixes (and, within a pass, prefixes of
    /// earlier items) when `store` is on, and storing each prompt's all-but-last state. Hands
    /// each item's result to `each` as soon as its group is done, so a large batch holds only
    /// one group's states and logits at a time.
    fn run(
        &self,
        items: &[Sequence],
        mut store: Option<&mut dyn PrefixStore<KvState>>,
        mut each: impl FnMut(&Sequence, Computed) -> Result<(), PluginError>,
    ) -> Result<(), PluginError> {
        // Rows an item computes, counting the positions hidden keys let it take from the cache
        // (which `score_hidden` filled first).
        let cached = store.is_some();
        let size = |item: &Sequence| match &item.hide {
            Some(_) if cached => item.tokens.len() - item.cacheable(),
            _ => item.tokens.len(),
        };
        let mut first = 0;
        while first < items.len() {
            let mut end = first + 1;
            let mut tokens = size(&items[first]);
            while tokens <= PREFILL_CHUNK
                && end < items.len()
                && size(&items[end]) <= PREFILL_CHUNK
                && tokens + size(&items[end]) <= PASS_TOKENS
            {
                tokens += size(&items[end]);
                end += 1;
            }
            let group = &items[first..end];
            for (item, ran) in group
                .iter()
                .zip(self.run_group(group, store.as_deref_mut())?)
            {
                each(item, ran)?;
            }
            first = end;
        }
        Ok(())
    }

    /// One group: a single item of any length (in chunks), or several short ones in one pass.
    fn run_group(
        &self,
        items: &[Sequence],
        mut store: Option<&mut (dyn PrefixStore<KvState> + '_)>,
    ) -> Result<Vec<Computed>, PluginError> {
        let starts = self.starts(items, store.as_deref_mut());
        let reused: Vec<usize> = starts.iter().map(|s| s.at).collect();
        let (kvs, logits) = self.passes(items, starts)?;
        let mut ran = Vec::with_capacity(items.len());
        for ((item, kv), (reused, logits)) in
            items.iter().zip(kvs).zip(reused.into_iter().zip(logits))
        {
            if let Some(store) = store.as_deref_mut() {
                let head = item.cacheable();
                if head > 0 {
                    let mut state = kv.clone();
                    state.crop(head).map_err(internal)?;
                    store.store(&item.tokens[..head], state);
                }
            }
            let logits = Tensor::cat(&logits, 0).map_err(internal)?;
            ran.push(Computed { kv, reused, logits });
        }
        Ok(ran)
    }

    /// Where each item begins: the longer of its cached prefix and the prefix it shares with an
    /// earlier item of the group (only with a store: cache off means nothing is reused).
    fn starts(
        &self,
        items: &[Sequence],
        mut store: Option<&mut (dyn PrefixStore<KvState> + '_)>,
    ) -> Vec<Resume> {
        let model = &self.model;
        (0..items.len())
            .map(|j| {
                let Some(store) = store.as_deref_mut() else {
                    return Resume {
                        kv: model.new_state(),
                        share: None,
                        at: 0,
                    };
                };
                // Items hiding keys take their prefix from the cache only: an earlier item of
                // the pass may compute it in chunks, which a share cannot follow.
                let earlier = best_share(items, j).filter(|_| items[j].hide.is_none());
                let shared = earlier.map_or(0, |(_, n)| n);
                let prompt = &items[j].tokens[..items[j].cacheable() + 1];
                match store.lookup(prompt, shared) {
                    // A scored item's state is dropped after its pass: it holds only the rows
                    // it adds, and attention reads the cached prefix where the cache keeps it.
                    Some((kv, cached)) if !items[j].scored.is_empty() => Resume {
                        kv: KvState::after(kv),
                        share: None,
                        at: cached,
                    },
                    Some((kv, cached)) => Resume {
                        kv,
                        share: None,
                        at: cached,
                    },
                    None => Resume {
                        kv: model.new_state(),
                        share: earlier,
                        at: shared,
                    },
                }
            })
            .collect()
    }

    /// Runs every item from its start to its end: one packed pass for a group of short items,
    /// chunks for a lone long one. Returns each item's state (cropped to its tokens) and its
    /// logits, from row `prompt_len - 1` on, in pieces.
    fn passes(
        &self,
        items: &[Sequence],
        starts: Vec<Resume>,
    ) -> Result<(Vec<KvState>, Vec<Vec<Tensor>>), PluginError> {
        let mut pos: Vec<usize> = starts.iter().map(|s| s.at).collect();
        let shares: Vec<_> = starts.iter().map(|s| s.share).collect();
        let mut kvs: Vec<KvState> = starts.into_iter().map(|s| s.kv).collect();
        let mut logits: Vec<Vec<Tensor>> = vec![Vec::new(); items.len()];
        let mut first_pass = true;
        loop {
            let unfinished = |j: usize| pos[j] < items[j].tokens.len();
            let active: Vec<usize> = (0..items.len()).filter(|&j| unfinished(j)).collect();
            if active.is_empty() {
                return Ok((kvs, logits));
            }
            let rows: Vec<usize> = active
                .iter()
                .map(|&j| (items[j].tokens.len() - pos[j]).min(PREFILL_CHUNK))
                .collect();
            let padded: Vec<Vec<u32>> = active
                .iter()
                .zip(&rows)
                .map(|(&j, &n)| self.padded(&items[j].tokens[pos[j]..pos[j] + n], pos[j]))
                .collect();
            // Shares index the group, so they hold in the first pass, where every item runs.
            let mut seqs: Vec<Seq<'_>> = kvs
                .iter_mut()
                .enumerate()
                .filter(|&(j, _)| unfinished(j))
                .zip(&padded)
                .map(|((j, kv), ids)| Seq {
                    ids,
                    share: shares[j].filter(|_| first_pass),
                    logits_from: (items[j].prompt_len - 1).saturating_sub(pos[j]),
                    kv,
                    hidden: items[j].hide.as_ref().map(|h| Hidden {
                        from: h.from,
                        keys: &h.keys,
                    }),
                    sampled: items[j].scored.is_empty(),
                })
                .collect();
            let (out, _) = self
                .model
                .forward_packed(&mut seqs, false)
                .map_err(internal)?;
            drop(seqs);
            first_pass = false;
            for ((&j, &n), rows) in active.iter().zip(&rows).zip(out) {
                let first_logit = (items[j].prompt_len - 1).max(pos[j]);
                pos[j] += n;
                // Drops the padding rows.
                kvs[j].crop(pos[j]).map_err(internal)?;
                if let Some(rows) = rows {
                    let wanted = pos[j].saturating_sub(first_logit);
                    logits[j].push(rows.narrow(0, 0, wanted).map_err(internal)?);
                }
            }
        }
    }

    /// `ids` (to run from position `start`) padded to [`MIN_ROWS`] with copies of its last
    /// token, as far as the context allows.
    fn padded(&self, ids: &[u32], start: usize) -> Vec<u32> {
        let room = self.model.max_context().saturating_sub(start);
        let rows = ids.len().max(MIN_ROWS.min(room));
        let mut padded = ids.to_vec();
        padded.resize(rows, ids.last().copied().unwrap_or_default());
        padded
    }

    /// Logits of every position of `ids` from an empty state: the reference the tests use.
    pub fn logits_all(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>, PluginError> {
        let mut kv = self.model.new_state();
        let out = self.forward(ids, &mut kv, Logits::All)?;
        rows(
            &out.logits
                .ok_or_else(|| PluginError::internal("no logits"))?,
        )
    }

    /// Generates a reply, handing each token to `sink` as it comes (its `false` stops): the
    /// prompt, then one decode step at a time on this thread.
    pub fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        store: Option<&mut dyn PrefixStore<KvState>>,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        let started = self.start(snapshot, store)?;
        let mut record = self.finish(started, config, sink, &mut |token, mut kv| {
            let row = self.decode_step(token, &mut kv)?;
            Ok((kv, row))
        })?;
        if config.compute_embeddings {
            self.add_embeddings(&mut record)?;
        }
        Ok(record)
    }

    /// Runs a generation's prompt, from its longest cached prefix when `store` is on.
    pub fn start(
        &self,
        snapshot: &ConversationSnapshot,
        store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<Prefilled, PluginError> {
        self.start_batch(std::slice::from_ref(snapshot), store)?
            .pop()
            .ok_or_else(|| PluginError::internal("no prompt state"))
    }

    /// Runs generations' prompts in packed passes (as scoring does), each from its longest
    /// cached prefix or an earlier prompt's of the same pass; one [`Prefilled`] per snapshot.
    pub fn start_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<Vec<Prefilled>, PluginError> {
        let items = snapshots
            .iter()
            .map(|snapshot| {
                let prompt = self.front.prompt_ids(snapshot, 0)?;
                Ok(Sequence {
                    prompt_len: prompt.len(),
                    tokens: prompt,
                    scored: Vec::new(),
                    hide: None,
                })
            })
            .collect::<Result<Vec<Sequence>, PluginError>>()?;
        self.prompting(|| match store {
            Some(store) if self.stored_prompts => {
                self.started(&items, Some(&mut DecodeCopyStore(store)))
            }
            store => self.started(&items, store),
        })
    }

    /// Runs generations' prompts (see [`Engine::start_batch`]).
    fn started(
        &self,
        items: &[Sequence],
        store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<Vec<Prefilled>, PluginError> {
        let mut started = Vec::with_capacity(items.len());
        self.run(items, store, |item, Computed { kv, reused, logits }| {
            started.push(Prefilled {
                prompt_len: item.prompt_len,
                kv,
                reused,
                row: rows(&logits)?.pop().unwrap_or_default(),
            });
            Ok(())
        })?;
        Ok(started)
    }

    /// Samples the reply after a started prompt; `step(token, kv)` runs one decode step (alone,
    /// or packed with other generations' by [`crate::batch::Batcher`]). No embeddings.
    pub fn finish(
        &self,
        started: Prefilled,
        config: &GenerationConfig,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
        step: &mut dyn FnMut(u32, KvState) -> Result<(KvState, Vec<f32>), PluginError>,
    ) -> Result<GenerationRecord, PluginError> {
        let Prefilled {
            prompt_len,
            kv,
            reused,
            row,
        } = started;
        let mut kv = Some(kv.with_room_for(config.max_new_tokens as usize));
        let sampled = self.front.sample(
            config,
            prompt_len,
            row,
            |next| {
                let held = kv
                    .take()
                    .ok_or_else(|| PluginError::internal("no decode state"))?;
                let (grown, row) = step(next, held)?;
                kv = Some(grown);
                Ok(row)
            },
            sink,
        )?;
        Ok(sampled.record(prompt_len, reused))
    }

    /// One decode step on its own: `token` after `kv`, the next token's logits.
    fn decode_step(&self, token: u32, kv: &mut KvState) -> Result<Vec<f32>, PluginError> {
        let out = weights::generating(|| self.forward(&[token], kv, Logits::Last))?;
        let logits = out
            .logits
            .ok_or_else(|| PluginError::internal("no logits"))?;
        Ok(rows(&logits)?.pop().unwrap_or_default())
    }

    /// Fills in `record`'s static and contextual embeddings of its reply.
    pub fn add_embeddings(&self, record: &mut GenerationRecord) -> Result<(), PluginError> {
        let (e, c) = self.embeddings(&record.token_ids)?;
        record.embedding = Some(e.into()).into();
        record.contextual_embedding = Some(c.into()).into();
        Ok(())
    }

    /// Static (mean input embedding) and contextual (mean final hidden state of the ids run on
    /// their own) embeddings of `ids`.
    pub fn embeddings(&self, ids: &[u32]) -> Result<(Vec<f32>, Vec<f32>), PluginError> {
        if ids.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let model = &self.model;
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

    /// `text`'s embedding: the mean of the model's final (normalized) hidden states over the
    /// text's tokens (BOS as the tokenizer adds it), and how many tokens that was.
    pub fn embed(&self, text: &str) -> Result<(Vec<f32>, usize), PluginError> {
        let ids = self.front.encode(text, true)?;
        if ids.is_empty() {
            return Err(PluginError::invalid_input(
                "the text to embed is empty (0 tokens)",
            ));
        }
        if ids.len() > self.front.max_context() {
            return Err(PluginError::invalid_input(format!(
                "the text to embed has {} tokens, more than the context of {} tokens",
                ids.len(),
                self.front.max_context()
            )));
        }
        let mut kv = self.model.new_state();
        let out = self
            .model
            .forward(&ids, &mut kv, Logits::None, true)
            .map_err(internal)?;
        let hidden = out
            .hidden
            .ok_or_else(|| PluginError::internal("no hidden states"))?;
        Ok((mean_rows(&hidden).map_err(internal)?, ids.len()))
    }

    /// Teacher-forced log-probabilities of `reply` after each prompt, the prompts batched into
    /// packed passes. A prompt that cannot be scored (too long) fails the call, naming it.
    pub fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
        store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let items: Vec<Sequence> = self
            .front
            .scoring_items(snapshots, reply)?
            .into_iter()
            .map(|s| Sequence::scoring(s.prompt, s.reply))
            .collect();
        self.scored(&items, store)
    }

    /// Runs scoring `items` and reads each one's logprobs of its reply.
    fn scored(
        &self,
        items: &[Sequence],
        store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        if items.iter().all(|item| item.scored.is_empty()) {
            // Nothing to score: no pass, no cache traffic.
            return Ok(items.iter().map(|item| record(item, &[], 0)).collect());
        }
        let mut records = Vec::with_capacity(items.len());
        self.run(items, store, |item, ran| {
            let logprobs: Vec<f32> = rows(&ran.logits)?
                .iter()
                .zip(&item.scored)
                .map(|(row, &id)| logprob_of(row, id))
                .collect();
            records.push(record(item, &logprobs, ran.reused));
            Ok(())
        })?;
        Ok(records)
    }

    /// Teacher-forced log-probabilities of `reply` after `snapshot`, once per entry of
    /// `hiding.hidden`, with the spans and image boxes it lists hidden from messages
    /// `hiding.from_message..` and the reply (the plugin API's `score_hidden`). The prompt before that message runs once (or comes
    /// from the cache), so each entry computes only the rows from there on; with the cache off
    /// each computes all of them.
    pub fn score_hidden(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        hiding: &Hiding<'_>,
        mut store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let plan = self.front.hidden_scoring(snapshot, reply, hiding)?;
        let items: Vec<Sequence> = plan
            .hidden
            .into_iter()
            .map(|keys| Sequence {
                hide: Some(Hide {
                    from: plan.from,
                    keys,
                }),
                ..Sequence::scoring(plan.prompt.clone(), plan.reply.clone())
            })
            .collect();
        let prefix = plan.from > 0 && !plan.reply.is_empty();
        if let (Some(store), true) = (store.as_deref_mut(), prefix) {
            let shared = Sequence {
                tokens: plan.prompt[..=plan.from].to_vec(),
                prompt_len: plan.from + 1,
                scored: Vec::new(),
                hide: None,
            };
            self.run(std::slice::from_ref(&shared), Some(store), |_, _| Ok(()))?;
        }
        self.scored(&items, store)
    }

    /// [`Engine::score_batch`] of one prompt.
    pub fn score(
        &self,
        snapshot: &ConversationSnapshot,
        reply: &str,
        store: Option<&mut dyn PrefixStore<KvState>>,
    ) -> Result<ScoreRecord, PluginError> {
        self.score_batch(std::slice::from_ref(snapshot), reply, store)?
            .pop()
            .ok_or_else(|| PluginError::internal("no score record"))
    }
}

impl Sequence {
    /// A prompt followed by the reply `scored`, all of whose ids but the last are run.
    fn scoring(mut tokens: Vec<u32>, scored: Vec<u32>) -> Sequence {
        let prompt_len = tokens.len();
        tokens.extend_from_slice(&scored[..scored.len().saturating_sub(1)]);
        Sequence {
            tokens,
            prompt_len,
            scored,
            hide: None,
        }
    }

    /// How many prompt positions the cache may give or take: all but the last, and with
    /// hidden keys none of the rows that do not see them.
    fn cacheable(&self) -> usize {
        let head = self.prompt_len - 1;
        self.hide.as_ref().map_or(head, |h| h.from.min(head))
    }
}

fn record(item: &Sequence, logprobs: &[f32], reused: usize) -> ScoreRecord {
    ScoreRecord {
        token_ids: item.scored.clone().into(),
        logprobs: logprobs.to_vec().into(),
        prompt_tokens: item.prompt_len as u32,
        cached_prompt_tokens: reused as u32,
    }
}

/// The earlier item sharing the longest token prefix with item `j`, and how many of its
/// positions `j` can take (all but `j`'s last prompt token, at most).
fn best_share(items: &[Sequence], j: usize) -> Option<(usize, usize)> {
    let item = &items[j];
    (0..j)
        .filter(|&i| items[i].hide.is_none())
        .map(|i| {
            let n = common_prefix(&items[i].tokens, &item.tokens).min(item.prompt_len - 1);
            (i, n)
        })
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
}
