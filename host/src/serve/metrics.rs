//! Prometheus text metrics: requests by route and status, tokens, prefix-cache use and a
//! latency histogram. Counters are atomics or a small locked map, so recording never waits on a
//! backend; prefix-cache figures come from the backend's own stats at scrape time.

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

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    rejected: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
}

impl Metrics {
    pub fn record_request(&self, route: &str, status: u16, latency: Duration) {
        if let Ok(mut map) = self.requests.lock() {
            *map.entry((route.to_string(), status)).or_default() += 1;
        }
        let seconds = latency.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_micros
            .fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
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

    /// The exposition text, with the backend's cache counters and the current queue length.
    pub fn render(&self, stats: &BackendStats, in_flight: usize) -> String {
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
        let _ = writeln!(
            out,
            "# HELP lmhost_queue_in_flight Requests admitted and not finished.\n\
             # TYPE lmhost_queue_in_flight gauge\nlmhost_queue_in_flight {in_flight}"
        );
        out.push_str("# HELP lmhost_request_duration_seconds Request latency.\n");
        out.push_str("# TYPE lmhost_request_duration_seconds histogram\n");
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(
                out,
                "lmhost_request_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                load(bucket)
            );
        }
        let count = load(&self.latency_count);
        let _ = writeln!(
            out,
            "lmhost_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             lmhost_request_duration_seconds_sum {}\n\
             lmhost_request_duration_seconds_count {count}",
            load(&self.latency_micros) as f64 / 1e6
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
        let text = metrics.render(&BackendStats::default(), 0);
        assert!(
            text.contains("lmhost_requests_total{route=\"/v1/chat/completions\",status=\"503\"} 1")
        );
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"10\"} 1"));
        assert!(text.contains("lmhost_request_duration_seconds_bucket{le=\"+Inf\"} 2"));
    }
}
