//! Value functions: what a coalition's prompt is worth, measured through a [`Model`]. Each
//! declares the backend capability it needs, so a run is refused before any work.

use std::collections::{HashMap, HashSet};

use lmhost_plugin_api::{Capabilities, ConversationSnapshot, GenerationRecord, ScoreRecord};

use super::error::ExplainError;
use super::settings::ValueKind;

/// What value functions ask of a language model; the host implements it over a backend.
pub trait Model {
    fn capabilities(&self) -> Capabilities;
    /// The reply to `prompt`, with embeddings when `embeddings` is set.
    fn generate(
        &self,
        prompt: &ConversationSnapshot,
        embeddings: bool,
    ) -> Result<GenerationRecord, String>;
    /// [`Model::generate`] of each prompt, in order (a backend may decode them together).
    fn generate_batch(
        &self,
        prompts: &[ConversationSnapshot],
        embeddings: bool,
    ) -> Result<Vec<GenerationRecord>, String> {
        prompts
            .iter()
            .map(|p| self.generate(p, embeddings))
            .collect()
    }
    /// The teacher-forced logprobs of `reply` after `prompt`.
    fn score(&self, prompt: &ConversationSnapshot, reply: &str) -> Result<ScoreRecord, String>;
    /// [`Model::score`] of each prompt, in order (a backend may run them in one pass).
    fn score_batch(
        &self,
        prompts: &[ConversationSnapshot],
        reply: &str,
    ) -> Result<Vec<ScoreRecord>, String> {
        prompts.iter().map(|p| self.score(p, reply)).collect()
    }
}

/// A coalition's value and what computing it cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub value: f64,
    /// The value's part from each answer token, for the logprob values: each token's logprob
    /// (the value is their sum, or with `value_mean` their mean). Empty for values not made of
    /// tokens.
    pub tokens: Vec<f64>,
    pub prompt_tokens: u64,
    /// Prompt tokens the backend took from its prefix cache.
    pub cached_prompt_tokens: u64,
}

/// A backend capability a value function needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `score`: teacher-forced logprobs of a given reply.
    Score,
    /// Logprobs of generated tokens.
    Logprobs,
    /// Contextual embeddings of replies.
    Embeddings,
    /// Plain generation.
    Generation,
}

impl Need {
    pub fn of(kind: ValueKind) -> Need {
        match kind {
            ValueKind::AnswerLogprob => Need::Score,
            ValueKind::GeneratedLogprob => Need::Logprobs,
            ValueKind::EmbeddingCosine => Need::Embeddings,
            ValueKind::TfidfCosine => Need::Generation,
        }
    }

    /// Refuses a backend without the capability, naming the value and a value that would work.
    pub fn check(self, kind: ValueKind, caps: &Capabilities) -> Result<(), ExplainError> {
        let (ok, needs) = match self {
            Need::Score => (
                caps.scores_continuations,
                "scores continuations (`score`); try `value = \"generated_logprob\"` or \
                 \"tfidf_cosine\"",
            ),
            Need::Logprobs => (
                caps.returns_logprobs,
                "returns logprobs; try `value = \"tfidf_cosine\"`",
            ),
            Need::Embeddings => (
                caps.embeddings,
                "returns embeddings; try `value = \"tfidf_cosine\"`",
            ),
            Need::Generation => (true, ""),
        };
        if ok {
            Ok(())
        } else {
            Err(ExplainError::Capability {
                value: kind.to_string(),
                needs: needs.into(),
            })
        }
    }
}

/// The answer being explained.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseAnswer {
    pub text: String,
    /// Its contextual embedding, when the backend gave one.
    pub contextual_embedding: Option<Vec<f32>>,
}

