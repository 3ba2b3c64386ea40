//! Transcription and scoring over encoded audio windows.
//!
//! Each 30 s window is decoded from the same prompt (`[<|startofprev|> text] <|startoftranscript|>
//! <|notimestamps|>`) and the windows' tokens are concatenated. Token choice sees the model's
//! suppressed tokens (never special tokens other than end of text; no blank or end of text first),
//! greedy or sampled (temperature, top-k, top-p, seeded); the reported logprob of each token is
//! the log-softmax of the *raw* logits, before suppression and warping, as the reference backend
//! reports them.

use candle_core::{Result, Tensor, D};
use lmhost_plugin_api::{FinishReason, GenerationConfig};
use lmhost_plugin_kit::sampling::{Rng, Sampler};
use lmhost_plugin_kit::text::logprob_of;

use super::model::{CrossKv, Whisper};
use super::SpecialTokens;
use crate::kv::KvState;

/// What decoding produced, before detokenisation.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    /// The generated ids of each window, in order (for embeddings).
    pub per_window: Vec<Vec<u32>>,
    pub finish: FinishReason,
    pub prompt_tokens: usize,
}

/// Runs the encoder on each `n_mels x frames` window and projects it for cross-attention.
pub fn encode(model: &Whisper, windows: &[Vec<f32>]) -> Result<Vec<CrossKv>> {
    let n_mels = model.config.num_mel_bins;
    windows
        .iter()
        .map(|mel| {
            let frames = mel.len() / n_mels.max(1);
            let mel = Tensor::from_slice(mel, (1, n_mels, frames), &model.decoder.device())?
                .to_dtype(model.decoder.dtype())?;
            model.decoder.cross_kv(&model.encoder.forward(&mel)?)
        })
        .collect()
}

impl Whisper {
    /// Raw logits of the last position of hidden states `(1, n, d)`.
    fn last_logits(&self, hidden: &Tensor) -> Result<Vec<f32>> {
        let n = hidden.dim(1)?;
        self.decoder
            .logits(&hidden.narrow(1, n - 1, 1)?)?
            .squeeze(0)?
            .to_vec1::<f32>()
    }

    /// Sets never-allowed tokens (and, first, the begin-suppressed ones) to `-inf`.
    fn suppress(&self, logits: &mut [f32], tokens: &SpecialTokens, first: bool) {
        let cfg = &self.config;
        let specials = (tokens.end_of_text as usize + 1)..logits.len();
        let begin = if first {
            &cfg.begin_suppress_tokens[..]
        } else {
            &[]
        };
        for i in specials
            .chain(cfg.suppress_tokens.iter().map(|&t| t as usize))
            .chain(begin.iter().map(|&t| t as usize))
        {
            if let Some(l) = logits.get_mut(i) {
                *l = f32::NEG_INFINITY;
            }
        }
        if first {
            if let Some(l) = logits.get_mut(tokens.end_of_text as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// Transcribes `windows` after the decoder prompt built from `previous`; `stop` sees the
    /// ids so far and says whether a stop string was reached.
    pub fn transcribe(
        &self,
        windows: &[CrossKv],
        tokens: &SpecialTokens,
        previous: &[u32],
        config: &GenerationConfig,
        mut stop: impl FnMut(&[u32]) -> bool,
    ) -> Result<Decoded> {
        let prompt = tokens.prompt(previous);
        let max_ctx = self.config.max_target_positions;
        let (sampler, mut rng) = (Sampler::of(config), Rng::new(config.seed));
        let mut out = Decoded {
            ids: Vec::new(),
            logprobs: Vec::new(),
            per_window: Vec::new(),
            finish: FinishReason::Eos,
            prompt_tokens: prompt.len(),
        };
        'windows: for cross in windows {
            let mut kv = KvState::new(self.decoder.n_layers());
            let mut logits = self.last_logits(&self.decoder.forward(&prompt, &mut kv, cross)?)?;
            let mut window_ids = Vec::new();
            loop {
                if out.ids.len() >= config.max_new_tokens as usize {
                    out.finish = FinishReason::Length;
                    out.per_window.push(window_ids);
                    break 'windows;
                }
                let raw = logits.clone();
                self.suppress(&mut logits, tokens, window_ids.is_empty());
                let token = sampler.pick(&logits, &mut rng);
                if token == tokens.end_of_text {
                    break;
                }
                out.ids.push(token);
                out.logprobs.push(logprob_of(&raw, token));
                window_ids.push(token);
                if stop(&out.ids) {
                    out.finish = FinishReason::StopString;
                    out.per_window.push(window_ids);
                    break 'windows;
                }
                if kv.len() + 1 >= max_ctx {
                    break; // The window's text fills the decoder's context; go on to the next.
                }
                logits = self.last_logits(&self.decoder.forward(&[token], &mut kv, cross)?)?;
            }
            out.per_window.push(window_ids);
        }
        Ok(out)
    }

    /// Teacher-forced hidden states `(1, len, d)` and raw logprobs of `ids` after the prompt,
    /// where no token attends to the prompt's tokens at positions `hidden`.
    pub fn force(
        &self,
        (cross, tokens): (&CrossKv, &SpecialTokens),
        previous: &[u32],
        ids: &[u32],
        hidden: &[usize],
    ) -> Result<(Tensor, Vec<f32>)> {
        let prompt = tokens.prompt(previous);
        let mut all = prompt.clone();
        all.extend_from_slice(ids);
        if all.len() > self.config.max_target_positions {
            candle_core::bail!(
                "prompt and reply are {} tokens; the decoder takes at most {}",
                all.len(),
                self.config.max_target_positions
            );
        }
        let mut kv = KvState::new(self.decoder.n_layers());
        let states = self.decoder.forward_hiding(&all, &mut kv, cross, hidden)?;
        let p = prompt.len();
        // Position i predicts token i + 1.
        let logits = self.decoder.logits(&states.narrow(1, p - 1, ids.len())?)?;
        let logprobs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let index = Tensor::new(ids, logprobs.device())?.unsqueeze(1)?;
        let picked = logprobs.gather(&index, 1)?.squeeze(1)?.to_vec1::<f32>()?;
        Ok((states.narrow(1, p, ids.len())?, picked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_sampling_skips_suppressed_tokens_and_respects_top_k() {
        let logits = [0.0, 5.0, f32::NEG_INFINITY, 4.9];
        let mut rng = Rng::new(7);
        let greedy = GenerationConfig::default();
        assert_eq!(Sampler::of(&greedy).pick(&logits, &mut rng), 1);
        let picks = |config: GenerationConfig, rng: &mut Rng| -> Vec<u32> {
            (0..400)
                .map(|_| Sampler::of(&config).pick(&logits, rng))
                .collect()
        };
        let all = picks(
            GenerationConfig {
                temperature: 2.0,
                ..GenerationConfig::default()
            },
            &mut rng,
        );
        assert!(!all.contains(&2), "a suppressed token was sampled");
        assert!([0, 1, 3].iter().all(|t| all.contains(t)));
        let top2 = picks(
            GenerationConfig {
                temperature: 5.0,
                top_k: 2,
                ..GenerationConfig::default()
            },
            &mut rng,
        );
        assert!(top2.iter().all(|&t| t == 1 || t == 3));
        assert!(top2.contains(&1) && top2.contains(&3));
    }
}
