//! Many servers of one model as one backend.
//!
//! An explanation is hundreds of prompts that share long prefixes, sorted so neighbours share
//! the most. Spread over servers one by one, every server would compute every prefix; here the
//! sorted prompts are cut into runs where neighbours share least (the top of the coalition
//! trie), each endpoint takes whole runs, and an idle endpoint takes the tail of the longest run
//! left, so each server's own prefix cache sees a coherent subtree.
//!
//! An endpoint that stops answering (its requests fail and `/models` no longer answers) is
//! marked down and its prompts go to the others; it is asked again at the next batch. An
//! endpoint that answers, even wrongly, keeps its answer: a wrong answer is an error, never a
//! silent retry elsewhere.

use std::collections::VecDeque;
use std::ops::Range;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use lmhost_plugin_api::{BackendStats, ErrorKind, Logger, PluginError};

use crate::abilities::Abilities;
use crate::client::Client;
use crate::flavor::Flavor;

/// One server of the cluster: how to reach it, what it offers, and what it computed.
pub struct Endpoint {
    pub client: Client,
    pub flavor: Flavor,
    pub abilities: Abilities,
    down: AtomicBool,
    stats: Mutex<BackendStats>,
}

/// Runs per endpoint the sorted prompts are cut into: enough that an endpoint that finishes
/// early finds whole runs left before it steals halves.
const RUNS_PER_ENDPOINT: usize = 4;

impl Endpoint {
    pub fn new(client: Client, flavor: Flavor, abilities: Abilities) -> Self {
        Endpoint {
            client,
            flavor,
            abilities,
            down: AtomicBool::new(false),
            stats: Mutex::default(),
        }
    }

    pub fn url(&self) -> &str {
        self.client.base_url()
    }

    /// Counts a request's prompt tokens, those the server's prefix cache served, and the
    /// tokens it generated.
    pub fn account(&self, prompt: u32, cached: u32, generated: usize) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.prompt_tokens += u64::from(prompt);
            stats.generated_tokens += generated as u64;
            stats.kv_cache_reused_tokens += u64::from(cached);
            stats.kv_cache_hits += u64::from(cached > 0);
            stats.kv_cache_misses += u64::from(cached == 0);
        }
    }

    pub fn stats(&self) -> BackendStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Whether a down endpoint answers again; it is then up.
    fn revived(&self, logger: &Logger) -> bool {
        if self.is_down() && self.client.alive() {
            self.down.store(false, Ordering::Relaxed);
            logger.info(&format!("endpoint {} answers again", self.url()));
        }
        !self.is_down()
    }
}

/// The endpoints, the first of which answers for the cluster where one must (its template).
pub struct Cluster {
    endpoints: Vec<Endpoint>,
    /// Whether prompts go in runs of shared prefixes (else one by one, to whichever endpoint
    /// is free).
    affinity: bool,
    logger: Logger,
}