/// The value of one coalition's prompt.
pub trait ValueFunction {
    fn kind(&self) -> ValueKind;
    fn evaluate(
        &self,
        model: &dyn Model,
        prompt: &ConversationSnapshot,
    ) -> Result<Evaluation, ExplainError>;
    /// [`ValueFunction::evaluate`] of each prompt, in order; batched where the value allows.
    fn evaluate_batch(
        &self,
        model: &dyn Model,
        prompts: &[ConversationSnapshot],
    ) -> Result<Vec<Evaluation>, ExplainError> {
        prompts.iter().map(|p| self.evaluate(model, p)).collect()
    }
}

/// The value function `kind` explaining `base` in `conversation`.
pub fn build(
    kind: ValueKind,
    mean: bool,
    base: &BaseAnswer,
    conversation: &ConversationSnapshot,
) -> Result<Box<dyn ValueFunction + Send + Sync>, ExplainError> {
    Ok(match kind {
        ValueKind::AnswerLogprob => {
            if base.text.trim().is_empty() {
                return Err(ExplainError::Model {
                    what: "the base answer".into(),
                    message: "it is empty, so there is nothing to score; give --reply TEXT or \
                              raise [generation] max_new_tokens"
                        .into(),
                });
            }
            Box::new(AnswerLogprob {
                reply: base.text.clone(),
                mean,
            })
        }
        ValueKind::GeneratedLogprob => Box::new(FromReplies(GeneratedLogprob { mean })),
        ValueKind::EmbeddingCosine => {
            let Some(embedding) = base.contextual_embedding.clone() else {
                return Err(ExplainError::Model {
                    what: "the base answer".into(),
                    message: "it has no contextual embedding (the backend returned none, or \
                              --reply was given); embedding_cosine needs one"
                        .into(),
                });
            };
            Box::new(FromReplies(EmbeddingCosine { base: embedding }))
        }
        ValueKind::TfidfCosine => Box::new(FromReplies(TfidfCosine::new(&base.text, conversation))),
    })
}

fn model_error(message: String) -> ExplainError {
    ExplainError::Model {
        what: "a coalition".into(),
        message,
    }
}

/// Per-token logprobs as an [`Evaluation`]'s token parts.
fn widened(logprobs: &[f32]) -> Vec<f64> {
    logprobs.iter().map(|&l| f64::from(l)).collect()
}

fn sum_or_mean(logprobs: &[f32], mean: bool) -> f64 {
    let sum: f64 = logprobs.iter().map(|&l| f64::from(l)).sum();
    if mean && !logprobs.is_empty() {
        sum / logprobs.len() as f64
    } else {
        sum
    }
}

/// log p(base answer | prompt), through `score`.
struct AnswerLogprob {
    reply: String,
    mean: bool,
}

impl ValueFunction for AnswerLogprob {
    fn kind(&self) -> ValueKind {
        ValueKind::AnswerLogprob
    }

    fn evaluate(
        &self,
        model: &dyn Model,
        prompt: &ConversationSnapshot,
    ) -> Result<Evaluation, ExplainError> {
        let record = model.score(prompt, &self.reply).map_err(model_error)?;
        self.of(&record)
    }

    fn evaluate_batch(
        &self,
        model: &dyn Model,
        prompts: &[ConversationSnapshot],
    ) -> Result<Vec<Evaluation>, ExplainError> {
        let records = model
            .score_batch(prompts, &self.reply)
            .map_err(model_error)?;
        records.iter().map(|r| self.of(r)).collect()
    }
}

impl AnswerLogprob {
    /// The record's value; a non-empty reply scored with no tokens is an error, never a 0.
    fn of(&self, record: &ScoreRecord) -> Result<Evaluation, ExplainError> {
        if record.logprobs.is_empty() && !self.reply.is_empty() {
            return Err(model_error(format!(
                "the backend scored the reply {:?} with no tokens; an empty score is not a value",
                self.reply
            )));
        }
        Ok(Evaluation {
            value: sum_or_mean(&record.logprobs, self.mean),
            tokens: widened(&record.logprobs),
            prompt_tokens: record.prompt_tokens.into(),
            cached_prompt_tokens: record.cached_prompt_tokens.into(),
        })
    }
}

