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
//! cargo run --release --example streamgen -- [--tokens MIN-MAX] [--rounds N] http://127.0.0.1:8000 MODEL 1 8 32
//! ```
//! `--rounds N` runs the levels N times in turns, then prints each level's median tok/s and
//! the median over the rounds of its ratio to the first level's (paired within a round).
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
    let tokens = match flag(&mut args, "--tokens") {
        Some(range) => match range
            .split_once('-')
            .and_then(|(min, max)| Some((min.parse::<u32>().ok()?, max.parse::<u32>().ok()?)))
        {
            Some((min, max)) if min <= max && min > 0 => (min, max),
            _ => usage(),
        },
        None => TOKENS,
    };
    let rounds = match flag(&mut args, "--rounds") {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n: &usize| n > 0)
            .unwrap_or_else(|| usage()),
        None => 1,
    };
    if args.len() < 3 {
        usage();
    }
    let url = format!("{}/v1/chat/completions", args[0].trim_end_matches('/'));
    let model = &args[1];
    let levels: Vec<usize> = args[2..]
        .iter()
        .map(|level| level.parse().unwrap_or_else(|_| usage()))
        .collect();
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
    // Each round's tok/s per level, in the order of `levels`.
    let runs: Vec<Vec<f64>> = (0..rounds)
        .map(|_| {
            let round = levels
                .iter()
                .map(|&clients| level(&url, model, clients, tokens))
                .collect();
            if rounds > 1 {
                println!();
            }
            round
        })
        .collect();
    if rounds > 1 {
        summary(&levels, &runs);
    }
}

/// Removes `name VALUE` from `args`, returning the value.
fn flag(args: &mut Vec<String>, name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    let value = args.get(at + 1).cloned().unwrap_or_else(|| usage());
    args.drain(at..at + 2);
    Some(value)
}

/// Runs `clients` clients at once and prints their row; returns their aggregate tok/s.
fn level(url: &str, model: &str, clients: usize, tokens: (u32, u32)) -> f64 {
    let start = Instant::now();
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
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
    let tok_s = sent as f64 / all_sending.as_secs_f64().max(1e-9);
    println!(
        "{clients:>7}  {:>8}  {:>5.1}  {:>5.1}  {:>11.0}  {:>11.0}  {:>10.1}  {:>10.1}  {:>4}  {:>6}",
        all.first_token.len(),
        tok_s,
        all.tokens as f64 / elapsed,
        percentile(&mut all.first_token, 0.50),
        percentile(&mut all.first_token, 0.99),
        percentile(&mut all.gaps, 0.50),
        percentile(&mut all.gaps, 0.99),
        all.refused,
        all.errors,
    );
    tok_s
}

/// Per level over the rounds: the median tok/s, and the median of each round's ratio to the
/// first level's tok/s in the same round. On a machine whose speed drifts, a ratio of levels
/// run minutes apart moves with the drift; levels run in turns and paired by round do not.
fn summary(levels: &[usize], runs: &[Vec<f64>]) {
    println!(
        "clients  median tok/s (min-max)   median x {} client(s) (min-max)",
        levels[0]
    );
    for (i, clients) in levels.iter().enumerate() {
        let tok_s: Vec<f64> = runs.iter().map(|round| round[i]).collect();
        let ratios: Vec<f64> = runs.iter().map(|round| round[i] / round[0]).collect();
        let (t, r) = (spread(tok_s), spread(ratios));
        println!(
            "{clients:>7}  {:>6.1} ({:.1}-{:.1})  {:>17.2}x ({:.2}-{:.2})",
            t.0, t.1, t.2, r.0, r.1, r.2
        );
    }
}

/// Median, min and max.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = match n % 2 {
        1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    };
    (median, values[0], values[n - 1])
}

fn usage() -> ! {
    eprintln!("usage: streamgen [--tokens MIN-MAX] [--rounds N] BASE_URL MODEL CONCURRENCY...");
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
