//! A loaded ONNX decoder: its session, signature and text front end, and the runs that prompt,
//! decode and score through it. Each sequence carries its own [`Past`]; a prompt starts from
//! the longest cached prefix, runs in chunks, and stores its all-but-last-token state, as
//! candle's engine does, so both backends reuse the same positions.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lmhost_plugin_api::{
    ConversationSnapshot, GenerationConfig, GenerationRecord, PluginError, ScoreRecord, TokenDelta,
};
use lmhost_plugin_kit::prefix_cache::{common_prefix, PrefixStore, Segment};
use lmhost_plugin_kit::text::{logprob_of, ModelText, Scoring, TextFrontEnd};
use ort::session::{Session, SessionInputValue};
use ort::value::{Tensor, TensorRef};
use serde_json::Value;

use crate::options::Settings;
use crate::past::{Layer, Past};
use crate::runtime;
use crate::signature::Signature;

/// Rows per forward pass (padded, over the batch): bounds the logits (rows × vocabulary f32)
/// a pass returns.
const CHUNK: usize = 256;

/// Most sequences in one batched pass.
const MAX_LANES: usize = 8;

/// Most padded past + new positions over a batch: bounds the KV copies a batched pass makes.
const BATCH_POSITIONS: usize = 4096;

/// A model directory in Optimum's layout.
struct Files {
    model: PathBuf,
    config: PathBuf,
    tokenizer: PathBuf,
    tokenizer_config: Option<PathBuf>,
}

impl Files {
    /// `path` is the export's directory or its `.onnx` file.
    fn find(path: &Path) -> Result<Files, String> {
        let expected = "expected an ONNX export directory (Optimum's layout: model.onnx, \
                        config.json, tokenizer.json, tokenizer_config.json)";
        let (dir, model) = if path.is_dir() {
            (path.to_path_buf(), path.join("model.onnx"))
        } else if path.is_file() {
            let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (dir, path.to_path_buf())
        } else {
            return Err(format!("{} does not exist: {expected}", path.display()));
        };
        let need = |p: PathBuf| {
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!("{} is missing: {expected}", p.display()))
            }
        };
        let tokenizer_config = dir.join("tokenizer_config.json");
        Ok(Files {
            model: need(model)?,
            config: need(dir.join("config.json"))?,
            tokenizer: need(dir.join("tokenizer.json"))?,
            tokenizer_config: tokenizer_config.is_file().then_some(tokenizer_config),
        })
    }
}

pub struct Engine {
    /// `Session::run` takes `&mut`: one pass at a time, each using ONNX Runtime's own threads.
    session: Mutex<Session>,
    pub signature: Signature,
    pub front: TextFrontEnd,
}

fn internal(e: impl std::fmt::Display) -> PluginError {
    PluginError::internal(format!("onnx: {e}"))
}

/// Logits rows of a pass, from its row `from` on.
type Rows = Vec<Vec<f32>>;

/// One sequence of a batched pass: its past, the ids to run after it, and the first of their
/// rows whose logits it wants.
struct Lane<'a> {
    past: Past,
    ids: &'a [u32],
    from: usize,
}

/// Which of a layer's two past buffers.
#[derive(Clone, Copy)]
enum Buffer {
    Keys,
    Values,
}

impl Buffer {
    fn of(self, layers: &[Layer], layer: usize) -> &[f32] {
        let held = &layers[layer];
        match self {
            Buffer::Keys => &held.keys,
            Buffer::Values => &held.values,
        }
    }
}

impl Engine {
    pub fn load(model_id: &str, settings: &Settings) -> Result<Engine, PluginError> {
        let at = |e: String| PluginError::unavailable(format!("model {model_id}: {e}"));
        let files = Files::find(Path::new(model_id)).map_err(at)?;
        let config_text = std::fs::read_to_string(&files.config)
            .map_err(|e| at(format!("{}: {e}", files.config.display())))?;
        let config: Value = serde_json::from_str(&config_text)
            .map_err(|e| at(format!("{}: {e}", files.config.display())))?;
        let text = ModelText::from_hf(&files.tokenizer, files.tokenizer_config.as_deref(), &config)
            .map_err(at)?;
        let session = runtime::with_environment(settings.ort_library.as_deref(), |env| {
            settings.session(env, &files.model)
        })?;
        let signature = Signature::read(&session, &config)
            .map_err(|e| at(format!("{}: {e}", files.model.display())))?;
        let model_max = config
            .get("max_position_embeddings")
            .and_then(Value::as_u64)
            .map_or(usize::MAX, |n| n as usize);
        let front = TextFrontEnd::new(
            text,
            settings.chat_template.as_deref(),
            (settings.max_context, model_max),
            model_id,
        )?;
        Ok(Engine {
            session: Mutex::new(session),
            signature,
            front,
        })
    }