/// A value read off the reply each coalition's prompt generates.
trait ReplyValue {
    fn kind(&self) -> ValueKind;
    /// Whether replies are generated with their embeddings.
    fn embeddings(&self) -> bool {
        false
    }
    /// The value of a coalition whose prompt generated `record`.
    fn of(&self, record: &GenerationRecord) -> Result<f64, ExplainError>;
    /// Its parts by reply token (see [`Evaluation::tokens`]); none unless the value is a sum.
    fn tokens(&self, _record: &GenerationRecord) -> Vec<f64> {
        Vec::new()
    }
}

/// A [`ReplyValue`] as a value function: batches generate together
/// ([`Model::generate_batch`]).
struct FromReplies<V>(V);

impl<V: ReplyValue> FromReplies<V> {
    fn evaluation(&self, record: &GenerationRecord) -> Result<Evaluation, ExplainError> {
        Ok(Evaluation {
            value: self.0.of(record)?,
            tokens: self.0.tokens(record),
            prompt_tokens: record.prompt_tokens.into(),
            cached_prompt_tokens: record.cached_prompt_tokens.into(),
        })
    }
}

impl<V: ReplyValue> ValueFunction for FromReplies<V> {
    fn kind(&self) -> ValueKind {
        self.0.kind()
    }

    fn evaluate(
        &self,
        model: &dyn Model,
        prompt: &ConversationSnapshot,
    ) -> Result<Evaluation, ExplainError> {
        let record = model
            .generate(prompt, self.0.embeddings())
            .map_err(model_error)?;
        self.evaluation(&record)
    }

    fn evaluate_batch(
        &self,
        model: &dyn Model,
        prompts: &[ConversationSnapshot],
    ) -> Result<Vec<Evaluation>, ExplainError> {
        let records = model
            .generate_batch(prompts, self.0.embeddings())
            .map_err(model_error)?;
        records.iter().map(|r| self.evaluation(r)).collect()
    }
}

/// The logprob of the reply the coalition's prompt itself generates.
struct GeneratedLogprob {
    mean: bool,
}

impl ReplyValue for GeneratedLogprob {
    fn kind(&self) -> ValueKind {
        ValueKind::GeneratedLogprob
    }

    fn of(&self, record: &GenerationRecord) -> Result<f64, ExplainError> {
        Ok(sum_or_mean(&record.logprobs, self.mean))
    }

    /// By position: the coalition's reply is its own, so its `t`-th token's logprob goes
    /// where the explained answer's `t`-th token stands.
    fn tokens(&self, record: &GenerationRecord) -> Vec<f64> {
        widened(&record.logprobs)
    }
}

/// Cosine between the contextual embeddings of the coalition's reply and the base reply.
struct EmbeddingCosine {
    base: Vec<f32>,
}

impl ReplyValue for EmbeddingCosine {
    fn kind(&self) -> ValueKind {
        ValueKind::EmbeddingCosine
    }

    fn embeddings(&self) -> bool {
        true
    }

    fn of(&self, record: &GenerationRecord) -> Result<f64, ExplainError> {
        let Some(embedding) = record.contextual_embedding.as_ref().into_option() else {
            return Err(model_error(
                "the backend returned no contextual embedding for the reply".into(),
            ));
        };
        if embedding.len() != self.base.len() {
            return Err(model_error(format!(
                "embedding has {} dimensions, the base answer's has {}",
                embedding.len(),
                self.base.len()
            )));
        }
        Ok(cosine(embedding, &self.base))
    }
}

/// Cosine similarity; 0 when either vector is zero.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// TF-IDF cosine between the coalition's reply and the base reply. Document frequencies come
/// from the conversation's messages and the base reply, so a coalition's value depends on its
/// prompt alone (and can be stored and resumed).
struct TfidfCosine {
    idf: HashMap<String, f64>,
    base: HashMap<String, f64>,
}

