//! Audio parts of conversation files: WAVs in every common layout decode to mono f32 at their
//! own rate; inline base64 PCM too; bad audio is an error naming the file and the problem.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use hound::{SampleFormat, WavSpec, WavWriter};
use lmhost::{audio, conversation, Error};
use lmhost_plugin_api::{Audio, ErrorKind, Part};

fn spec(channels: u16, rate: u32, bits: u16, format: SampleFormat) -> WavSpec {
    WavSpec {
        channels,
        sample_rate: rate,
        bits_per_sample: bits,
        sample_format: format,
    }
}

/// Writes `frames` (one value per channel per frame) as integers of `spec.bits_per_sample`.
fn write_int(path: &Path, spec: WavSpec, frames: &[Vec<f32>]) {
    let mut w = WavWriter::create(path, spec).unwrap();
    let full = ((1i64 << (spec.bits_per_sample - 1)) - 1) as f32;
    for frame in frames {
        for &v in frame {
            let q = (v * full).round() as i32;
            match spec.bits_per_sample {
                8 => w.write_sample(q as i8).unwrap(),
                16 => w.write_sample(q as i16).unwrap(),
                _ => w.write_sample(q).unwrap(),
            }
        }
    }
    w.finalize().unwrap();
}

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 / n as f32) - 0.5).collect()
}

fn close(audio: &Audio, want: &[f32], tolerance: f32) {
    assert_eq!(audio.samples.len(), want.len());
    for (i, (a, b)) in audio.samples.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tolerance, "sample {i}: {a} vs {b}");
    }
}

#[test]
fn integer_wavs_of_any_rate_and_depth_decode_at_their_own_rate() {
    let dir = tempfile::tempdir().unwrap();
    let signal = ramp(800);
    for (rate, bits) in [(8000, 16), (16000, 16), (16000, 24), (22050, 32), (8000, 8)] {
        let path = dir.path().join(format!("{rate}-{bits}.wav"));
        let frames: Vec<Vec<f32>> = signal.iter().map(|&v| vec![v]).collect();
        write_int(&path, spec(1, rate, bits, SampleFormat::Int), &frames);
        let audio = audio::read_wav(&path).unwrap();
        assert_eq!(audio.sample_rate, rate);
        // One quantisation step, or f32 rounding for 32-bit integers.
        let tolerance = (2.0 / (1u64 << (bits - 1)) as f32).max(1e-6);
        close(&audio, &signal, tolerance);
    }
}

#[test]
fn stereo_is_averaged_to_mono_and_float_wavs_decode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stereo.wav");
    let frames: Vec<Vec<f32>> = (0..100).map(|_| vec![0.5, 0.25]).collect();
    write_int(&path, spec(2, 16000, 16, SampleFormat::Int), &frames);
    let audio = audio::read_wav(&path).unwrap();
    close(&audio, &[0.375; 100], 1e-4);

    let path = dir.path().join("float.wav");
    let mut w = WavWriter::create(&path, spec(2, 48000, 32, SampleFormat::Float)).unwrap();
    for v in ramp(300) {
        w.write_sample(v).unwrap();
        w.write_sample(-v).unwrap();
    }
    w.finalize().unwrap();
    let audio = audio::read_wav(&path).unwrap();
    assert_eq!(audio.sample_rate, 48000);
    close(&audio, &[0.0; 300], 0.0);
}

fn audio_error(result: lmhost::Result<Audio>) -> (PathBuf, String) {
    match result {
        Err(err @ Error::Audio { .. }) => {
            assert_eq!(err.plugin_kind(), Some(ErrorKind::InvalidInput));
            let Error::Audio { path, message } = err else {
                unreachable!()
            };
            (path, message)
        }
        other => panic!("expected an audio error, got {other:?}"),
    }
}

#[test]
fn bad_wavs_are_errors_naming_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let not_wav = dir.path().join("notes.wav");
    std::fs::write(&not_wav, b"this is text, not audio").unwrap();
    let empty_file = dir.path().join("zero.wav");
    std::fs::write(&empty_file, b"").unwrap();
    let no_samples = dir.path().join("silent.wav");
    write_int(&no_samples, spec(1, 16000, 16, SampleFormat::Int), &[]);
    let truncated = dir.path().join("cut.wav");
    write_int(
        &truncated,
        spec(1, 16000, 16, SampleFormat::Int),
        &vec![vec![0.1]; 1000],
    );
    let bytes = std::fs::read(&truncated).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 501]).unwrap();
    // 3601 samples at 1 Hz: an hour and a second, in a few bytes.
    let too_long = dir.path().join("long.wav");
    write_int(
        &too_long,
        spec(1, 1, 16, SampleFormat::Int),
        &vec![vec![0.0]; 3601],
    );
    let missing = dir.path().join("missing.wav");
    let cases = [
        (&not_wav, "not a readable WAV file"),
        (&empty_file, "not a readable WAV file"),
        (&no_samples, "the audio is empty"),
        (&truncated, "corrupt WAV data"),
        (&too_long, "3601 s long; at most 3600 s"),
        (&missing, "cannot open"),
    ];
    for (file, problem) in cases {
        let (path, message) = audio_error(audio::read_wav(file));
        assert_eq!(&path, file);
        assert!(message.contains(problem), "{}: {message}", file.display());
        let shown = Error::Audio { path, message }.to_string();
        assert!(shown.contains(&file.display().to_string()), "{shown}");
    }
}

