//! Processors: what turns non-text inputs into model features, beside the tokenizer.
//!
//! Following the Transformers guide for inference-engine backends (`shared/seeds/README.md`,
//! point 4), a processor says which placeholder token stands for its input, how many placeholder
//! positions an input of a given length needs (only positions later replaced by features count),
//! and, on request, per-position modality ids (contiguous runs, 0 text, 3 audio).
//!
//! [`WhisperProcessor`] is the audio processor: it validates an [`Audio`] part, resamples it to
//! 16 kHz and cuts it into 30 s windows of 80-bin log-mel features.

pub mod mel;
pub mod resample;

use lmhost_plugin_api::{Audio, PluginError};

/// Modality ids per position, as `mm_token_type_ids` (0 text, 1 image, 2 video); audio is 3.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modality {
    Text = 0,
    Image = 1,
    Video = 2,
    Audio = 3,
}

/// Whisper's feature extractor: 16 kHz, n_fft 400, hop 160, 30 s windows.
#[derive(Debug, Clone)]
pub struct WhisperProcessor {
    n_mels: usize,
    filters: Vec<f32>,
    /// The longest audio accepted, in seconds.
    max_seconds: f64,
}

impl WhisperProcessor {
    pub const SAMPLE_RATE: u32 = 16_000;
    pub const N_FFT: usize = 400;
    pub const HOP: usize = 160;
    pub const WINDOW_SECONDS: usize = 30;
    /// Samples in one 30 s window.
    pub const WINDOW_SAMPLES: usize = Self::WINDOW_SECONDS * Self::SAMPLE_RATE as usize;
    /// Mel frames in one window.
    pub const WINDOW_FRAMES: usize = Self::WINDOW_SAMPLES / Self::HOP;
    /// Encoder positions per window: the second convolution has stride 2.
    pub const POSITIONS_PER_WINDOW: usize = Self::WINDOW_FRAMES / 2;
    /// The placeholder a prompt may use where the audio goes. Whisper does not splice audio into
    /// its decoder's token sequence (the decoder cross-attends to the encoder output), so the
    /// tokenizer has no such token; it exists for the uniform processor interface.
    pub const PLACEHOLDER: &'static str = "<|audio|>";

    pub fn new(n_mels: usize, max_seconds: f64) -> Self {
        WhisperProcessor {
            n_mels,
            filters: mel::mel_filters(Self::SAMPLE_RATE, Self::N_FFT, n_mels),
            max_seconds,
        }
    }