    pub fn new_state(&self) -> Past {
        let s = &self.signature;
        Past::empty(s.layers, s.kv_heads, s.head_dim)
    }

    /// Runs `ids` after `past` in one pass: the logits of rows `from..` and the state over
    /// `past` and `ids`.
    pub fn pass(&self, ids: &[u32], past: &Past, from: usize) -> Result<(Rows, Past), PluginError> {
        let lane = Lane {
            past: past.clone(),
            ids,
            from,
        };
        self.batch(&[lane])?
            .pop()
            .ok_or_else(|| internal("no output for the pass"))
    }

    /// Runs several sequences in one pass along the batch axis, each after its own past: pasts
    /// are left-padded and ids right-padded to common lengths, and the attention mask hides the
    /// padding (positions follow each sequence's own past). Per lane: the logits of rows
    /// `from..` of its ids and its state over its past and ids.
    fn batch(&self, lanes: &[Lane<'_>]) -> Result<Vec<(Rows, Past)>, PluginError> {
        let s = &self.signature;
        let b = lanes.len();
        let p = lanes.iter().map(|l| l.past.len).max().unwrap_or(0);
        let n = lanes.iter().map(|l| l.ids.len()).max().unwrap_or(0);
        let total = p + n;
        let mut ids = Vec::with_capacity(b * n);
        let mut mask = Vec::with_capacity(b * total);
        let mut positions = Vec::with_capacity(b * n);
        for lane in lanes {
            let (lp, ln) = (lane.past.len, lane.ids.len());
            let pad = lane.ids.last().copied().unwrap_or_default();
            ids.extend(
                lane.ids
                    .iter()
                    .chain(std::iter::repeat_n(&pad, n - ln))
                    .map(|&i| i64::from(i)),
            );
            mask.extend((0..total).map(|k| i64::from((p - lp..p + ln).contains(&k))));
            positions.extend((0..n).map(|i| (lp + i) as i64));
        }
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = vec![
            ("input_ids".into(), tensor([b, n], ids)?),
            ("attention_mask".into(), tensor([b, total], mask)?),
        ];
        if s.position_ids {
            inputs.push(("position_ids".into(), tensor([b, n], positions)?));
        }
        if s.use_cache_branch {
            inputs.push(("use_cache_branch".into(), tensor([1], vec![p > 0])?));
        }
        let shape = [b, s.kv_heads, p, s.head_dim];
        for layer in 0..s.layers {
            for (kind, buffer) in [("key", Buffer::Keys), ("value", Buffer::Values)] {
                let name = Cow::Owned(format!("past_key_values.{layer}.{kind}"));
                let value = match lanes {
                    // One sequence: its own buffer, no copy.
                    [lane] => {
                        let data = buffer.of(&lane.past.layers, layer);
                        TensorRef::from_array_view((shape, data))
                            .map_err(internal)?
                            .into()
                    }
                    _ => tensor(shape, self.padded_past(lanes, buffer, layer, p))?,
                };
                inputs.push((name, value));
            }
        }
        let mut session = self
            .session
            .lock()
            .map_err(|_| PluginError::internal("onnx session lock poisoned by an earlier panic"))?;
        let outputs = session.run(inputs).map_err(internal)?;
        let (shape, logits) = outputs["logits"]
            .try_extract_tensor::<f32>()
            .map_err(internal)?;
        let vocab = usize::try_from(shape[2]).map_err(internal)?;
        let expect = |name: &str, data: &[f32], len: usize| {
            if data.len() == len {
                Ok(())
            } else {
                Err(internal(format!(
                    "`{name}` holds {} values, expected {len}",
                    data.len()
                )))
            }
        };
        expect("logits", logits, b * n * vocab)?;
        let mut presents = Vec::with_capacity(2 * s.layers);
        for layer in 0..s.layers {
            for kind in ["key", "value"] {
                let name = format!("present.{layer}.{kind}");
                let (_, data) = outputs[name.as_str()]
                    .try_extract_tensor::<f32>()
                    .map_err(internal)?;
                expect(&name, data, b * s.kv_heads * total * s.head_dim)?;
                presents.push(data);
            }
        }
        let per_head = total * s.head_dim;
        Ok(lanes
            .iter()
            .enumerate()
            .map(|(i, lane)| {
                let (lp, ln) = (lane.past.len, lane.ids.len());
                let rows = (lane.from..ln)
                    .map(|r| logits[(i * n + r) * vocab..(i * n + r + 1) * vocab].to_vec())
                    .collect();
                // This lane's positions: slots p - lp .. p + ln of each of its heads.
                let own = |data: &[f32]| -> Vec<f32> {
                    (0..s.kv_heads)
                        .flat_map(|h| {
                            let start = (i * s.kv_heads + h) * per_head + (p - lp) * s.head_dim;
                            data[start..start + (lp + ln) * s.head_dim].iter().copied()
                        })
                        .collect()
                };
                let layers = presents
                    .chunks(2)
                    .map(|kv| Layer {
                        keys: own(kv[0]),
                        values: own(kv[1]),
                    })
                    .collect();
                let state = Past {
                    heads: s.kv_heads,
                    dim: s.head_dim,
                    len: lp + ln,
                    layers: Arc::new(layers),
                };
                (rows, state)
            })
            .collect())
    }

    /// One past input of a batch: each lane's positions at the end of its rows, zeros before.
    fn padded_past(&self, lanes: &[Lane<'_>], buffer: Buffer, layer: usize, p: usize) -> Vec<f32> {
        let (heads, dim) = (self.signature.kv_heads, self.signature.head_dim);
        let mut out = vec![0.0; lanes.len() * heads * p * dim];
        for (i, lane) in lanes.iter().enumerate() {
            let lp = lane.past.len;
            if lp == 0 {
                continue;
            }
            let data = buffer.of(&lane.past.layers, layer);
            for h in 0..heads {
                let to = ((i * heads + h) * p + (p - lp)) * dim;
                out[to..to + lp * dim].copy_from_slice(&data[h * lp * dim..(h + 1) * lp * dim]);
            }
        }
        out
    }

    /// Runs `ids` after `past` in chunks of [`CHUNK`]: the logits of rows `from..` of `ids`.
    fn run(&self, ids: &[u32], mut past: Past, from: usize) -> Result<(Rows, Past), PluginError> {
        let mut rows = Vec::new();
        let mut start = 0;
        while start < ids.len() {
            let end = (start + CHUNK).min(ids.len());
            let (mut chunk, next) =
                self.pass(&ids[start..end], &past, from.clamp(start, end) - start)?;
            rows.append(&mut chunk);
            past = next;
            start = end;
        }
        Ok((rows, past))
    }

    /// Logits of every position of `ids` from an empty state, in one pass: what the tests hold
    /// against other backends.
    pub fn logits_all(&self, ids: &[u32]) -> Result<Rows, PluginError> {
        Ok(self.pass(ids, &self.new_state(), 0)?.0)
    }

    /// Runs `tokens` (a prompt of `prompt_len` tokens and what follows) from the longest cached
    /// prefix of the prompt; stores the prompt's all-but-last state. Returns logits from row
    /// `prompt_len - 1`, the final state and the positions reused.
    fn prompt(
        &self,
        tokens: &[u32],
        prompt_len: usize,
        store: &mut Option<&mut dyn PrefixStore<Past>>,
    ) -> Result<(Rows, Past, usize), PluginError> {
        let (past, at) = store
            .as_deref_mut()
            .and_then(|s| s.lookup(&tokens[..prompt_len], 0))
            .unwrap_or_else(|| (self.new_state(), 0));
        let (rows, past) = self.run(&tokens[at..], past, prompt_len - 1 - at)?;
        self.store_prompt(tokens, prompt_len, &past, store);
        Ok((rows, past, at))
    }

    /// Generates a reply, handing each token to `sink` as it comes (its `false` stops).
    pub fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        mut store: Option<&mut dyn PrefixStore<Past>>,
        sink: &mut (dyn FnMut(&TokenDelta) -> bool + Send),
    ) -> Result<GenerationRecord, PluginError> {
        let prompt = self.front.prompt_ids(snapshot, 0)?;
        let (mut rows, mut past, reused) = self.prompt(&prompt, prompt.len(), &mut store)?;
        let row = rows.pop().unwrap_or_default();
        let sampled = self.front.sample(
            config,
            prompt.len(),
            row,
            |next| {
                let (mut rows, next_past) = self.pass(&[next], &past, 0)?;
                past = next_past;
                rows.pop().ok_or_else(|| internal("no logits"))
            },
            sink,
        )?;
        Ok(sampled.record(prompt.len(), reused))
    }

    /// Teacher-forced log-probabilities of `reply` after each prompt, each from its longest
    /// cached prefix. Prompts that share nothing the cache lacks run together along the batch
    /// axis (see [`Engine::group`]); a long one runs alone, in chunks.
    pub fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
        mut store: Option<&mut dyn PrefixStore<Past>>,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let items: Vec<Item> = self
            .front
            .scoring_items(snapshots, reply)?
            .into_iter()
            .map(Item::new)
            .collect();
        if items.iter().all(|item| item.scored.is_empty()) {
            return Ok(items.iter().map(|item| item.record(&[], 0)).collect());
        }
        let mut records = Vec::with_capacity(items.len());
        let mut first = 0;
        while first < items.len() {
            let end = first + self.group(&items[first..], store.as_deref());
            let group = &items[first..end];
            if let [item] = group {
                let (rows, _, reused) = self.prompt(&item.tokens, item.prompt_len, &mut store)?;
                records.push(item.record(&rows, reused));
            } else {
                let starts: Vec<(Past, usize)> = group
                    .iter()
                    .map(|item| {
                        store
                            .as_deref_mut()
                            .and_then(|s| s.lookup(&item.tokens[..item.prompt_len], 0))
                            .unwrap_or_else(|| (self.new_state(), 0))
                    })
                    .collect();
                let lanes: Vec<Lane<'_>> = group
                    .iter()
                    .zip(&starts)
                    .map(|(item, (past, at))| Lane {
                        past: past.clone(),
                        ids: &item.tokens[*at..],
                        from: item.prompt_len - 1 - at,
                    })
                    .collect();
                for ((item, (rows, state)), (_, at)) in
                    group.iter().zip(self.batch(&lanes)?).zip(&starts)
                {
                    self.store_prompt(&item.tokens, item.prompt_len, &state, &mut store);
                    records.push(item.record(&rows, *at));
                }
            }
            first = end;
        }
        Ok(records)
    }