impl TfidfCosine {
    fn new(base: &str, conversation: &ConversationSnapshot) -> Self {
        let mut documents: Vec<String> =
            conversation.messages().map(|m| m.text_content()).collect();
        documents.push(base.to_string());
        let mut df: HashMap<String, usize> = HashMap::new();
        for doc in &documents {
            for term in terms(doc).into_iter().collect::<HashSet<_>>() {
                *df.entry(term).or_default() += 1;
            }
        }
        let n = documents.len() as f64;
        let idf = df
            .into_iter()
            .map(|(t, d)| (t, ((1.0 + n) / (1.0 + d as f64)).ln() + 1.0))
            .collect();
        let mut this = TfidfCosine {
            idf,
            base: HashMap::new(),
        };
        this.base = this.vector(base);
        this
    }

    fn vector(&self, text: &str) -> HashMap<String, f64> {
        let n = self.idf.len() as f64;
        // Terms unseen in the conversation get the largest idf.
        let unseen = ((1.0 + n) / 1.0).ln() + 1.0;
        let mut v: HashMap<String, f64> = HashMap::new();
        for term in terms(text) {
            *v.entry(term).or_default() += 1.0;
        }
        for (term, weight) in v.iter_mut() {
            *weight *= self.idf.get(term).copied().unwrap_or(unseen);
        }
        v
    }
}

fn terms(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
        .collect()
}

impl ReplyValue for TfidfCosine {
    fn kind(&self) -> ValueKind {
        ValueKind::TfidfCosine
    }

