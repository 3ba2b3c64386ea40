//! Log-mel spectrograms as Whisper's feature extractor computes them.
//!
//! The Slaney-style filterbank is computed here (as librosa's `filters.mel(htk=False,
//! norm="slaney")` and Whisper's shipped `mel_filters.npz` do) instead of being shipped as data.
//! The spectrogram follows `whisper/audio.py::log_mel_spectrogram` and Hugging Face's
//! `WhisperFeatureExtractor`: a centred STFT (reflect padding of `n_fft / 2`) with a periodic Hann
//! window, power spectrum, mel projection, `log10` clamped at 1e-10, the last frame dropped,
//! values floored at `max - 8` and mapped by `(x + 4) / 4`. Arithmetic is f64 so the features
//! match a direct DFT to well under 1e-4.

use realfft::RealFftPlanner;

/// Hz to mel on the Slaney scale: linear below 1 kHz, logarithmic above.
fn hz_to_mel(hz: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let log_step = 6.4f64.ln() / 27.0;
    if hz >= MIN_LOG_HZ {
        min_log_mel + (hz / MIN_LOG_HZ).ln() / log_step
    } else {
        hz / F_SP
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let log_step = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        MIN_LOG_HZ * (log_step * (mel - min_log_mel)).exp()
    } else {
        mel * F_SP
    }
}

/// The mel filterbank, `n_mels` rows of `n_fft / 2 + 1` weights (row-major), from 0 Hz to
/// Nyquist, each triangle normalised to unit area in Hz (Slaney normalisation).
pub fn mel_filters(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f32> {
    let n_freqs = n_fft / 2 + 1;
    let nyquist = f64::from(sample_rate) / 2.0;
    let fft_freqs: Vec<f64> = (0..n_freqs)
        .map(|i| i as f64 * nyquist / (n_freqs - 1) as f64)
        .collect();
    let (mel_min, mel_max) = (hz_to_mel(0.0), hz_to_mel(nyquist));
    let mel_points: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(mel_min + (mel_max - mel_min) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut weights = vec![0f32; n_mels * n_freqs];
    for m in 0..n_mels {
        let (left, centre, right) = (mel_points[m], mel_points[m + 1], mel_points[m + 2]);
        let norm = 2.0 / (right - left);
        for (k, &f) in fft_freqs.iter().enumerate() {
            let rising = (f - left) / (centre - left);
            let falling = (right - f) / (right - centre);
            let w = rising.min(falling).max(0.0);
            weights[m * n_freqs + k] = (w * norm) as f32;
        }
    }
    weights
}

/// A periodic Hann window of `n` points (as `torch.hann_window(n)`).
pub fn hann_window(n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos())
        .collect()
}

/// `samples` extended by `pad` reflected samples at both ends (numpy's `mode="reflect"`: the
/// edge sample is not repeated). Shorter signals are zero-extended first.
fn reflect_pad(samples: &[f32], pad: usize) -> Vec<f64> {
    let mut base: Vec<f64> = samples.iter().map(|&s| f64::from(s)).collect();
    if base.len() <= pad {
        base.resize(pad + 1, 0.0);
    }
    let n = base.len();
    let mut out = Vec::with_capacity(n + 2 * pad);
    out.extend((1..=pad).rev().map(|i| base[i]));
    out.extend_from_slice(&base);
    out.extend((0..pad).map(|i| base[n - 2 - i]));
    out
}

/// Log-mel features of `samples`: `n_mels` rows of `samples.len() / hop` frames (row-major).
pub fn log_mel_spectrogram(
    samples: &[f32],
    filters: &[f32],
    n_fft: usize,
    hop: usize,
    n_mels: usize,
) -> Vec<f32> {
    let n_freqs = n_fft / 2 + 1;
    let padded = reflect_pad(samples, n_fft / 2);
    // A centred STFT has len / hop + 1 frames; Whisper drops the last one.
    let n_frames = samples.len() / hop;
    let window = hann_window(n_fft);
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let bands = filter_bands(filters, n_freqs, n_mels);
    let mut mel = vec![0f64; n_mels * n_frames];
    let mut power = vec![0f64; n_freqs];
    for frame in 0..n_frames {
        let start = frame * hop;
        for (i, x) in input.iter_mut().enumerate() {
            *x = padded.get(start + i).copied().unwrap_or(0.0) * window[i];
        }
        // Lengths are the planner's own, so this cannot fail.
        if fft
            .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
            .is_err()
        {
            continue;
        }
        for (p, c) in power.iter_mut().zip(&spectrum) {
            *p = c.norm_sqr();
        }
        for (m, &(lo, hi)) in bands.iter().enumerate() {
            let row = &filters[m * n_freqs..(m + 1) * n_freqs];
            let energy: f64 = (lo..hi).map(|k| f64::from(row[k]) * power[k]).sum();
            mel[m * n_frames + frame] = energy.max(1e-10).log10();
        }
    }
    let max = mel.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    mel.iter()
        .map(|&v| ((v.max(max - 8.0) + 4.0) / 4.0) as f32)
        .collect()
}

/// The range of non-zero weights of each filter, so the projection skips the zeros.
fn filter_bands(filters: &[f32], n_freqs: usize, n_mels: usize) -> Vec<(usize, usize)> {
    (0..n_mels)
        .map(|m| {
            let row = &filters[m * n_freqs..(m + 1) * n_freqs];
            let lo = row.iter().position(|&w| w != 0.0).unwrap_or(0);
            let hi = row.iter().rposition(|&w| w != 0.0).map_or(0, |i| i + 1);
            (lo, hi.max(lo))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_scale_is_linear_below_1khz_and_continuous_at_it() {
        assert!((hz_to_mel(500.0) - 7.5).abs() < 1e-12);
        assert!((hz_to_mel(1000.0) - 15.0).abs() < 1e-12);
        for hz in [0.0, 300.0, 999.0, 1000.0, 4321.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-9, "{hz}");
        }
    }

    #[test]
    fn reflect_padding_mirrors_without_repeating_the_edge() {
        let padded = reflect_pad(&[1.0, 2.0, 3.0, 4.0], 2);
        assert_eq!(padded, vec![3.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 2.0]);
    }
}
