//! A closed-loop streaming load generator for `lmhost serve` on a real model: N clients each
//! send streaming chat requests back to back (at most `REQUESTS` each, and none started after
//! `SECONDS` per level); prints, per concurrency level, time to first token (p50/p99),
//! inter-token latency (p50/p99), aggregate completion tokens/s and 503s.
//!
//! ```text
//! cargo run --release --example streamgen -- http://127.0.0.1:8000 MODEL 1 8 32
//! ```
//! (`scripts/bench-serve` starts the server and runs this.) Tokens are counted from the
//! usage chunk; every request asks for `MAX_TOKENS` and a different question.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

const SECONDS: u64 = 30;
const REQUESTS: usize = 4;
const MAX_TOKENS: u32 = 48;
const TOPICS: [&str; 8] = [
    "the sea",
    "a library",
    "trains",
    "the moon",
    "bread",
    "a garden",
    "winter",
    "bicycles",
];

/// What one client saw.
#[derive(Default)]
struct Seen {
    first_token: Vec<Duration>,
    gaps: Vec<Duration>,
    tokens: u64,
    refused: usize,
    errors: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: streamgen BASE_URL MODEL CONCURRENCY...");
        std::process::exit(2);
    }
    let url = format!("{}/v1/chat/completions", args[0].trim_end_matches('/'));
    let model = &args[1];
    // One unmeasured request: the model loads on first use.
    client(
        &url,
        model,
        0,
        Instant::now() + Duration::from_secs(SECONDS),
        1,
    );
    println!(
        "clients  requests  tok/s   ttft p50 ms  ttft p99 ms  itl p50 ms  itl p99 ms  503s  errors"
    );
    for level in &args[2..] {
        let clients: usize = level
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {level}"));
        let start = Instant::now();
        let seen: Vec<Seen> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..clients)
                .map(|c| {
                    let url = &url;
                    s.spawn(move || {
                        client(
                            url,
                            model,
                            c,
                            start + Duration::from_secs(SECONDS),
                            REQUESTS,
                        )
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let elapsed = start.elapsed().as_secs_f64();
        let mut all = Seen::default();
        for s in seen {
            all.first_token.extend(s.first_token);
            all.gaps.extend(s.gaps);
            all.tokens += s.tokens;
            all.refused += s.refused;
            all.errors += s.errors;
        }
        println!(
            "{clients:>7}  {:>8}  {:>5.1}  {:>11.0}  {:>11.0}  {:>10.1}  {:>10.1}  {:>4}  {:>6}",
            all.first_token.len(),
            all.tokens as f64 / elapsed,
            percentile(&mut all.first_token, 0.50),
            percentile(&mut all.first_token, 0.99),
            percentile(&mut all.gaps, 0.50),
            percentile(&mut all.gaps, 0.99),
            all.refused,
            all.errors,
        );
    }
}

fn percentile(values: &mut [Duration], p: f64) -> f64 {
    values.sort();
    let i = ((values.len() as f64 * p) as usize).min(values.len().saturating_sub(1));
    values.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn client(url: &str, model: &str, c: usize, stop: Instant, requests: usize) -> Seen {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut seen = Seen::default();
    for i in 0..requests {
        if Instant::now() >= stop {
            break;
        }
        let topic = TOPICS[(c + i * 3) % TOPICS.len()];
        let body = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"Client {c} asks: write a few sentences about {topic}."}}],"max_tokens":{MAX_TOKENS},"stream":true,"stream_options":{{"include_usage":true}}}}"#
        );
        let sent = Instant::now();
        let response = agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(&body);
        match response {
            Ok(r) if r.status() == 200 => read_stream(r, sent, &mut seen),
            Ok(r) if r.status() == 503 => seen.refused += 1,
            _ => seen.errors += 1,
        }
    }
    seen
}

/// Reads one SSE response: the first content chunk's arrival, the gaps between the next ones,
/// and the usage chunk's completion tokens.
fn read_stream(response: ureq::http::Response<ureq::Body>, sent: Instant, seen: &mut Seen) {
    let reader = BufReader::new(response.into_body().into_reader());
    let mut last: Option<Instant> = None;
    for line in reader.lines() {
        let Ok(line) = line else {
            seen.errors += 1;
            return;
        };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(chunk) = serde_json::from_str::<serde_json::Value>(data) else {
            continue; // [DONE]
        };
        if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
            seen.tokens += tokens;
        }
        let content = chunk["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or("");
        if content.is_empty() {
            continue;
        }
        let now = Instant::now();
        match last {
            None => seen.first_token.push(now - sent),
            Some(previous) => seen.gaps.push(now - previous),
        }
        last = Some(now);
    }
}
