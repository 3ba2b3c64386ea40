//! Whisper's features against references computed here independently: the Slaney filterbank by
//! librosa's vectorised formulation, the spectrogram by a direct DFT.

use lmhost_candle::processor::mel::{log_mel_spectrogram, mel_filters};
use lmhost_candle::processor::WhisperProcessor;

const RATE: u32 = 16_000;
const N_FFT: usize = 400;
const HOP: usize = 160;
const N_MELS: usize = 80;
const N_FREQS: usize = N_FFT / 2 + 1;

/// librosa.filters.mel(sr, n_fft, n_mels, htk=False, norm="slaney"), written as librosa does:
/// mel points, `fdiff`, `ramps`, lower/upper slopes, `enorm`.
fn librosa_mel() -> Vec<f64> {
    let hz_to_mel = |f: f64| {
        let f_sp = 200.0 / 3.0;
        if f < 1000.0 {
            f / f_sp
        } else {
            1000.0 / f_sp + (f / 1000.0).ln() / (6.4f64.ln() / 27.0)
        }
    };
    let mel_to_hz = |m: f64| {
        let f_sp = 200.0 / 3.0;
        let min_log_mel = 1000.0 / f_sp;
        if m < min_log_mel {
            m * f_sp
        } else {
            1000.0 * ((6.4f64.ln() / 27.0) * (m - min_log_mel)).exp()
        }
    };
    let fmax = f64::from(RATE) / 2.0;
    let fftfreqs: Vec<f64> = (0..N_FREQS)
        .map(|i| fmax * i as f64 / (N_FREQS - 1) as f64)
        .collect();
    let top = hz_to_mel(fmax);
    let mel_f: Vec<f64> = (0..N_MELS + 2)
        .map(|i| mel_to_hz(top * i as f64 / (N_MELS + 1) as f64))
        .collect();
    let fdiff: Vec<f64> = mel_f.windows(2).map(|w| w[1] - w[0]).collect();
    let mut weights = vec![0.0; N_MELS * N_FREQS];
    for i in 0..N_MELS {
        let enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
        for (k, f) in fftfreqs.iter().enumerate() {
            let lower = -(mel_f[i] - f) / fdiff[i];
            let upper = (mel_f[i + 2] - f) / fdiff[i + 1];
            weights[i * N_FREQS + k] = 0f64.max(lower.min(upper)) * enorm;
        }
    }
    weights
}

#[test]
fn filterbank_matches_librosa_in_shape_values_and_row_sums() {
    let ours = mel_filters(RATE, N_FFT, N_MELS);
    assert_eq!(
        ours.len(),
        N_MELS * N_FREQS,
        "80 rows of 201 frequency bins"
    );
    let reference = librosa_mel();
    for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
        assert!((f64::from(*a) - b).abs() < 1e-7, "weight {i}: {a} vs {b}");
    }
    // Slaney normalisation gives each triangle unit area in Hz, so a row sums to about
    // 1 / bin width = n_fft / rate wherever the triangle spans enough bins to integrate it.
    let bin_hz = f64::from(RATE) / N_FFT as f64;
    for m in 0..N_MELS {
        let row = &ours[m * N_FREQS..(m + 1) * N_FREQS];
        let sum: f64 = row.iter().map(|&w| f64::from(w)).sum();
        assert!(sum > 0.0, "row {m} is empty");
        let nonzero = row.iter().filter(|&&w| w > 0.0).count();
        if nonzero >= 6 {
            let want = 1.0 / bin_hz;
            assert!(
                (sum - want).abs() / want < 0.05,
                "row {m}: sum {sum}, expected about {want}"
            );
        }
    }
    // Centres rise strictly: the rows are in frequency order.
    let peaks: Vec<usize> = (0..N_MELS)
        .map(|m| {
            let row = &ours[m * N_FREQS..(m + 1) * N_FREQS];
            (0..N_FREQS)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap()
        })
        .collect();
    assert!(peaks.windows(2).all(|w| w[0] <= w[1]), "{peaks:?}");
}