    fn of(&self, record: &GenerationRecord) -> Result<f64, ExplainError> {
        let v = self.vector(&record.text);
        let dot: f64 = v
            .iter()
            .map(|(t, x)| x * self.base.get(t).unwrap_or(&0.0))
            .sum();
        let norm = |m: &HashMap<String, f64>| m.values().map(|x| x * x).sum::<f64>().sqrt();
        let (na, nb) = (norm(&v), norm(&self.base));
        Ok(if na == 0.0 || nb == 0.0 {
            0.0
        } else {
            dot / (na * nb)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmhost_plugin_api::abi_stable::std_types::{ROption, RVec};
    use lmhost_plugin_api::FinishReason;

    /// Replies with the prompt's last message; scores a reply by its length.
    struct Echo;

    impl Model for Echo {
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }

        fn generate(
            &self,
            prompt: &ConversationSnapshot,
            _: bool,
        ) -> Result<GenerationRecord, String> {
            let text = prompt
                .messages()
                .last()
                .map(|m| m.text_content())
                .unwrap_or_default();
            Ok(GenerationRecord {
                text: text.as_str().into(),
                token_ids: RVec::new(),
                logprobs: RVec::from(vec![-1.0, -3.0]),
                embedding: ROption::RNone,
                contextual_embedding: ROption::RSome(RVec::from(vec![1.0, 0.0])),
                prompt_tokens: 5,
                cached_prompt_tokens: 2,
                finish_reason: FinishReason::Eos,
            })
        }

        fn score(&self, _: &ConversationSnapshot, reply: &str) -> Result<ScoreRecord, String> {
            Ok(ScoreRecord {
                token_ids: RVec::new(),
                logprobs: reply.split_whitespace().map(|_| -0.5).collect(),
                prompt_tokens: 4,
                cached_prompt_tokens: 1,
            })
        }
    }

    fn base(text: &str) -> BaseAnswer {
        BaseAnswer {
            text: text.into(),
            contextual_embedding: Some(vec![1.0, 1.0]),
        }
    }

    #[test]
    fn each_value_function_measures_what_it_says() {
        let prompt = ConversationSnapshot::from_prompt("red apples are red");
        let eval = |kind, mean, answer: &str| {
            build(kind, mean, &base(answer), &prompt)
                .unwrap()
                .evaluate(&Echo, &prompt)
                .unwrap()
        };
        let e = eval(ValueKind::AnswerLogprob, false, "a b c d");
        assert_eq!(
            (e.value, e.prompt_tokens, e.cached_prompt_tokens),
            (-2.0, 4, 1)
        );
        assert_eq!(e.tokens, [-0.5; 4]);
        assert_eq!(
            eval(ValueKind::GeneratedLogprob, true, "x").tokens,
            [-1.0, -3.0]
        );
        assert!(eval(ValueKind::TfidfCosine, false, "x").tokens.is_empty());
        assert_eq!(eval(ValueKind::AnswerLogprob, true, "a b c d").value, -0.5);
        assert_eq!(eval(ValueKind::GeneratedLogprob, false, "x").value, -4.0);
        assert_eq!(eval(ValueKind::GeneratedLogprob, true, "x").value, -2.0);
        let c = eval(ValueKind::EmbeddingCosine, false, "x").value;
        assert!((c - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert!(
            (eval(ValueKind::TfidfCosine, false, "Red apples are red").value - 1.0).abs() < 1e-12
        );
        assert_eq!(eval(ValueKind::TfidfCosine, false, "bananas").value, 0.0);
    }

    /// Echo, but only in batches: one-at-a-time generation fails.
    struct BatchOnly(std::sync::Mutex<Vec<bool>>);

    impl Model for BatchOnly {
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }

        fn generate(&self, _: &ConversationSnapshot, _: bool) -> Result<GenerationRecord, String> {
            Err("one at a time".into())
        }

        fn generate_batch(
            &self,
            prompts: &[ConversationSnapshot],
            embeddings: bool,
        ) -> Result<Vec<GenerationRecord>, String> {
            self.0.lock().unwrap().push(embeddings);
            prompts
                .iter()
                .map(|p| Echo.generate(p, embeddings))
                .collect()
        }

        fn score(&self, _: &ConversationSnapshot, _: &str) -> Result<ScoreRecord, String> {
            Err("no scores".into())
        }
    }

    #[test]
    fn generation_values_evaluate_a_batch_in_one_generate_batch_call() {
        let prompts = ["bananas", "Red apples are red"].map(ConversationSnapshot::from_prompt);
        let model = BatchOnly(Default::default());
        for kind in [
            ValueKind::GeneratedLogprob,
            ValueKind::EmbeddingCosine,
            ValueKind::TfidfCosine,
        ] {
            let value = build(kind, false, &base("Red apples are red"), &prompts[1]).unwrap();
            let one = value.evaluate_batch(&model, &prompts).unwrap();
            let expected = prompts.iter().map(|p| value.evaluate(&Echo, p).unwrap());
            assert_eq!(one, expected.collect::<Vec<_>>(), "{kind}");
        }
        let asked = model.0.lock().unwrap().clone();
        assert_eq!(
            asked,
            [false, true, false],
            "embeddings only for embedding_cosine"
        );
    }

    #[test]
    fn a_reply_scored_with_no_tokens_is_an_error_not_zero() {
        let value = AnswerLogprob {
            reply: "Paris".into(),
            mean: false,
        };
        let empty = ScoreRecord {
            token_ids: RVec::new(),
            logprobs: RVec::new(),
            prompt_tokens: 4,
            cached_prompt_tokens: 0,
        };
        let err = value.of(&empty).unwrap_err().to_string();
        assert!(err.contains("no tokens"), "{err}");
    }

    #[test]
    fn missing_capabilities_are_refused_by_name() {
        let none = Capabilities::default();
        let err = Need::of(ValueKind::AnswerLogprob)
            .check(ValueKind::AnswerLogprob, &none)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("answer_logprob") && err.contains("score"),
            "{err}"
        );
        assert!(Need::of(ValueKind::TfidfCosine)
            .check(ValueKind::TfidfCosine, &none)
            .is_ok());
    }
}
