//! A loaded ONNX decoder: its session, signature and text front end, and the runs that prompt,
//! decode and score through it. Each sequence carries its own [`Past`]; a prompt starts from
//! the longest cached prefix, runs in chunks, and stores its all-but-last-token state, as
//! candle's engine does, so both backends reuse the same positions.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use lmhost_plugin_api::{
    ConversationSnapshot, GenerationConfig, GenerationRecord, PluginError, ScoreRecord,
};
use lmhost_plugin_kit::hf::HfText;
use lmhost_plugin_kit::prefix_cache::{PrefixStore, Segment};
use lmhost_plugin_kit::text::{logprob_of, Scoring, TextFrontEnd};
use ort::session::{Session, SessionInputValue};
use ort::value::{Tensor, TensorRef};
use serde_json::Value;

use crate::options::Settings;
use crate::past::{Layer, Past};
use crate::runtime;
use crate::signature::Signature;

/// Positions per forward pass: bounds the logits (positions × vocabulary f32) a pass returns.
const CHUNK: usize = 256;

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

impl Engine {
    pub fn load(model_id: &str, settings: &Settings) -> Result<Engine, PluginError> {
        let at = |e: String| PluginError::unavailable(format!("model {model_id}: {e}"));
        let files = Files::find(Path::new(model_id)).map_err(at)?;
        let config_text = std::fs::read_to_string(&files.config)
            .map_err(|e| at(format!("{}: {e}", files.config.display())))?;
        let config: Value = serde_json::from_str(&config_text)
            .map_err(|e| at(format!("{}: {e}", files.config.display())))?;
        let text = HfText::read(&files.tokenizer, files.tokenizer_config.as_deref(), &config)
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
            text.tokenizer,
            text.chat_template,
            settings.chat_template.as_deref(),
            text.eos_ids,
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
    fn pass(&self, ids: &[u32], past: &Past, from: usize) -> Result<(Rows, Past), PluginError> {
        let s = &self.signature;
        let (n, p) = (ids.len(), past.len);
        let total = p + n;
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::new();
        let mut add = |name: String, value: SessionInputValue<'static>| {
            inputs.push((Cow::Owned(name), value));
        };
        let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        add("input_ids".into(), tensor([1, n], ids)?);
        add(
            "attention_mask".into(),
            tensor([1, total], vec![1i64; total])?,
        );
        if s.position_ids {
            let positions = (p as i64..total as i64).collect();
            add("position_ids".into(), tensor([1, n], positions)?);
        }
        if s.use_cache_branch {
            add("use_cache_branch".into(), tensor([1], vec![p > 0])?);
        }
        let shape = [1, s.kv_heads, p, s.head_dim];
        for (layer, held) in past.layers.iter().enumerate() {
            for (kind, data) in [("key", &held.keys), ("value", &held.values)] {
                let view =
                    TensorRef::from_array_view((shape, data.as_slice())).map_err(internal)?;
                inputs.push((
                    Cow::Owned(format!("past_key_values.{layer}.{kind}")),
                    view.into(),
                ));
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
        let rows = logits[from * vocab..n * vocab]
            .chunks(vocab)
            .map(<[f32]>::to_vec)
            .collect();
        let present = |name: String| -> Result<Vec<f32>, PluginError> {
            let (_, data) = outputs[name.as_str()]
                .try_extract_tensor::<f32>()
                .map_err(internal)?;
            if data.len() != s.kv_heads * total * s.head_dim {
                return Err(internal(format!(
                    "`{name}` holds {} values, expected {}",
                    data.len(),
                    s.kv_heads * total * s.head_dim
                )));
            }
            Ok(data.to_vec())
        };
        let layers = (0..s.layers)
            .map(|n| {
                Ok(Layer {
                    keys: present(format!("present.{n}.key"))?,
                    values: present(format!("present.{n}.value"))?,
                })
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        Ok((
            rows,
            Past {
                len: total,
                layers: std::sync::Arc::new(layers),
                ..*past
            },
        ))
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
        if let Some(store) = store.as_deref_mut() {
            let head = prompt_len - 1;
            if let Some(state) = past.prefix(head).filter(|_| head > 0) {
                store.store(&tokens[..head], state);
            }
        }
        Ok((rows, past, at))
    }

    pub fn generate(
        &self,
        snapshot: &ConversationSnapshot,
        config: &GenerationConfig,
        mut store: Option<&mut dyn PrefixStore<Past>>,
    ) -> Result<GenerationRecord, PluginError> {
        let prompt = self.front.prompt_ids(snapshot, 0)?;
        let (mut rows, mut past, reused) = self.prompt(&prompt, prompt.len(), &mut store)?;
        let row = rows.pop().unwrap_or_default();
        let sampled = self.front.sample(config, prompt.len(), row, |next| {
            let (mut rows, next_past) = self.pass(&[next], &past, 0)?;
            past = next_past;
            rows.pop().ok_or_else(|| internal("no logits"))
        })?;
        Ok(GenerationRecord {
            text: sampled.text.into(),
            token_ids: sampled.ids.into(),
            logprobs: sampled.logprobs.into(),
            embedding: None.into(),
            contextual_embedding: None.into(),
            prompt_tokens: prompt.len() as u32,
            cached_prompt_tokens: reused as u32,
            finish_reason: sampled.finish,
        })
    }

    /// Teacher-forced log-probabilities of `reply` after each prompt, one prompt at a time,
    /// each from its longest cached prefix.
    pub fn score_batch(
        &self,
        snapshots: &[ConversationSnapshot],
        reply: &str,
        mut store: Option<&mut dyn PrefixStore<Past>>,
    ) -> Result<Vec<ScoreRecord>, PluginError> {
        let items = self.front.scoring_items(snapshots, reply)?;
        items
            .into_iter()
            .map(
                |Scoring {
                     prompt,
                     reply: scored,
                 }| {
                    let prompt_len = prompt.len();
                    let (logprobs, reused) = if scored.is_empty() {
                        (Vec::new(), 0)
                    } else {
                        let mut tokens = prompt;
                        tokens.extend_from_slice(&scored[..scored.len() - 1]);
                        let (rows, _, reused) = self.prompt(&tokens, prompt_len, &mut store)?;
                        let logprobs = rows
                            .iter()
                            .zip(&scored)
                            .map(|(row, &id)| logprob_of(row, id))
                            .collect();
                        (logprobs, reused)
                    };
                    Ok(ScoreRecord {
                        token_ids: scored.into(),
                        logprobs: logprobs.into(),
                        prompt_tokens: prompt_len as u32,
                        cached_prompt_tokens: reused as u32,
                    })
                },
            )
            .collect()
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