    /// How many of `items` (at least one) to run as one batch: they stop at [`MAX_LANES`], at
    /// [`CHUNK`] padded rows or [`BATCH_POSITIONS`] padded positions, and before a prompt that
    /// shares more with one already in the batch than the cache holds for it (run after it,
    /// it reuses that prefix from the cache, as one at a time would).
    fn group(&self, items: &[Item], store: Option<&dyn PrefixStore<Past>>) -> usize {
        if !self.signature.batch {
            return 1;
        }
        let cached = |item: &Item| store.map_or(0, |s| s.peek(&item.tokens[..item.prompt_len]));
        let (mut past, mut rows) = (0, 0);
        for (j, item) in items.iter().enumerate().take(MAX_LANES) {
            let at = cached(item);
            let (p, n) = (past.max(at), rows.max(item.tokens.len() - at));
            let lanes = j + 1;
            let shares = items[..j]
                .iter()
                .map(|earlier| {
                    common_prefix(&earlier.tokens, &item.tokens).min(item.prompt_len - 1)
                })
                .max()
                .unwrap_or(0);
            let too_big = lanes * n > CHUNK || lanes * (p + n) > BATCH_POSITIONS;
            if j > 0 && (too_big || (store.is_some() && shares > at)) {
                return j;
            }
            (past, rows) = (p, n);
        }
        items.len().min(MAX_LANES)
    }

