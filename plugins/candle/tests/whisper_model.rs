//! Whisper tiny.en (the packaged CTranslate2 model, `scripts/fetch-models`) on speech spoken by
//! espeak-ng (`scripts/setup-system`): transcription, scoring, the processor path's rules, and
//! the CTranslate2 and safetensors loads against each other and against candle-transformers'
//! independent Whisper implementation.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use candle_core::{DType, Device, Tensor};
use common::{max_diff, Greedy};
use lmhost_candle::audio_backend::AudioBackend;
use lmhost_candle::models::whisper;
use lmhost_plugin_api::abi_stable::std_types::{ROption, RVec};
use lmhost_plugin_api::{
    Audio, AudioSpan, ConversationSnapshot, ErrorKind, FinishReason, GenerationConfig, Hideable,
    Message, Part, Role, TextSpan, Turn,
};
use serde_json::Map;

const SPOKEN: &str = "We will meet at the library on Monday morning to discuss the new project.";
const UNRELATED: &str = "Quarterly revenue exceeded expectations in every region.";

fn model_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/whisper-tiny.en");
    assert!(
        dir.join("model.bin").is_file(),
        "{} has no model.bin; run scripts/fetch-models",
        dir.display()
    );
    dir
}

/// The backend, loaded once for all tests in this file.
fn backend() -> std::sync::MutexGuard<'static, AudioBackend> {
    static BACKEND: OnceLock<Mutex<AudioBackend>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let b = AudioBackend::load("whisper-tiny.en", &model_dir(), &Map::new())
                .expect("whisper tiny.en loads");
            Mutex::new(b)
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// `text` spoken by espeak-ng, decoded by the host's WAV reader (22050 Hz, resampled later).
fn speak(text: &str) -> Audio {
    static CLIPS: OnceLock<Mutex<HashMap<String, Audio>>> = OnceLock::new();
    let clips = CLIPS.get_or_init(Default::default);
    if let Some(audio) = clips.lock().unwrap().get(text) {
        return audio.clone();
    }
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("clip.wav");
    let status = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "140", "-w"])
        .arg(&wav)
        .arg(text)
        .status()
        .expect("espeak-ng is not installed; run scripts/setup-system");
    assert!(status.success(), "espeak-ng failed: {status}");
    let audio = lmhost::audio::read_wav(&wav).unwrap();
    clips.lock().unwrap().insert(text.into(), audio.clone());
    audio
}

fn snapshot(parts: Vec<Part>) -> ConversationSnapshot {
    ConversationSnapshot::new(vec![Turn {
        messages: RVec::from(vec![Message::new(Role::User, parts)]),
    }])
    .unwrap()
}

fn audio_part(audio: Audio) -> Part {
    Part::Audio { audio }
}

fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.chars()
                .filter(|c| c.is_alphanumeric())
                .collect::<String>()
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// The share of the reference's words found in the hypothesis (each matched once).
fn word_overlap(reference: &str, hypothesis: &str) -> f64 {
    let mut pool = words(hypothesis);
    let reference = words(reference);
    let found = reference
        .iter()
        .filter(|w| {
            pool.iter()
                .position(|p| p == *w)
                .map(|i| pool.remove(i))
                .is_some()
        })
        .count();
    found as f64 / reference.len() as f64
}

