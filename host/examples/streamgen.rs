//! A closed-loop streaming load generator for `lmhost serve` on a real model: N clients each
//! send streaming chat requests back to back (at most `REQUESTS` each, and none started after
//! `SECONDS` per level); prints, per concurrency level, time to first token (p50/p99),
//! inter-token latency (p50/p99), aggregate completion tokens/s and 503s.
//!
//! The aggregate is taken while every client is still sending (from the level's start until
//! the first client has sent all its requests), counting the streamed tokens (lmhost sends a
//! chunk per token); as the clients run out of requests at different times, fewer share the
//! server, and that ramp-down is not the concurrency being measured. `whole` is the level's
//! completion tokens (from the usage chunks) over its whole time, ramp-down included.
//!
//! ```text
//! cargo run --release --example streamgen -- [--tokens MIN-MAX] http://127.0.0.1:8000 MODEL 1 8 32
//! ```
//! (`scripts/bench-serve` starts the server and runs this.) Every request asks a different
//! question, for a reply of at most MIN to MAX tokens (24-72 unless given; each request's
//! own, drawn from a fixed sequence), as users' replies differ: clients whose replies all end
//! in the same decode pass send their next prompts together, a burst no real set of users
//! keeps up. `--tokens 48-48` is that case.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

const SECONDS: u64 = 30;
const REQUESTS: usize = 8;
/// Reply lengths asked for unless `--tokens` is given.
const TOKENS: (u32, u32) = (24, 72);
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
    /// When each token arrived, from the level's start.
    arrivals: Vec<Duration>,
    /// When the client's last request ended, from the level's start.
    finished: Duration,
    tokens: u64,
    refused: usize,
    errors: usize,
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let tokens = match args.iter().position(|a| a == "--tokens") {
        Some(at) => {
            let range = args.get(at + 1).and_then(|r| {
                let (min, max) = r.split_once('-')?;
                Some((min.parse().ok()?, max.parse().ok()?))
            });
            args.drain(at..(at + 2).min(args.len()));
            match range {
                Some((min, max)) if min <= max && min > 0 => (min, max),
                _ => usage(),
            }
        }
        None => TOKENS,
    };
    if args.len() < 3 {
        usage();
    }
    let url = format!("{}/v1/chat/completions", args[0].trim_end_matches('/'));
    let model = &args[1];
    // One unmeasured request: the model loads on first use.
    let now = Instant::now();
    client(
        &url,
        model,
        0,
        (now, now + Duration::from_secs(SECONDS)),
        (1, tokens),
    );
    println!("replies of at most {}-{} tokens each", tokens.0, tokens.1);
    println!(
        "clients  requests  tok/s   whole   ttft p50 ms  ttft p99 ms  itl p50 ms  itl p99 ms  503s  errors"
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
                            (start, start + Duration::from_secs(SECONDS)),
                            (REQUESTS, tokens),
                        )
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        let elapsed = start.elapsed().as_secs_f64();
        let all_sending = seen.iter().map(|s| s.finished).min().unwrap_or_default();
        let sent = seen
            .iter()
            .flat_map(|s| &s.arrivals)
            .filter(|&&t| t <= all_sending)
            .count();
        let mut all = Seen::default();
        for s in seen {
            all.first_token.extend(s.first_token);
            all.gaps.extend(s.gaps);
            all.tokens += s.tokens;
            all.refused += s.refused;
            all.errors += s.errors;
        }
        println!(
            "{clients:>7}  {:>8}  {:>5.1}  {:>5.1}  {:>11.0}  {:>11.0}  {:>10.1}  {:>10.1}  {:>4}  {:>6}",
            all.first_token.len(),
            sent as f64 / all_sending.as_secs_f64().max(1e-9),
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

fn usage() -> ! {
    eprintln!("usage: streamgen [--tokens MIN-MAX] BASE_URL MODEL CONCURRENCY...");
    std::process::exit(2);
}

/// Request `i` of client `c`'s longest reply, in `min..=max`: a fixed sequence (splitmix64 of
/// the pair), so every run and every level asks for the same lengths.
fn reply_tokens(c: usize, i: usize, (min, max): (u32, u32)) -> u32 {
    let mut z = ((c as u64) << 32 | i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    min + (z % u64::from(max - min + 1)) as u32
}

fn percentile(values: &mut [Duration], p: f64) -> f64 {
    values.sort();
    let i = ((values.len() as f64 * p) as usize).min(values.len().saturating_sub(1));
    values.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn client(
    url: &str,
    model: &str,
    c: usize,
    (start, stop): (Instant, Instant),
    (requests, tokens): (usize, (u32, u32)),
) -> Seen {
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
        let max_tokens = reply_tokens(c, i, tokens);
        let body = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"Client {c} asks: write a few sentences about {topic}."}}],"max_tokens":{max_tokens},"stream":true,"stream_options":{{"include_usage":true}}}}"#
        );
        let sent = Instant::now();
        let response = agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(&body);
        match response {
            Ok(r) if r.status() == 200 => read_stream(r, (start, sent), &mut seen),
            Ok(r) if r.status() == 503 => seen.refused += 1,
            _ => seen.errors += 1,
        }
    }
    seen.finished = start.elapsed();
    seen
}

/// Reads one SSE response: each token's arrival, the first text's, the gaps between the next
/// texts, and the usage chunk's completion tokens.
fn read_stream(
    response: ureq::http::Response<ureq::Body>,
    (start, sent): (Instant, Instant),
    seen: &mut Seen,
) {
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
        let delta = &chunk["choices"][0]["delta"];
        let now = Instant::now();
        // The first chunk names the role; every later one with content is a token's.
        let content = match delta["content"].as_str() {
            Some(text) if delta["role"].is_null() => {
                seen.arrivals.push(now - start);
                text
            }
            _ => "",
        };
        if content.is_empty() {
            continue;
        }
        match last {
            None => seen.first_token.push(now - sent),
            Some(previous) => seen.gaps.push(now - previous),
        }
        last = Some(now);
    }
}
