//! Audio for conversation files: WAV files and inline base64 PCM, decoded to mono f32.
//!
//! The host decodes at the file's own sample rate and does not resample: it does not know which
//! model will listen, and the backend's processor converts to its model's rate (Whisper: 16 kHz).
//! WAV: any sample rate, 8/16/24/32-bit integer or 32-bit float, any channel count (averaged to
//! mono). Inline PCM: little-endian `s16le` (the default, as `ffmpeg -f s16le` writes) or `f32le`,
//! interleaved when `channels` > 1. Every error names the file and the problem.

use std::io::Read;
use std::path::Path;

use base64::Engine as _;
use lmhost_plugin_api::Audio;

use crate::error::{Error, Result};

/// The longest audio a conversation part may hold, whatever the model (a backend may allow less).
pub const MAX_SECONDS: f64 = 3600.0;

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::Audio {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Decodes the WAV file at `path`.
pub fn read_wav(path: &Path) -> Result<Audio> {
    let file = std::fs::File::open(path).map_err(|e| bad(path, format!("cannot open: {e}")))?;
    decode_wav(std::io::BufReader::new(file), path)
}

/// Decodes WAV bytes from `reader`; `path` names the source in errors.
pub fn decode_wav(reader: impl Read, path: &Path) -> Result<Audio> {
    let reader = hound::WavReader::new(reader).map_err(|e| {
        bad(
            path,
            format!(
                "not a readable WAV file ({e}); expected RIFF/WAVE with 8/16/24/32-bit integer \
                 or 32-bit float samples"
            ),
        )
    })?;
    let spec = reader.spec();
    let corrupt = |i: usize, e: hound::Error| {
        bad(
            path,
            format!("corrupt WAV data ({}) at sample {i}: {e}", describe(&spec)),
        )
    };
    let interleaved: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .into_samples::<f32>()
            .enumerate()
            .map(|(i, s)| s.map_err(|e| corrupt(i, e)))
            .collect::<Result<_>>()?,
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            reader
                .into_samples::<i32>()
                .enumerate()
                .map(|(i, s)| s.map(|v| v as f32 * scale).map_err(|e| corrupt(i, e)))
                .collect::<Result<_>>()?
        }
    };
    finish(path, interleaved, spec.channels, spec.sample_rate)
}

fn describe(spec: &hound::WavSpec) -> String {
    format!(
        "{} Hz, {} channel(s), {}-bit",
        spec.sample_rate, spec.channels, spec.bits_per_sample
    )
}

/// The sample formats inline PCM may use.
const PCM_FORMATS: &str = "\"s16le\" or \"f32le\"";

/// Decodes inline base64 PCM (`format` `s16le` or `f32le`, `channels` interleaved).
pub fn decode_pcm_base64(
    data: &str,
    sample_rate: u32,
    format: &str,
    channels: u16,
    path: &Path,
) -> Result<Audio> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(path, format!("`pcm_base64` is not valid base64: {e}")))?;
    let interleaved: Vec<f32> = match format {
        "s16le" => {
            check_multiple(path, bytes.len(), 2, format)?;
            bytes
                .chunks_exact(2)
                .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) / 32768.0)
                .collect()
        }
        "f32le" => {
            check_multiple(path, bytes.len(), 4, format)?;
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        }
        other => {
            return Err(bad(
                path,
                format!("audio `format` {other:?} is unknown; expected {PCM_FORMATS}"),
            ))
        }
    };
    finish(path, interleaved, channels, sample_rate)
}

fn check_multiple(path: &Path, len: usize, size: usize, format: &str) -> Result<()> {
    if len.is_multiple_of(size) {
        Ok(())
    } else {
        Err(bad(
            path,
            format!("`pcm_base64` holds {len} bytes, not a whole number of {size}-byte {format} samples"),
        ))
    }
}

/// Checks rate, emptiness, range and length, and averages channels to mono.
fn finish(path: &Path, interleaved: Vec<f32>, channels: u16, sample_rate: u32) -> Result<Audio> {
    if channels == 0 {
        return Err(bad(path, "0 channels; expected 1 (mono) or more"));
    }
    if sample_rate == 0 {
        return Err(bad(
            path,
            "sample rate 0; expected a rate in Hz such as 16000",
        ));
    }
    let channels = usize::from(channels);
    if !interleaved.len().is_multiple_of(channels) {
        return Err(bad(
            path,
            format!(
                "{} samples do not divide into {channels} channels",
                interleaved.len()
            ),
        ));
    }
    let samples: Vec<f32> = interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() / channels as f32)
        .collect();
    if samples.is_empty() {
        return Err(bad(
            path,
            "the audio is empty (no samples); expected speech",
        ));
    }
    if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
        return Err(bad(path, format!("sample {i} is not a finite number")));
    }
    let seconds = samples.len() as f64 / f64::from(sample_rate);
    if seconds > MAX_SECONDS {
        return Err(bad(
            path,
            format!("the audio is {seconds:.0} s long; at most {MAX_SECONDS} s is accepted"),
        ));
    }
    Ok(Audio {
        samples: samples.into(),
        sample_rate,
    })
}
