//! `lmhost tokenize`, `detokenize`, `score` and `generate --raw` on the real SmolLM2 model:
//! the text front end end to end, from the command line to the candle backend and back.
//! Needs `scripts/fetch-models` (the test command runs it).

use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::{repo, require};

fn lmhost(args: &[&str]) -> Output {
    require("models/smollm2", "fetch-models");
    Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .current_dir(repo())
        .arg("-q")
        .args(args)
        .args(["--config", "configs/default.toml"])
        .output()
        .expect("lmhost runs")
}

/// Runs a command that must succeed and print JSON.
fn json(args: &[&str]) -> Value {
    let output = lmhost(args);
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn ids(value: &Value) -> Vec<u64> {
    value["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn tokenize_shows_the_templated_prompt_and_detokenize_gives_it_back() {
    let question = "What is the capital of France?";
    let chat = json(&["tokenize", "--prompt", question, "--json"]);
    let chat_ids = ids(&chat);
    assert_eq!(chat_ids[0], 1, "ChatML opens with <|im_start|> (id 1)");
    assert_eq!(chat["count"].as_u64(), Some(chat_ids.len() as u64));
    let pieces: String = chat["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        pieces.ends_with(&format!(
            "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )),
        "{pieces:?}"
    );
    let list: Vec<String> = chat_ids.iter().map(u64::to_string).collect();
    let text = json(&["detokenize", &list.join(","), "--json"]);
    assert_eq!(text["text"], pieces, "detokenize keeps the special tokens");

    // Raw text skips the template: the question's own tokens, which the chat prompt holds
    // just before the user turn's <|im_end|> (id 2).
    let raw = ids(&json(&[
        "tokenize", "--raw", "--prompt", question, "--json",
    ]));
    assert!(raw.len() < chat_ids.len() && !raw.contains(&1));
    let in_chat = chat_ids
        .windows(raw.len() + 1)
        .any(|w| w[..raw.len()] == raw[..] && w[raw.len()] == 2);
    assert!(in_chat, "{raw:?} in {chat_ids:?}");
}

#[test]
fn raw_scoring_is_the_continuation_of_the_text() {
    let prompt = "The capital of France is";
    let reply = " Paris, and the capital of Germany is Berlin.";
    let short = json(&[
        "score", "--raw", "--prompt", prompt, "--reply", reply, "--json",
    ]);
    // The same tokens scored as part of a longer continuation of a shorter prompt.
    let rest = format!(" capital of France is{reply}");
    let long = json(&[
        "score", "--raw", "--prompt", "The", "--reply", &rest, "--json",
    ]);
    let (short_ids, long_ids) = (ids(&short), ids(&long));
    assert!(
        long_ids.ends_with(&short_ids),
        "{long_ids:?} / {short_ids:?}"
    );
    let logprobs = |v: &Value| -> Vec<f64> {
        v["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap())
            .collect()
    };
    let (a, b) = (logprobs(&short), logprobs(&long));
    let tail = &b[b.len() - a.len()..];
    let diff = a
        .iter()
        .zip(tail)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(diff < 1e-4, "max |Δ logprob| {diff}");
    let total = short["total_logprob"].as_f64().unwrap();
    assert!((total - a.iter().sum::<f64>()).abs() < 1e-3);
    // A plausible continuation beats an implausible one.
    let wrong = json(&[
        "score",
        "--raw",
        "--prompt",
        prompt,
        "--reply",
        " a purple banana.",
        "--json",
    ]);
    let per_token = |v: &Value| v["total_logprob"].as_f64().unwrap() / ids(v).len() as f64;
    assert!(per_token(&short) > per_token(&wrong));
}

#[test]
fn generate_raw_continues_the_text_without_a_template() {
    let output = lmhost(&[
        "generate",
        "--raw",
        "--prompt",
        "The capital of France is",
        "--json",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let record: Value = serde_json::from_slice(&output.stdout).unwrap();
    // Without the chat template the prompt is the sentence's 5 tokens (no <|im_start|>).
    assert_eq!(record["prompt_tokens"], 5);
    // " Paris" is the first token on every kernel path (AVX-512, AVX2, scalar), by far the
    // model's likeliest: no near tie for another CPU's rounding to part.
    assert!(
        record["text"].as_str().unwrap().contains("Paris"),
        "{record}"
    );
}

#[test]
fn bad_token_ids_are_refused_naming_them() {
    let output = lmhost(&["detokenize", "5,x"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`x`"), "{stderr}");
    let output = lmhost(&["detokenize", "99999999"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("outside the vocabulary of 49152"),
        "{stderr}"
    );
}

/// `configs/serve.toml` (SmolLM2 with keys and values kept in f16) loads and answers, its
/// record's logprobs as many as its tokens.
#[test]
fn the_serving_config_keeps_f16_keys_and_answers() {
    let output = Command::new(env!("CARGO_BIN_EXE_lmhost"))
        .current_dir(repo())
        .args(["-q", "generate", "--config", "configs/serve.toml", "--json"])
        .args(["--prompt", "What is the capital of France?"])
        .output()
        .expect("lmhost runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let record: Value = serde_json::from_slice(&output.stdout).unwrap();
    let tokens = ids(&record).len();
    assert!(tokens > 0, "{record}");
    assert_eq!(record["logprobs"].as_array().map(Vec::len), Some(tokens));
}

/// A conversation with an image: a broken image is refused naming its part before any model
/// runs; a good one reaches SmolLM2, which refuses it naming itself as text-only.
#[test]
fn an_image_for_a_text_model_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut png = std::io::Cursor::new(Vec::new());
    image::RgbImage::from_pixel(4, 4, image::Rgb([200, 30, 30]))
        .write_to(&mut png, image::ImageFormat::Png)
        .unwrap();
    std::fs::write(dir.path().join("red.png"), png.get_ref()).unwrap();
    std::fs::write(dir.path().join("broken.png"), &png.get_ref()[..20]).unwrap();
    for (file, expected) in [
        ("broken.png", "message 1, part 2: cannot decode as Png"),
        (
            "red.png",
            "text-only causal language model, which cannot see images",
        ),
    ] {
        let conversation = dir.path().join(format!("{file}.json"));
        let content = serde_json::json!([
            {"type": "text", "text": "What colour is this?"},
            {"type": "image", "path": file},
        ]);
        let messages = serde_json::json!({"messages": [{"role": "user", "content": content}]});
        std::fs::write(&conversation, messages.to_string()).unwrap();
        let output = lmhost(&["generate", "--conversation", conversation.to_str().unwrap()]);
        assert!(!output.status.success(), "{file}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{file}: {stderr}");
    }
}

/// A chat template that loops without end, or doubles a string until it would fill memory,
/// given as the backend's `chat_template` option (as a GGUF file's own would run), is refused
/// on the first prompt, naming the model and the limit, and the process exits.
#[test]
fn a_chat_template_that_never_ends_or_fills_memory_is_refused_naming_the_model() {
    require("models/smollm2", "fetch-models");
    let cases = [
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "exceeds its fuel of 20000000 instructions",
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}\
             {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
            "exceeds its memory limit of 512 MiB",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let default = std::fs::read_to_string(repo().join("configs/default.toml")).unwrap();
    let model = repo().join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    for (source, expected) in cases {
        let template = dir.path().join("hostile.jinja");
        std::fs::write(&template, source).unwrap();
        let config = dir.path().join("hostile.toml");
        let config_text = default
            .replace(
                "../models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                model.to_str().unwrap(),
            )
            .replace(
                "[backend.options]",
                &format!(
                    "[backend.options]\nchat_template = {:?}",
                    template.to_str().unwrap()
                ),
            );
        std::fs::write(&config, config_text).unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_lmhost"))
            .args(["-q", "generate", "--prompt", "hi", "--config"])
            .arg(&config)
            .output()
            .expect("lmhost runs");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("SmolLM2-135M-Instruct.Q4_1.gguf`: chat template from")
                && stderr.contains(expected),
            "{stderr}"
        );
    }
}

/// GGUF headers that claim more than their file holds (a string of 2^60 bytes, a billion
/// tensors, a shape whose product overflows) are refused naming the problem, by a process
/// capped at 4 GiB of address space: an error and exit status 1, never an allocation abort.
#[test]
fn hostile_gguf_headers_are_refused_within_a_memory_cap() {
    let dir = tempfile::tempdir().unwrap();
    let header = |tensors: u64, kv: &[u8], infos: &[u8]| -> Vec<u8> {
        let pairs = u64::from(!kv.is_empty());
        [
            b"GGUF",
            &3u32.to_le_bytes()[..],
            &tensors.to_le_bytes(),
            &pairs.to_le_bytes(),
            kv,
            infos,
        ]
        .concat()
    };
    let string = |s: &str| [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat();
    let arch = [
        string("general.architecture"),
        8u32.to_le_bytes().to_vec(),
        string("llama"),
    ]
    .concat();
    let huge = [
        string("general.architecture"),
        8u32.to_le_bytes().to_vec(),
        (1u64 << 60).to_le_bytes().to_vec(),
    ]
    .concat();
    let overflow = [
        string("w"),
        2u32.to_le_bytes().to_vec(),
        (1u64 << 40).to_le_bytes().to_vec(),
        (1u64 << 40).to_le_bytes().to_vec(),
        0u32.to_le_bytes().to_vec(),
        0u64.to_le_bytes().to_vec(),
    ]
    .concat();
    let cases = [
        (
            "huge.gguf",
            header(0, &huge, &[]),
            "string length 1152921504606846976 exceeds the GGUF file",
        ),
        (
            "billion.gguf",
            header(1_000_000_000, &arch, &[]),
            "declares 1000000000 tensors",
        ),
        (
            "overflow.gguf",
            header(1, &arch, &overflow),
            "tensor `w`: shape [1099511627776, 1099511627776]",
        ),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let config = dir.path().join(format!("{name}.toml"));
        let toml = format!(
            "[backend]\nkind = \"candle\"\nmodel_id = {:?}\n",
            path.to_str().unwrap()
        );
        std::fs::write(&config, toml).unwrap();
        let output = Command::new("bash")
            .arg("-c")
            .arg(r#"ulimit -v 4194304; exec "$0" -q generate --prompt hi --config "$1""#)
            .arg(env!("CARGO_BIN_EXE_lmhost"))
            .arg(&config)
            .output()
            .expect("bash runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains(expected),
            "{name}: {stderr}"
        );
    }
}