#[test]
fn transcribes_espeak_speech_with_most_words_right() {
    let record = backend()
        .generate(
            &snapshot(vec![audio_part(speak(SPOKEN))]),
            &GenerationConfig::default(),
        )
        .unwrap();
    let overlap = word_overlap(SPOKEN, &record.text);
    eprintln!("transcript: {:?} (word overlap {overlap:.2})", record.text);
    assert!(
        overlap >= 0.7,
        "{:?} overlaps {SPOKEN:?} by {overlap:.2}",
        record.text
    );
    assert_eq!(record.finish_reason, FinishReason::Eos);
    assert_eq!(record.token_ids.len(), record.logprobs.len());
    assert!(record.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
    assert_eq!(
        record.cached_prompt_tokens, 0,
        "audio prompts skip the prefix cache"
    );
}

#[test]
fn the_true_transcript_scores_above_an_unrelated_sentence() {
    let mut b = backend();
    let s = snapshot(vec![audio_part(speak(SPOKEN))]);
    let truth = b.score(&s, SPOKEN).unwrap();
    let other = b.score(&s, UNRELATED).unwrap();
    assert_eq!(truth.token_ids.len(), truth.logprobs.len());
    let (t, o) = (truth.total_logprob(), other.total_logprob());
    assert!(t > o + 10.0, "true {t} vs unrelated {o}");
    // Per token too, so length alone does not decide.
    let per = |r: &lmhost_plugin_api::ScoreRecord| r.total_logprob() / r.logprobs.len() as f64;
    assert!(
        per(&truth) > per(&other),
        "{} vs {}",
        per(&truth),
        per(&other)
    );
}

#[test]
fn generation_logprobs_are_the_scores_of_the_same_tokens() {
    let mut b = backend();
    let s = snapshot(vec![audio_part(speak(SPOKEN))]);
    let record = b.generate(&s, &GenerationConfig::default()).unwrap();
    let scored = b.score(&s, &record.text).unwrap();
    if scored.token_ids == record.token_ids {
        for (g, s) in record.logprobs.iter().zip(&scored.logprobs) {
            assert!((g - s).abs() < 1e-3, "generated {g} vs scored {s}");
        }
    } else {
        // Re-tokenising decoded text can split differently; the totals still agree closely.
        let diff = (record.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>()
            - scored.total_logprob())
        .abs();
        assert!(diff < 5.0, "{diff}");
    }
}

#[test]
fn the_encoder_runs_once_per_distinct_audio_and_embeddings_come_back() {
    let mut b = backend();
    let audio = speak("Hello there, general.");
    let s = snapshot(vec![audio_part(audio.clone())]);
    let config = GenerationConfig {
        compute_embeddings: true,
        ..GenerationConfig::default()
    };
    let first = b.generate(&s, &config).unwrap();
    let runs = b.encoder_runs();
    // Same audio, plus a text part as decoder context: the encoder output is reused.
    let with_text = snapshot(vec![Part::text("General Kenobi."), audio_part(audio)]);
    let second = b.generate(&with_text, &config).unwrap();
    assert_eq!(
        b.encoder_runs(),
        runs,
        "cached encoder output was not reused"
    );
    assert!(
        second.prompt_tokens > first.prompt_tokens,
        "text parts prompt the decoder"
    );
    let d = b.loaded().model.config.d_model;
    for record in [&first, &second] {
        let len = |e: &ROption<RVec<f32>>| e.as_ref().map(|v| v.len()).into_option();
        assert_eq!(len(&record.embedding), Some(d));
        assert_eq!(len(&record.contextual_embedding), Some(d));
    }
}

#[test]
fn sampling_is_seeded_and_max_new_tokens_and_stop_strings_end_generation() {
    let mut b = backend();
    let s = snapshot(vec![audio_part(speak(SPOKEN))]);
    let sample = GenerationConfig {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed: 3,
        ..GenerationConfig::default()
    };
    let a = b.generate(&s, &sample).unwrap();
    let again = b.generate(&s, &sample).unwrap();
    assert_eq!(a.token_ids, again.token_ids, "same seed, same sample");
    let short = b
        .generate(
            &s,
            &GenerationConfig {
                max_new_tokens: 3,
                ..GenerationConfig::default()
            },
        )
        .unwrap();
    assert_eq!(short.token_ids.len(), 3);
    assert_eq!(short.finish_reason, FinishReason::Length);
    let stopped = b
        .generate(
            &s,
            &GenerationConfig {
                stop: RVec::from(vec!["Monday".into()]),
                ..GenerationConfig::default()
            },
        )
        .unwrap();
    assert_eq!(
        stopped.finish_reason,
        FinishReason::StopString,
        "{}",
        stopped.text
    );
    assert!(!stopped.text.contains("Monday"), "{}", stopped.text);
    assert!(stopped.text.starts_with("We will meet"), "{}", stopped.text);
}

#[test]
fn audio_longer_than_one_window_is_transcribed_window_by_window() {
    let mut b = backend();
    let clip = speak(SPOKEN);
    let mut samples = clip.samples.to_vec();
    // 31 s of silence after the speech: a second window that holds nothing to say.
    samples.resize(samples.len() + 31 * clip.sample_rate as usize, 0.0);
    let long = Audio {
        samples: samples.into(),
        sample_rate: clip.sample_rate,
    };
    let record = b
        .generate(
            &snapshot(vec![audio_part(long.clone())]),
            &GenerationConfig::default(),
        )
        .unwrap();
    assert!(
        word_overlap(SPOKEN, &record.text) >= 0.7,
        "{:?}",
        record.text
    );
    let err = b
        .score(&snapshot(vec![audio_part(long)]), SPOKEN)
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("at most 30 s"), "{err}");
}