#[test]
fn inline_pcm_decodes_s16le_by_default_and_f32le_stereo() {
    let engine = base64::engine::general_purpose::STANDARD;
    let s16: Vec<u8> = [0i16, 16384, -32768]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let f32: Vec<u8> = [0.5f32, 0.25, -1.0, 1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let json = format!(
        r#"{{"messages": [{{"role": "user", "content": [
            {{"type": "audio", "pcm_base64": "{}", "sample_rate": 16000}},
            {{"type": "audio", "pcm_base64": "{}", "sample_rate": 44100, "format": "f32le", "channels": 2}},
            {{"type": "text", "text": "transcribe"}}
        ]}}]}}"#,
        engine.encode(&s16),
        engine.encode(&f32)
    );
    let snapshot = conversation::parse(&json, Path::new("c.json")).unwrap();
    let parts = &snapshot.turns[0].messages[0].parts;
    let Part::Audio { audio: a } = &parts[0] else {
        panic!("{parts:?}")
    };
    assert_eq!(a.sample_rate, 16000);
    assert_eq!(a.samples.as_slice(), &[0.0, 0.5, -1.0]);
    let Part::Audio { audio: b } = &parts[1] else {
        panic!("{parts:?}")
    };
    assert_eq!(b.sample_rate, 44100);
    assert_eq!(b.samples.as_slice(), &[0.375, 0.0]);
    assert!(snapshot.has_audio());
}

#[test]
fn audio_paths_are_relative_to_the_conversation_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("clips")).unwrap();
    let frames: Vec<Vec<f32>> = ramp(160).into_iter().map(|v| vec![v]).collect();
    write_int(
        &dir.path().join("clips/a.wav"),
        spec(1, 8000, 16, SampleFormat::Int),
        &frames,
    );
    let file = dir.path().join("conv.json");
    std::fs::write(
        &file,
        r#"{"messages": [{"role": "user", "content": [{"type": "audio", "path": "clips/a.wav"}]}]}"#,
    )
    .unwrap();
    let snapshot = conversation::load(&file).unwrap();
    assert!(snapshot.has_audio());

    std::fs::write(
        &file,
        r#"{"messages": [{"role": "user", "content": [{"type": "audio", "path": "clips/b.wav"}]}]}"#,
    )
    .unwrap();
    let err = conversation::load(&file).unwrap_err();
    assert!(
        err.to_string().contains("clips/b.wav: cannot open"),
        "{err}"
    );
}

#[test]
fn malformed_audio_parts_say_what_is_expected() {
    let cases = [
        (r#"{"type": "audio"}"#, "needs `path`"),
        (
            r#"{"type": "audio", "pcm_base64": "AAA="}"#,
            "needs `sample_rate`",
        ),
        (
            r#"{"type": "audio", "path": "a.wav", "sample_rate": 8000}"#,
            "takes no other field",
        ),
        (
            r#"{"type": "audio", "pcm_base64": "!!", "sample_rate": 8000}"#,
            "not valid base64",
        ),
        (
            r#"{"type": "audio", "pcm_base64": "AAAA", "sample_rate": 8000}"#,
            "not a whole number of 2-byte s16le samples",
        ),
        (
            r#"{"type": "audio", "pcm_base64": "AAAA", "sample_rate": 8000, "format": "mp3"}"#,
            "expected \"s16le\" or \"f32le\"",
        ),
        (
            r#"{"type": "audio", "pcm_base64": "", "sample_rate": 8000}"#,
            "the audio is empty",
        ),
    ];
    for (part, problem) in cases {
        let json = format!(r#"{{"messages": [{{"role": "user", "content": [{part}]}}]}}"#);
        let err = conversation::parse(&json, Path::new("c.json")).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("c.json: "), "{text}");
        assert!(text.contains(problem), "{part}: {text}");
    }
}
