//! Sample-rate conversion to the model's rate with rubato's synchronous FFT resampler.
//!
//! The host decodes audio at the file's own rate (it does not know the model); the processor,
//! which knows the rate its model was trained at, converts here. The FFT resampler suits a fixed
//! integer ratio (8, 22.05, 44.1, 48 kHz to 16 kHz) and is exact up to its band limit.

use rubato::{FftFixedIn, Resampler};

const CHUNK: usize = 1024;

/// `samples` at `from` Hz converted to `to` Hz; the output has `ceil(len * to / from)` samples.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    let mut resampler = FftFixedIn::<f32>::new(from as usize, to as usize, CHUNK, 1, 1)
        .map_err(|e| format!("cannot resample {from} Hz to {to} Hz: {e}"))?;
    let expected = (samples.len() as u64 * u64::from(to)).div_ceil(u64::from(from)) as usize;
    let delay = resampler.output_delay();
    let mut out = Vec::with_capacity(expected + delay + CHUNK);
    let mut rest = samples;
    let fail = |e: rubato::ResampleError| format!("resampling {from} Hz to {to} Hz failed: {e}");
    while rest.len() >= resampler.input_frames_next() {
        let (chunk, tail) = rest.split_at(resampler.input_frames_next());
        out.extend_from_slice(&resampler.process(&[chunk], None).map_err(fail)?[0]);
        rest = tail;
    }
    if !rest.is_empty() {
        out.extend_from_slice(
            &resampler
                .process_partial(Some(&[rest]), None)
                .map_err(fail)?[0],
        );
    }
    // Flush the resampler's delay line until the whole signal is out.
    while out.len() < expected + delay {
        let flushed = resampler
            .process_partial::<&[f32]>(None, None)
            .map_err(fail)?;
        if flushed[0].is_empty() {
            break;
        }
        out.extend_from_slice(&flushed[0]);
    }
    let end = (delay + expected).min(out.len());
    let mut result = out.get(delay..end).map(<[f32]>::to_vec).unwrap_or_default();
    result.resize(expected, 0.0);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(freq: f32, rate: u32, seconds: f32) -> Vec<f32> {
        let n = (rate as f32 * seconds) as usize;
        (0..n)
            .map(|i| (2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin())
            .collect()
    }

    #[test]
    fn a_tone_keeps_its_frequency_and_timing_across_rates() {
        for from in [8000, 22050, 44100, 48000] {
            let out = resample(&sine(440.0, from, 0.5), from, 16000).unwrap();
            assert_eq!(out.len(), 8000, "{from} Hz");
            // Away from the edges the output is the same tone made at 16 kHz, shifted by less
            // than half a sample (the FFT resampler's fractional delay for odd block sizes).
            let (err, shift) = (-10..=10)
                .map(|s| {
                    let shift = s as f32 * 0.05;
                    let err = (1000..7000)
                        .map(|i| {
                            let t = (i as f32 - shift) / 16000.0;
                            (out[i] - (2.0 * std::f32::consts::PI * 440.0 * t).sin()).abs()
                        })
                        .fold(0.0, f32::max);
                    (err, shift)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap();
            assert!(err < 0.01, "{from} Hz: max error {err} at shift {shift}");
        }
    }
}