impl Cluster {
    pub fn new(endpoints: Vec<Endpoint>, affinity: bool, logger: Logger) -> Self {
        assert!(!endpoints.is_empty(), "a cluster has an endpoint");
        Cluster {
            endpoints,
            affinity,
            logger,
        }
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    pub fn first(&self) -> &Endpoint {
        &self.endpoints[0]
    }

    /// `work` on endpoint `preferred` or, while the endpoint it ran on is down, on the next.
    pub fn call<T>(
        &self,
        preferred: usize,
        work: impl Fn(&Endpoint) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let n = self.endpoints.len();
        let mut failures = Vec::new();
        for endpoint in (0..n).map(|k| &self.endpoints[(preferred + k) % n]) {
            if !endpoint.revived(&self.logger) {
                continue;
            }
            match work(endpoint) {
                Ok(value) => return Ok(value),
                Err(e) if !self.went_down(endpoint, &e) => return Err(e),
                Err(e) => failures.push(e),
            }
        }
        Err(self.all_down(&failures))
    }

    /// `work` on every item `0..n`, in runs cut where neighbours share least (`shared()[i]`:
    /// what item `i` shares with item `i - 1`, asked only where there are endpoints to share
    /// the runs out to), each endpoint running as many at once as its client allows. The
    /// results come back in item order.
    pub fn each_by_affinity<T: Send>(
        &self,
        n: usize,
        shared: impl FnOnce() -> Vec<usize>,
        work: impl Fn(&Endpoint, usize) -> Result<T, PluginError> + Sync,
    ) -> Result<Vec<T>, PluginError> {
        let up: Vec<usize> = (0..self.endpoints.len())
            .filter(|&e| self.endpoints[e].revived(&self.logger))
            .collect();
        if up.is_empty() {
            return Err(self.all_down(&[]));
        }
        let runs = match (self.endpoints.len(), self.affinity) {
            // One endpoint takes the items in their order: nothing to cut.
            (1, _) => cut(n, 1, |_| 0),
            (_, false) => cut(n, n, |_| 0),
            (endpoints, true) => {
                let shared = shared();
                cut(n, endpoints * RUNS_PER_ENDPOINT, |i| shared[i])
            }
        };
        let schedule = Schedule {
            board: Mutex::new(Board::new(runs, self.endpoints.len(), n)),
            changed: Condvar::new(),
        };
        std::thread::scope(|scope| {
            for &e in &up {
                let endpoint = &self.endpoints[e];
                for _ in 0..endpoint.client.concurrency() {
                    let (schedule, work) = (&schedule, &work);
                    scope.spawn(move || self.worker(e, schedule, work));
                }
            }
        });
        let board = schedule.board.into_inner().map_err(|_| {
            PluginError::internal("a request to the cluster panicked while holding its schedule")
        })?;
        let mut out = Vec::with_capacity(n);
        for (i, result) in board.results.into_iter().enumerate() {
            match result {
                Some(result) => out.push(result?),
                None => {
                    let scored = board.done;
                    return Err(self.all_down(&[PluginError::unavailable(format!(
                        "prompt {i} and others were left ({scored} of {n} done)"
                    ))]));
                }
            }
        }
        Ok(out)
    }

    /// One of endpoint `e`'s workers: takes the next item until none is left or in flight
    /// elsewhere (an endpoint that goes down gives its items back), or its endpoint is down
    /// (then the item goes back for another endpoint).
    fn worker<T>(
        &self,
        e: usize,
        schedule: &Schedule<T>,
        work: &(impl Fn(&Endpoint, usize) -> Result<T, PluginError> + Sync),
    ) {
        let endpoint = &self.endpoints[e];
        let Ok(mut board) = schedule.board.lock() else {
            return;
        };
        loop {
            if endpoint.is_down() {
                return;
            }
            let Some(i) = board.next(e) else {
                if board.in_flight == 0 {
                    return;
                }
                board = match schedule.changed.wait(board) {
                    Ok(board) => board,
                    Err(_) => return,
                };
                continue;
            };
            board.in_flight += 1;
            drop(board);
            // A panic is this item's error: it must not leave the others waiting for it.
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| work(endpoint, i)))
                .unwrap_or_else(|_| {
                    Err(PluginError::internal(format!(
                        "scoring prompt {i} on {} panicked",
                        endpoint.url()
                    )))
                });
            let up = match &result {
                Err(error) => !self.went_down(endpoint, error),
                Ok(_) => true,
            };
            board = match schedule.board.lock() {
                Ok(board) => board,
                Err(_) => return,
            };
            board.in_flight -= 1;
            match up {
                true => board.finish(i, result),
                false => board.give_back(e, i),
            }
            schedule.changed.notify_all();
        }
    }

    /// Whether `endpoint`, whose request failed with `error`, went down: it is one of several,
    /// the failure is the kind a dead server gives (no connection, a timeout, a 5xx) and its
    /// `/models` no longer answers. Then it is marked down. Otherwise the failure was its
    /// answer, which stands (one endpoint alone keeps every error as it was).
    fn went_down(&self, endpoint: &Endpoint, error: &PluginError) -> bool {
        if self.endpoints.len() < 2
            || error.kind != ErrorKind::BackendUnavailable
            || endpoint.client.alive()
        {
            return false;
        }
        if !endpoint.down.swap(true, Ordering::Relaxed) {
            self.logger.warn(&format!(
                "endpoint {} is down ({}); its prompts go to the other endpoints",
                endpoint.url(),
                error.message
            ));
        }
        true
    }

    /// The error when no endpoint could take a request: each endpoint and why.
    fn all_down(&self, failures: &[PluginError]) -> PluginError {
        let urls: Vec<&str> = self.endpoints.iter().map(Endpoint::url).collect();
        let why: Vec<&str> = failures.iter().map(|f| f.message.as_str()).collect();
        PluginError::unavailable(format!(
            "no endpoint answers ({}){}; start one, or remove the dead ones from `base_urls` \
             (what was computed is kept in the run directory)",
            urls.join(", "),
            match why.is_empty() {
                true => String::new(),
                false => format!(": {}", why.join("; ")),
            }
        ))
    }
}

/// The board and a signal that it changed (an item finished or came back).
struct Schedule<T> {
    board: Mutex<Board<T>>,
    changed: Condvar,
}

/// What is left to do and what is done, shared by the workers.
struct Board<T> {
    /// Whole runs no endpoint has started.
    queue: VecDeque<Range<usize>>,
    /// Per endpoint, the rest of the run it is on.
    current: Vec<Range<usize>>,
    /// Items an endpoint that went down gave back, taken before anything else.
    returned: Vec<usize>,
    results: Vec<Option<Result<T, PluginError>>>,
    done: usize,
    /// Items being worked on.
    in_flight: usize,
}