/// A short signal with energy across the band: two tones, a chirp and a deterministic hiss.
fn signal(n: usize) -> Vec<f32> {
    let mut state = 12345u32;
    (0..n)
        .map(|i| {
            let t = i as f64 / f64::from(RATE);
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let noise = f64::from(state >> 8) / f64::from(1u32 << 24) - 0.5;
            (0.4 * (2.0 * std::f64::consts::PI * 440.0 * t).sin()
                + 0.2 * (2.0 * std::f64::consts::PI * 3100.0 * t).sin()
                + 0.2 * (2.0 * std::f64::consts::PI * (200.0 + 20_000.0 * t) * t).sin()
                + 0.05 * noise) as f32
        })
        .collect()
}

/// Whisper's `log_mel_spectrogram` with a direct DFT: centred frames (reflect padding),
/// periodic Hann window, |X|^2, mel, log10, last frame dropped, max - 8 floor, (x + 4) / 4.
fn reference_log_mel(samples: &[f32], filters: &[f64]) -> Vec<f64> {
    let x: Vec<f64> = samples.iter().map(|&s| f64::from(s)).collect();
    let pad = N_FFT / 2;
    let n = x.len();
    let at = |i: isize| -> f64 {
        // numpy "reflect": index -1 is x[1], index n is x[n - 2].
        let j = if i < 0 {
            -i
        } else if i >= n as isize {
            2 * (n as isize - 1) - i
        } else {
            i
        };
        x[j as usize]
    };
    let frames = n / HOP; // n / HOP + 1 centred frames, minus the last
    let mut mel = vec![0.0; N_MELS * frames];
    for f in 0..frames {
        let start = (f * HOP) as isize - pad as isize;
        let windowed: Vec<f64> = (0..N_FFT)
            .map(|j| {
                let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * j as f64 / N_FFT as f64).cos();
                w * at(start + j as isize)
            })
            .collect();
        let power: Vec<f64> = (0..N_FREQS)
            .map(|k| {
                let (mut re, mut im) = (0.0, 0.0);
                for (j, v) in windowed.iter().enumerate() {
                    let angle = 2.0 * std::f64::consts::PI * (k * j) as f64 / N_FFT as f64;
                    re += v * angle.cos();
                    im -= v * angle.sin();
                }
                re * re + im * im
            })
            .collect();
        for m in 0..N_MELS {
            let e: f64 = (0..N_FREQS)
                .map(|k| filters[m * N_FREQS + k] * power[k])
                .sum();
            mel[m * frames + f] = e.max(1e-10).log10();
        }
    }
    let max = mel.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    mel.iter()
        .map(|&v| (v.max(max - 8.0) + 4.0) / 4.0)
        .collect()
}

#[test]
fn log_mel_matches_a_direct_dft_within_1e_4() {
    let samples = signal(2400);
    let filters = mel_filters(RATE, N_FFT, N_MELS);
    let ours = log_mel_spectrogram(&samples, &filters, N_FFT, HOP, N_MELS);
    let filters64: Vec<f64> = filters.iter().map(|&w| f64::from(w)).collect();
    let reference = reference_log_mel(&samples, &filters64);
    assert_eq!(
        ours.len(),
        N_MELS * 15,
        "2400 samples / hop 160 = 15 frames per bin"
    );
    assert_eq!(ours.len(), reference.len());
    let worst = ours
        .iter()
        .zip(&reference)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 1e-4, "largest difference {worst}");
    // The features are not trivially flat: the floor leaves a real dynamic range.
    let (lo, hi) = reference
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    assert!(hi - lo > 0.5, "range {lo}..{hi}");
}

#[test]
fn the_processor_pads_to_30_second_windows_of_3000_frames() {
    let p = WhisperProcessor::new(N_MELS, 600.0);
    let samples = signal(16_000);
    let blocks = p.features(&samples);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].len(), N_MELS * 3000);
    // The first frames carry the signal; the padding is at the floor (silence).
    let row0 = &blocks[0][..3000];
    let floor = row0.iter().copied().fold(f32::MAX, f32::min);
    assert!(
        row0[10] > floor + 0.5,
        "signal frame {} vs floor {floor}",
        row0[10]
    );
    assert!(
        (row0[2999] - floor).abs() < 1e-6,
        "padding frame {}",
        row0[2999]
    );
}
