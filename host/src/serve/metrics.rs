//! Prometheus text metrics: requests by route and status, tokens, prefix-cache use, running and
//! waiting requests, and histograms of request latency, time to first token and inter-token
//! latency. Counters are atomics or a small locked map, so recording never waits on a backend;
//! prefix-cache figures come from the backend's own stats at scrape time (which backends answer
//! without waiting for a running call).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use lmhost_plugin_api::BackendStats;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// A cumulative histogram of durations over [`BUCKETS`].
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    micros: AtomicU64,
}

impl Histogram {
    fn record(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.micros
            .fetch_add(duration.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", load(bucket));
        }
        let count = load(&self.count);
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {}\n{name}_count {count}",
            load(&self.micros) as f64 / 1e6
        );
    }
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    rejected: AtomicU64,
    latency: Histogram,
    first_token: Histogram,
    inter_token: Histogram,
}

/// How many requests run on a worker and how many wait for one.
pub struct Load {
    pub running: usize,
    pub waiting: usize,
}

impl Metrics {
    pub fn record_request(&self, route: &str, status: u16, latency: Duration) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((route.to_string(), status)).or_default() += 1;
        }
        self.latency.record(latency);
    }

    /// A request's first generated token, `elapsed` after the request arrived.
    pub fn record_first_token(&self, elapsed: Duration) {
        self.first_token.record(elapsed);
    }

    /// The time between two generated tokens of one request.
    pub fn record_inter_token(&self, gap: Duration) {
        self.inter_token.record(gap);
    }

    pub fn record_tokens(&self, prompt: u32, completion: u32, cached: u32) {
        self.prompt_tokens
            .fetch_add(u64::from(prompt), Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(u64::from(completion), Ordering::Relaxed);
        self.cached_prompt_tokens
            .fetch_add(u64::from(cached), Ordering::Relaxed);
    }

    pub fn record_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text, with the backend's cache counters and the queue's load.
    pub fn render(&self, stats: &BackendStats, load_now: Load) -> String {
        let mut out = String::new();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("# HELP lmhost_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE lmhost_requests_total counter\n");
        if let Ok(map) = self.requests.lock() {
            for ((route, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "lmhost_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        let counters = [
            (
                "lmhost_prompt_tokens_total",
                "Prompt tokens processed.",
                load(&self.prompt_tokens),
            ),
            (
                "lmhost_completion_tokens_total",
                "Tokens generated.",
                load(&self.completion_tokens),
            ),
            (
                "lmhost_cached_prompt_tokens_total",
                "Prompt tokens the backend reported as served from its prefix cache.",
                load(&self.cached_prompt_tokens),
            ),
            (
                "lmhost_rejected_total",
                "Requests refused because the queue was full.",
                load(&self.rejected),
            ),
            (
                "lmhost_prefix_cache_hits_total",
                "Backend prefix-cache hits.",
                stats.kv_cache_hits,
            ),
            (
                "lmhost_prefix_cache_misses_total",
                "Backend prefix-cache misses.",
                stats.kv_cache_misses,
            ),
            (
                "lmhost_prefix_cache_reused_tokens_total",
                "Tokens the backend reused from its prefix cache.",
                stats.kv_cache_reused_tokens,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let Load { running, waiting } = load_now;
        let gauges = [
            (
                "lmhost_queue_in_flight",
                "Requests admitted and not finished.",
                running + waiting,
            ),
            (
                "lmhost_requests_running",
                "Requests running on a worker.",
                running,
            ),
            (
                "lmhost_requests_waiting",
                "Requests waiting for a worker.",
                waiting,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        self.latency.render(
            &mut out,
            "lmhost_request_duration_seconds",
            "Request latency.",
        );
        self.first_token.render(
            &mut out,
            "lmhost_time_to_first_token_seconds",
            "From a generation request's arrival to its first token.",
        );
        self.inter_token.render(
            &mut out,
            "lmhost_inter_token_latency_seconds",
            "Between consecutive tokens of one generation.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_counts_match() {
        let metrics = Metrics::default();
        metrics.record_request("/v1/chat/completions", 200, Duration::from_millis(3));
        metrics.record_request("/v1/chat/completions", 503, Duration::from_secs(20));
        metrics.record_first_token(Duration::from_millis(30));
        let idle = Load {
            running: 0,
            waiting: 0,
        };
        let text = metrics.render(&BackendStats::default(), idle);
        assert!(text.contains("lmhost_time_to_first_token_seconds_bucket{le=\"0.025\"} 0"));
        assert!(text.contains("lmhost_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"));
        assert!(
            text.contains("lmhost_requests_total{route=\"/v1/chat/completions\",status=\"503\"} 1")
        );
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"10\"} 1"));
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"+Inf\"} 2"));
    }
}