impl<T> Board<T> {
    fn new(runs: Vec<Range<usize>>, endpoints: usize, n: usize) -> Self {
        Board {
            queue: runs.into(),
            current: vec![0..0; endpoints],
            returned: Vec::new(),
            results: (0..n).map(|_| None).collect(),
            done: 0,
            in_flight: 0,
        }
    }

    /// Endpoint `e`'s next item: one given back, the next of its run, the first of a new run,
    /// or the tail half of the longest run another endpoint is on.
    fn next(&mut self, e: usize) -> Option<usize> {
        if let Some(i) = self.returned.pop() {
            return Some(i);
        }
        if self.current[e].is_empty() {
            self.current[e] = match self.queue.pop_front() {
                Some(run) => run,
                None => self.steal()?,
            };
        }
        self.current[e].next()
    }

    /// The tail half of the longest run in progress, taken from its endpoint.
    fn steal(&mut self) -> Option<Range<usize>> {
        let longest = (0..self.current.len()).max_by_key(|&k| self.current[k].len())?;
        let run = &mut self.current[longest];
        if run.len() < 2 {
            return None;
        }
        let middle = run.start + run.len() / 2;
        let tail = middle..run.end;
        run.end = middle;
        Some(tail)
    }

    fn finish(&mut self, i: usize, result: Result<T, PluginError>) {
        self.results[i] = Some(result);
        self.done += 1;
    }

    /// Item `i` and the rest of endpoint `e`'s run, back for the other endpoints.
    fn give_back(&mut self, e: usize, i: usize) {
        self.returned.push(i);
        let rest = std::mem::replace(&mut self.current[e], 0..0);
        if !rest.is_empty() {
            self.queue.push_front(rest);
        }
    }
}

/// `0..n` cut into at most `pieces` runs, where neighbours share least: before the items whose
/// `shared` with their predecessor is smallest (the earliest of equals).
fn cut(n: usize, pieces: usize, shared: impl Fn(usize) -> usize) -> Vec<Range<usize>> {
    let mut points: Vec<usize> = (1..n).collect();
    points.sort_by_key(|&i| (shared(i), i));
    points.truncate(pieces.saturating_sub(1));
    points.sort_unstable();
    let bounds = std::iter::once(0).chain(points).chain(std::iter::once(n));
    let bounds: Vec<usize> = bounds.collect();
    (bounds.windows(2))
        .map(|w| w[0]..w[1])
        .filter(|r| !r.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_where_neighbours_share_least() {
        // Prefix lengths shared with the previous item: two subtrees, 0..3 and 3..6.
        let shared = [0, 9, 8, 1, 9, 7];
        assert_eq!(cut(6, 2, |i| shared[i]), [0..3, 3..6]);
        assert_eq!(cut(6, 3, |i| shared[i]), [0..3, 3..5, 5..6]);
        assert_eq!(cut(6, 100, |i| shared[i]).len(), 6);
        assert_eq!(cut(0, 4, |_| 0), Vec::<Range<usize>>::new());
    }

    #[test]
    fn an_idle_endpoint_takes_whole_runs_then_the_tail_of_the_longest() {
        let mut board: Board<()> = Board::new(vec![0..4, 4..10], 2, 10);
        assert_eq!(board.next(0), Some(0));
        assert_eq!(board.next(1), Some(4));
        // Endpoint 1's run is the longest left: endpoint 0, out of work, takes its tail half.
        board.current[0] = 0..0;
        assert_eq!(board.next(0), Some(7));
        assert_eq!(board.current[1], 5..7);
        assert_eq!(board.next(1), Some(5));
        // Given back, an item goes first to whoever asks next; the rest of the run is queued.
        board.give_back(1, 5);
        assert_eq!(board.next(0), Some(5));
        assert_eq!(board.queue.front(), Some(&(6..7)));
    }

    #[test]
    fn a_panicking_item_is_an_error_not_a_hang() {
        let client = Client::new(
            crate::client::ClientConfig {
                base_url: "http://127.0.0.1:9/v1".into(),
                api_key: None,
                timeout: std::time::Duration::from_secs(1),
                max_retries: 0,
                concurrency: 3,
                backoff: std::time::Duration::ZERO,
            },
            Logger::discard(),
        );
        let endpoint = Endpoint::new(client, Flavor::Lmhost, Abilities::of(Flavor::Lmhost));
        let cluster = Cluster::new(vec![endpoint], true, Logger::discard());
        let outcome = cluster.each_by_affinity(
            8,
            || vec![0; 8],
            |_, i| match i {
                3 => panic!("item 3"),
                i => Ok(i),
            },
        );
        let err = outcome.unwrap_err();
        assert!(
            err.message
                .contains("scoring prompt 3 on http://127.0.0.1:9/v1 panicked"),
            "{err}"
        );
        let fine = cluster
            .each_by_affinity(8, || vec![0; 8], |_, i| Ok(i * 2))
            .unwrap();
        assert_eq!(fine, [0, 2, 4, 6, 8, 10, 12, 14]);
    }
}