    /// Stores the all-but-last positions of a prompt of `prompt_len` tokens from `state`.
    fn store_prompt(
        &self,
        tokens: &[u32],
        prompt_len: usize,
        state: &Past,
        store: &mut Option<&mut dyn PrefixStore<Past>>,
    ) {
        let head = prompt_len - 1;
        if let Some(store) = store.as_deref_mut().filter(|_| head > 0) {
            if let Some(prefix) = state.prefix(head) {
                store.store(&tokens[..head], prefix);
            }
        }
    }
}

/// A prompt and the reply scored after it: all reply ids but the last are run.
struct Item {
    tokens: Vec<u32>,
    prompt_len: usize,
    scored: Vec<u32>,
}

impl Item {
    fn new(Scoring { prompt, reply }: Scoring) -> Item {
        let prompt_len = prompt.len();
        let mut tokens = prompt;
        tokens.extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
        Item {
            tokens,
            prompt_len,
            scored: reply,
        }
    }

    /// The record from the logits rows from the prompt's last position on.
    fn record(&self, rows: &[Vec<f32>], reused: usize) -> ScoreRecord {
        let logprobs: Vec<f32> = rows
            .iter()
            .zip(&self.scored)
            .map(|(row, &id)| logprob_of(row, id))
            .collect();
        ScoreRecord {
            token_ids: self.scored.clone().into(),
            logprobs: logprobs.into(),
            prompt_tokens: self.prompt_len as u32,
            cached_prompt_tokens: reused as u32,
        }
    }
}

/// An owned input tensor.
fn tensor<T, const R: usize>(
    shape: [usize; R],
    data: Vec<T>,
) -> Result<SessionInputValue<'static>, PluginError>
where
    T: ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static,
{
    Ok(Tensor::from_array((shape, data)).map_err(internal)?.into())
}