#[test]
fn text_only_and_too_long_input_are_invalid_input() {
    let mut b = backend();
    let err = b
        .generate(
            &ConversationSnapshot::from_prompt("hello"),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(
        err.message.contains("whisper-tiny.en") && err.message.contains("needs an audio part"),
        "{err}"
    );
    let limited = AudioBackend::load(
        "whisper-tiny.en",
        &model_dir(),
        serde_json::json!({"max_audio_seconds": 1})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    drop(b);
    let mut limited = limited;
    let err = limited
        .generate(
            &snapshot(vec![audio_part(speak(SPOKEN))]),
            &GenerationConfig::default(),
        )
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("message 1, part 1 (audio)"), "{err}");
    assert!(err.message.contains("at most 1 s"), "{err}");
}

// ---- CTranslate2 against safetensors, converted here independently ----

/// Reads `model.bin` into name -> (dims, f32 values): a second, deliberately plain reader.
fn read_ct2(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let b = std::fs::read(path).unwrap();
    let mut p = 0usize;
    let u32_at = |p: &mut usize| {
        let v = u32::from_le_bytes(b[*p..*p + 4].try_into().unwrap());
        *p += 4;
        v as usize
    };
    let string = |p: &mut usize| {
        let n = u16::from_le_bytes(b[*p..*p + 2].try_into().unwrap()) as usize;
        let s = String::from_utf8(b[*p + 2..*p + 2 + n].to_vec()).unwrap();
        *p += 2 + n;
        s.trim_end_matches('\0').to_string()
    };
    assert_eq!(u32_at(&mut p), 6, "binary version");
    assert_eq!(string(&mut p), "WhisperSpec");
    u32_at(&mut p);
    let count = u32_at(&mut p);
    let mut vars = HashMap::new();
    for _ in 0..count {
        let name = string(&mut p);
        let rank = b[p] as usize;
        p += 1;
        let dims: Vec<usize> = (0..rank).map(|_| u32_at(&mut p)).collect();
        let dtype = b[p];
        p += 1;
        let n = u32_at(&mut p);
        let raw = &b[p..p + n];
        p += n;
        let values: Vec<f32> = match dtype {
            4 => raw
                .chunks_exact(2)
                .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            0 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            _ => continue, // flags and integer scalars
        };
        vars.insert(name, (dims, values));
    }
    vars
}

/// IEEE half to single precision, by hand (normal, subnormal, zero, inf/nan).
fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f32::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f32.powi(-24),
        31 => f32::INFINITY,
        _ => (1.0 + frac / 1024.0) * 2f32.powi(exp - 15),
    }
}

type Vars = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// The converted tensors: Hugging Face name, dimensions, values.
struct Hf<'a> {
    vars: &'a Vars,
    out: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Hf<'_> {
    fn get(&self, name: &str) -> &(Vec<usize>, Vec<f32>) {
        self.vars
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"))
    }

    fn copy(&mut self, src: &str, dst: &str) {
        let (dims, v) = self.get(src).clone();
        self.out.push((dst.to_string(), dims, v));
    }

    fn norm(&mut self, src: &str, dst: &str) {
        self.copy(&format!("{src}/gamma"), &format!("{dst}.weight"));
        self.copy(&format!("{src}/beta"), &format!("{dst}.bias"));
    }

    fn linear(&mut self, src: &str, dst: &str) {
        self.copy(&format!("{src}/weight"), &format!("{dst}.weight"));
        self.copy(&format!("{src}/bias"), &format!("{dst}.bias"));
    }

    /// Fused rows: `[q; k; v]` (self-attention) or `[k; v]` (cross-attention); k has no bias.
    fn fused(&mut self, src: &str, dst: &str, parts: &[&str]) {
        let (dims, w) = self.get(&format!("{src}/weight")).clone();
        let (_, bias) = self.get(&format!("{src}/bias")).clone();
        let (rows, cols) = (dims[0] / parts.len(), dims[1]);
        for (i, part) in parts.iter().enumerate() {
            let block = w[i * rows * cols..(i + 1) * rows * cols].to_vec();
            self.out
                .push((format!("{dst}.{part}.weight"), vec![rows, cols], block));
            if *part != "k_proj" {
                let b = bias[i * rows..(i + 1) * rows].to_vec();
                self.out.push((format!("{dst}.{part}.bias"), vec![rows], b));
            }
        }
    }
}

