//! A small closed-loop load generator for `lmhost serve`: N clients each send chat requests
//! back to back for a fixed time; prints requests/s and p50/p99 latency per concurrency level.
//!
//! ```text
//! cargo run --release --example loadgen -- http://127.0.0.1:8000 mock-model 1 8 64
//! ```
//! (`scripts/bench-serve` starts the server and runs this.) Blocking clients on threads keep
//! it dependency-light; on loopback against a mock backend it measures the server's overhead.

use std::time::{Duration, Instant};

const SECONDS_PER_LEVEL: u64 = 5;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: loadgen BASE_URL MODEL CONCURRENCY...");
        std::process::exit(2);
    }
    let url = format!("{}/v1/chat/completions", args[0].trim_end_matches('/'));
    let model = args[1].clone();
    let levels: Vec<usize> = args[2..]
        .iter()
        .map(|a| a.parse().unwrap_or_else(|_| panic!("not a number: {a}")))
        .collect();
    println!("clients  requests  req/s     p50 ms   p99 ms   503s  errors");
    for clients in levels {
        let (latencies, refused, errors, elapsed) = run(&url, &model, clients);
        let mut sorted = latencies.clone();
        sorted.sort();
        let pct = |p: f64| {
            sorted
                .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "{clients:>7}  {:>8}  {:>8.0}  {:>7.2}  {:>7.2}  {refused:>4}  {errors:>6}",
            latencies.len(),
            latencies.len() as f64 / elapsed.as_secs_f64(),
            pct(0.50),
            pct(0.99),
        );
    }
}

/// Runs `clients` closed-loop clients; returns successful latencies, 503s, other failures and
/// the wall time.
fn run(url: &str, model: &str, clients: usize) -> (Vec<Duration>, usize, usize, Duration) {
    let deadline = Instant::now() + Duration::from_secs(SECONDS_PER_LEVEL);
    let start = Instant::now();
    let results: Vec<(Vec<Duration>, usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .into();
                    let (mut ok, mut refused, mut errors) = (Vec::new(), 0, 0);
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let body = format!(
                            r#"{{"model":"{model}","messages":[{{"role":"user","content":"client {c} request {i} says hello"}}],"max_tokens":8}}"#
                        );
                        i += 1;
                        let sent = Instant::now();
                        match agent
                            .post(url)
                            .header("Content-Type", "application/json")
                            .send(&body)
                        {
                            Ok(mut r) if r.status() == 200 => {
                                let _ = r.body_mut().read_to_string();
                                ok.push(sent.elapsed());
                            }
                            Ok(r) if r.status() == 503 => refused += 1,
                            _ => errors += 1,
                        }
                    }
                    (ok, refused, errors)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let elapsed = start.elapsed();
    let mut latencies = Vec::new();
    let (mut refused, mut errors) = (0, 0);
    for (ok, r, e) in results {
        latencies.extend(ok);
        refused += r;
        errors += e;
    }
    (latencies, refused, errors, elapsed)
}