    /// The longest audio accepted, in seconds.
    pub fn max_seconds(&self) -> f64 {
        self.max_seconds
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// The mel filterbank, `n_mels` rows of `N_FFT / 2 + 1` weights.
    pub fn filters(&self) -> &[f32] {
        &self.filters
    }

    /// The placeholder token and its id in the tokenizer (`None` for Whisper: see
    /// [`Self::PLACEHOLDER`]).
    pub fn placeholder_token(&self) -> (&'static str, Option<u32>) {
        (Self::PLACEHOLDER, None)
    }

    /// How many placeholder (feature) positions audio of `samples` samples at 16 kHz needs:
    /// 1500 encoder positions per started 30 s window.
    pub fn num_placeholder_tokens(&self, samples: usize) -> usize {
        samples.div_ceil(Self::WINDOW_SAMPLES).max(1) * Self::POSITIONS_PER_WINDOW
    }

    /// Modality ids of a sequence of `audio_samples` of audio followed by `text_tokens` tokens.
    pub fn modality_ids(&self, audio_samples: usize, text_tokens: usize) -> Vec<u8> {
        let audio = if audio_samples == 0 {
            0
        } else {
            self.num_placeholder_tokens(audio_samples)
        };
        let mut ids = vec![Modality::Audio as u8; audio];
        ids.resize(audio + text_tokens, Modality::Text as u8);
        ids
    }

    /// Checks `audio` and converts it to mono f32 at 16 kHz. `what` names the part in errors.
    pub fn prepare(&self, audio: &Audio, what: &str) -> Result<Vec<f32>, PluginError> {
        if audio.sample_rate == 0 {
            return Err(PluginError::invalid_input(format!(
                "{what} has sample rate 0; expected a rate in Hz such as 16000"
            )));
        }
        if audio.samples.is_empty() {
            return Err(PluginError::invalid_input(format!(
                "{what} is empty; expected at least one sample"
            )));
        }
        if let Some(i) = audio.samples.iter().position(|s| !s.is_finite()) {
            return Err(PluginError::invalid_input(format!(
                "{what} has a non-finite sample at index {i}; expected samples in [-1, 1]"
            )));
        }
        let seconds = audio.samples.len() as f64 / f64::from(audio.sample_rate);
        if seconds > self.max_seconds {
            return Err(PluginError::invalid_input(format!(
                "{what} is {seconds:.1} s long; this model takes at most {} s of audio \
                 (option `max_audio_seconds`)",
                self.max_seconds
            )));
        }
        resample::resample(&audio.samples, audio.sample_rate, Self::SAMPLE_RATE)
            .map_err(|e| PluginError::invalid_input(format!("{what}: {e}")))
    }

    /// Log-mel features of 16 kHz `samples`, one `n_mels x 3000` block (row-major) per 30 s
    /// window; the last window is padded with silence.
    pub fn features(&self, samples: &[f32]) -> Vec<Vec<f32>> {
        let windows = samples.len().div_ceil(Self::WINDOW_SAMPLES).max(1);
        (0..windows)
            .map(|w| {
                let start = w * Self::WINDOW_SAMPLES;
                let end = (start + Self::WINDOW_SAMPLES).min(samples.len());
                let mut window = samples.get(start..end).unwrap_or_default().to_vec();
                window.resize(Self::WINDOW_SAMPLES, 0.0);
                mel::log_mel_spectrogram(
                    &window,
                    &self.filters,
                    Self::N_FFT,
                    Self::HOP,
                    self.n_mels,
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audio(samples: Vec<f32>, sample_rate: u32) -> Audio {
        Audio {
            samples: samples.into(),
            sample_rate,
        }
    }

    #[test]
    fn placeholder_counts_follow_30_second_windows() {
        let p = WhisperProcessor::new(80, 600.0);
        assert_eq!(p.placeholder_token(), ("<|audio|>", None));
        assert_eq!(p.num_placeholder_tokens(1), 1500);
        assert_eq!(p.num_placeholder_tokens(480_000), 1500);
        assert_eq!(p.num_placeholder_tokens(480_001), 3000);
        let ids = p.modality_ids(16_000, 3);
        assert_eq!(ids.len(), 1503);
        assert!(ids[..1500].iter().all(|&m| m == Modality::Audio as u8));
        assert_eq!(&ids[1500..], &[0, 0, 0]);
        assert_eq!(p.modality_ids(0, 2), vec![0, 0]);
    }

    #[test]
    fn features_are_one_block_per_window() {
        let p = WhisperProcessor::new(80, 600.0);
        let blocks = p.features(&vec![0.1; 16_000 * 31]);
        assert_eq!(blocks.len(), 2);
        assert!(blocks.iter().all(|b| b.len() == 80 * 3000));
    }

    #[test]
    fn bad_audio_is_invalid_input_naming_the_part_and_problem() {
        let p = WhisperProcessor::new(80, 10.0);
        let cases = [
            (audio(vec![], 16_000), "is empty"),
            (audio(vec![0.0], 0), "sample rate 0"),
            (
                audio(vec![0.0, f32::NAN], 16_000),
                "non-finite sample at index 1",
            ),
            (audio(vec![0.0; 16_000 * 11], 16_000), "11.0 s long"),
        ];
        for (audio, problem) in cases {
            let err = p.prepare(&audio, "message 1, audio part 2").unwrap_err();
            assert_eq!(err.kind, lmhost_plugin_api::ErrorKind::InvalidInput);
            assert!(err.message.contains("message 1, audio part 2"), "{err}");
            assert!(err.message.contains(problem), "{err}");
        }
        let ok = p.prepare(&audio(vec![0.5; 8000], 8000), "x").unwrap();
        assert_eq!(ok.len(), 16_000);
    }
}