/// Writes `dir/model.safetensors` and a Hugging Face `config.json` converted from the CT2 file.
fn write_hf_checkpoint(ct2: &Path, dir: &Path) {
    let vars = read_ct2(ct2);
    let layers = |side: &str| {
        (0..)
            .take_while(|i| vars.contains_key(&format!("{side}/layer_{i}/ffn/linear_0/weight")))
            .count()
    };
    let (enc_layers, dec_layers) = (layers("encoder"), layers("decoder"));
    let mut hf = Hf {
        vars: &vars,
        out: Vec::new(),
    };
    hf.linear("encoder/conv1", "model.encoder.conv1");
    hf.linear("encoder/conv2", "model.encoder.conv2");
    hf.copy(
        "encoder/position_encodings/encodings",
        "model.encoder.embed_positions.weight",
    );
    hf.copy(
        "decoder/position_encodings/encodings",
        "model.decoder.embed_positions.weight",
    );
    hf.copy(
        "decoder/embeddings/weight",
        "model.decoder.embed_tokens.weight",
    );
    hf.norm("encoder/layer_norm", "model.encoder.layer_norm");
    hf.norm("decoder/layer_norm", "model.decoder.layer_norm");
    for (side, n) in [("encoder", enc_layers), ("decoder", dec_layers)] {
        for i in 0..n {
            let (s, h) = (
                format!("{side}/layer_{i}"),
                format!("model.{side}.layers.{i}"),
            );
            hf.norm(
                &format!("{s}/self_attention/layer_norm"),
                &format!("{h}.self_attn_layer_norm"),
            );
            hf.fused(
                &format!("{s}/self_attention/linear_0"),
                &format!("{h}.self_attn"),
                &["q_proj", "k_proj", "v_proj"],
            );
            hf.linear(
                &format!("{s}/self_attention/linear_1"),
                &format!("{h}.self_attn.out_proj"),
            );
            hf.norm(
                &format!("{s}/ffn/layer_norm"),
                &format!("{h}.final_layer_norm"),
            );
            hf.linear(&format!("{s}/ffn/linear_0"), &format!("{h}.fc1"));
            hf.linear(&format!("{s}/ffn/linear_1"), &format!("{h}.fc2"));
            if side == "decoder" {
                hf.norm(
                    &format!("{s}/attention/layer_norm"),
                    &format!("{h}.encoder_attn_layer_norm"),
                );
                hf.linear(
                    &format!("{s}/attention/linear_0"),
                    &format!("{h}.encoder_attn.q_proj"),
                );
                hf.fused(
                    &format!("{s}/attention/linear_1"),
                    &format!("{h}.encoder_attn"),
                    &["k_proj", "v_proj"],
                );
                hf.linear(
                    &format!("{s}/attention/linear_2"),
                    &format!("{h}.encoder_attn.out_proj"),
                );
            }
        }
    }
    // Saved in f16, as Hugging Face publishes Whisper; the loader computes in f32.
    let tensors: HashMap<String, Tensor> = hf
        .out
        .iter()
        .map(|(name, dims, v)| {
            let t = Tensor::from_slice(v, dims.as_slice(), &Device::Cpu).unwrap();
            (name.clone(), t.to_dtype(DType::F16).unwrap())
        })
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let dim = |name: &str, i: usize| hf.get(name).0[i];
    let d = dim("decoder/embeddings/weight", 1);
    let config = serde_json::json!({
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
        "num_mel_bins": dim("encoder/conv1/weight", 1),
        "d_model": d,
        "vocab_size": dim("decoder/embeddings/weight", 0),
        "encoder_layers": enc_layers,
        "decoder_layers": dec_layers,
        "encoder_attention_heads": d / 64,
        "decoder_attention_heads": d / 64,
        "encoder_ffn_dim": dim("encoder/layer_0/ffn/linear_0/weight", 0),
        "decoder_ffn_dim": dim("decoder/layer_0/ffn/linear_0/weight", 0),
        "max_source_positions": dim("encoder/position_encodings/encodings", 0),
        "max_target_positions": dim("decoder/position_encodings/encodings", 0),
        "suppress_tokens": [],
        "begin_suppress_tokens": [220, 50256],
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(
        ct2.with_file_name("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
}

/// Decoder logits `(prompt_len, vocab)` of the standard prompt over `mel`.
fn logits_of(
    model: &whisper::Whisper,
    tokens: &whisper::SpecialTokens,
    mel: &[f32],
) -> Vec<Vec<f32>> {
    let cross = whisper::decode::encode(model, &[mel.to_vec()]).unwrap();
    let ids = [tokens.prompt(&[]), vec![464, 2068]].concat(); // + " The quick"
    let mut kv = lmhost_candle::kv::KvState::new(model.decoder.n_layers());
    let hidden = model.decoder.forward(&ids, &mut kv, &cross[0]).unwrap();
    model
        .decoder
        .logits(&hidden)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
}

#[test]
fn ctranslate2_and_safetensors_loads_give_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_checkpoint(&model_dir().join("model.bin"), dir.path());
    assert!(whisper::detect(dir.path()) && whisper::detect(&model_dir()));
    let hf = whisper::load(dir.path(), &Device::Cpu, DType::F32).unwrap();
    assert_eq!(hf.format, "safetensors");
    let b = backend();
    let ct2 = b.loaded();
    assert_eq!(ct2.format, "ctranslate2");
    assert_eq!(hf.model.config.d_model, ct2.model.config.d_model);
    assert_eq!(hf.tokens, ct2.tokens);

    let samples = b.processor().prepare(&speak(SPOKEN), "clip").unwrap();
    let mel = b.processor().features(&samples).remove(0);
    let from_ct2 = logits_of(&ct2.model, &ct2.tokens, &mel);
    let from_hf = logits_of(&hf.model, &hf.tokens, &mel);
    let diff = max_diff(&from_ct2, &from_hf);
    assert!(
        diff < 1e-4,
        "CTranslate2 vs safetensors logits differ by {diff}"
    );

    // candle-transformers' own Whisper on the same safetensors and features: an independent
    // implementation (tanh-approximate GELU, so only close, not equal: 0.045 measured, the
    // GELU's own difference, which no CPU changes; both are f32 through candle's GEMM).
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[dir.path().join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap();
    let config: candle_transformers::models::whisper::Config =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let mut reference =
        candle_transformers::models::whisper::model::Whisper::load(&vb, config).unwrap();
    let mel_t = Tensor::from_slice(&mel, (1, 80, 3000), &Device::Cpu).unwrap();
    let encoded = reference.encoder.forward(&mel_t, true).unwrap();
    let ids = [ct2.tokens.prompt(&[]), vec![464, 2068]].concat();
    let ids_t = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let hidden = reference.decoder.forward(&ids_t, &encoded, true).unwrap();
    let theirs = reference
        .decoder
        .final_linear(&hidden)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let diff = max_diff(&from_ct2, &theirs);
    eprintln!("candle-transformers vs ours: largest logit difference {diff}");
    assert!(diff < 0.25, "candle-transformers' logits differ by {diff}");
}

#[test]
fn the_speech_path_honours_dtype_and_device() {
    let options = |o: serde_json::Value| o.as_object().unwrap().clone();
    let half = AudioBackend::load(
        "whisper-tiny.en",
        &model_dir(),
        &options(serde_json::json!({"dtype": "float16"})),
    )
    .unwrap();
    assert_eq!(half.loaded().model.decoder.dtype(), DType::F16);
    let b = backend();
    assert_eq!(b.loaded().model.decoder.dtype(), DType::F32);
    let samples = b.processor().prepare(&speak(SPOKEN), "clip").unwrap();
    let mel = b.processor().features(&samples).remove(0);
    let full = logits_of(&b.loaded().model, &b.loaded().tokens, &mel);
    let reduced = logits_of(&half.loaded().model, &half.loaded().tokens, &mel);
    // f16 rounds every activation to 11 bits; through 8 layers and the tied projection onto
    // 51,864 tokens, logits of magnitude up to 28 move by 1.4 (measured on AVX-512 and with
    // `LMHOST_SIMD=avx2`: candle's f16 GEMM widens to f32 on x86, so another CPU changes only
    // the order of sums, not the 11-bit rounding that makes this difference); the greedy
    // token stays wherever f32's top-two margin exceeds 1.0, twice the largest difference at
    // its top token (0.50).
    let diff = max_diff(&full, &reduced);
    eprintln!("max |logit f32 - f16| = {diff:.3}");
    assert!(diff > 0.0 && diff < 3.0, "{diff}");
    Greedy::of(&reduced, &full, 1.0).check("whisper f16 vs f32");
    // A device this build lacks is refused naming the option, as on the text path.
    #[cfg(not(feature = "cuda"))]
    {
        let err = AudioBackend::load(
            "whisper-tiny.en",
            &model_dir(),
            &options(serde_json::json!({"device": "cuda"})),
        )
        .err()
        .expect("no cuda in this build");
        assert!(err.message.contains("option `device`"), "{err}");
    }
}

/// `score_hidden` on speech: hiding nothing is `score`; hiding a stretch of the clip equals
/// deleting its encoder positions (computed here by slicing the encoder output: cross-attention
/// has no positions of its own, so both are the same sums with the hidden terms left out; f32
/// on one CPU either way, so the bound holds on any); hiding the whole clip costs the
/// transcript most of its score; hiding context text that spells the transcript takes its help
/// away; the audio is encoded once for every entry.
#[test]
fn score_hidden_hides_audio_from_cross_attention_and_text_from_the_decoder() {
    let mut b = backend();
    let audio = speak(SPOKEN);
    let (n, rate) = (audio.samples.len() as u32, audio.sample_rate);
    let clip = |start, end| AudioSpan {
        message: 0,
        audio: 0,
        start,
        end,
    };
    let parts = Hideable {
        spans: vec![TextSpan {
            message: 0,
            start: 0,
            end: SPOKEN.len() as u32,
        }]
        .into(),
        clips: vec![clip(0, n / 2), clip(0, n)].into(),
        ..Hideable::default()
    };
    let heard = snapshot(vec![audio_part(audio.clone())]);
    let runs = b.encoder_runs();
    let records = b
        .score_hidden(&heard, SPOKEN, &parts, &[vec![], vec![1], vec![2]])
        .unwrap();
    assert!(b.encoder_runs() <= runs + 1, "the audio was encoded twice");
    let plain = b.score(&heard, SPOKEN).unwrap();
    assert!(max_diff(&[records[0].logprobs.to_vec()], &[plain.logprobs.to_vec()]) <= 1e-6);

    // The first half's encoder positions, deleted.
    let samples = b.processor().prepare(&audio, "clip").unwrap();
    let mel = b.processor().features(&samples).remove(0);
    let model = &b.loaded().model;
    let mel = Tensor::from_slice(&mel, (1, 80, 3000), &Device::Cpu).unwrap();
    let encoded = model.encoder.forward(&mel).unwrap();
    let half = (f64::from(n / 2) * 16_000.0 / f64::from(rate)).ceil() as u32;
    let kept = Tensor::arange(half.div_ceil(320), 1500, &Device::Cpu).unwrap();
    let cross = (model.decoder)
        .cross_kv(&encoded.index_select(&kept, 1).unwrap())
        .unwrap();
    let (_, deleted) = model
        .force((&cross, &b.loaded().tokens), &[], &plain.token_ids, &[])
        .unwrap();
    let diff = max_diff(&[records[1].logprobs.to_vec()], &[deleted]);
    eprintln!("hidden vs deleted encoder positions: {diff:e}");
    assert!(diff <= 1e-4, "{diff}");

    let total = |r: &lmhost_plugin_api::ScoreRecord| r.total_logprob();
    let (all, first_half, none) = (total(&plain), total(&records[1]), total(&records[2]));
    eprintln!("transcript logprob: heard {all:.2}, first half hidden {first_half:.2}, all hidden {none:.2}");
    assert!(none < first_half && first_half < all - 10.0);

    // A full 30 s window hidden whole: cross-attention over nothing adds nothing (no NaN).
    let mut long = speak(SPOKEN);
    long.samples = (long.samples.iter().copied())
        .chain(std::iter::repeat(0.0))
        .take(30 * rate as usize)
        .collect::<Vec<f32>>()
        .into();
    let window = snapshot(vec![audio_part(long)]);
    let whole = Hideable {
        clips: vec![clip(0, 30 * rate)].into(),
        ..Hideable::default()
    };
    let deaf = b.score_hidden(&window, SPOKEN, &whole, &[vec![0]]).unwrap();
    assert!(deaf[0].logprobs.iter().all(|l| l.is_finite()));
    assert!(deaf[0].total_logprob() < all - 10.0);

    let read = snapshot(vec![Part::text(SPOKEN), audio_part(audio)]);
    let records = b
        .score_hidden(&read, SPOKEN, &parts, &[vec![], vec![0]])
        .unwrap();
    let (with_text, text_hidden) = (total(&records[0]), total(&records[1]));
    eprintln!(
        "with the transcript as context {with_text:.2}, that context hidden {text_hidden:.2}"
    );
    assert!(
        (text_hidden - all).abs() < (with_text - all).abs() / 2.0,
        "hiding the context should take most of its help away"
    );
}
