//! The phase a pass runs in: a generation's passes use the decode copies; every other pass
//! (prefill, scoring) the prefill copy. A thread-local flag, with pollers that keep the pool
//! warm through a decode pass's many short ops.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    /// Whether this thread is inside [`generating`].
    static GENERATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` in the generation phase: linear layers in their decode format (where they have
/// one), and a pass of single rows attends through
/// [`crate::attention::Attention::forward_rows`]. Only a generation's passes run here: a pass
/// that scores must not, however few rows it has. The pool's other workers poll for `f`'s jobs
/// until it ends ([`keep_pool_warm`]).
pub fn generating<R>(f: impl FnOnce() -> R) -> R {
    keep_pool_warm(|| in_phase(true, f))
}

/// Runs `f`, a share of the rows of a pass already inside [`generating`] that another pool
/// thread may have taken, in the generation phase, without pollers of its own.
pub fn generating_share<R>(f: impl FnOnce() -> R) -> R {
    in_phase(true, f)
}

/// Runs `f` (on a pool worker, outside a decode pass) with a job on each other worker that
/// runs the pool's queued jobs, yielding the core between them, until `f` ends. A decode pass
/// is dozens of short parallel ops a layer (matrices of a few hundred KB, attention) with
/// microseconds of serial work between them, where rayon's idle workers yield and then sleep,
/// and waking one can take longer than a small matrix (`bench_batch` shows it on an 8-row
/// pass). `f` never waits for the pollers, so a long job one of them
/// picked up from another caller delays only that worker, as without them.
fn keep_pool_warm<R>(f: impl FnOnce() -> R) -> R {
    if rayon::current_thread_index().is_none() || GENERATING.get() {
        return f();
    }
    /// Ends the pollers however `f` ends, a panic included.
    struct Done(Arc<AtomicBool>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let done = Done(Arc::new(AtomicBool::new(false)));
    let owner = rayon::current_thread_index();
    for _ in 1..rayon::current_num_threads() {
        let done = done.0.clone();
        rayon::spawn(move || {
            // This thread, waiting inside `f`, may run a poller no other worker took: `f`
            // cannot end under it, so it must not poll.
            if rayon::current_thread_index() == owner {
                return;
            }
            while !done.load(Ordering::Acquire) {
                if rayon::yield_now() != Some(rayon::Yield::Executed) {
                    std::thread::yield_now();
                }
            }
        });
    }
    f()
}

/// Runs `f` outside the decode phase, whatever this thread was doing. Every other job on the
/// compute pool starts here: a pool thread waiting inside a decode pass's parallel op runs
/// other queued jobs (rayon's work stealing), and a prompt run that way must not inherit the
/// phase, or its result would depend on timing.
pub fn prefilling<R>(f: impl FnOnce() -> R) -> R {
    in_phase(false, f)
}

fn in_phase<R>(generating: bool, f: impl FnOnce() -> R) -> R {
    /// Puts the outer phase back however `f` ends, a caught panic included: the pool thread
    /// goes on to serve other calls.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GENERATING.set(self.0);
        }
    }
    let _restore = Restore(GENERATING.replace(generating));
    f()
}

/// Whether this thread is inside [`generating`].
pub fn is_generating() -> bool {
    GENERATING.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode pass whose own thread, waiting inside it (here for another pool), runs the
    /// pass's poller because no other worker is free to take it, still ends.
    #[test]
    fn a_decode_pass_ends_when_its_own_thread_runs_its_poller() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let other = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (started, busy) = std::sync::mpsc::channel();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            let _ = started.send(());
            let _ = blocked.recv();
        });
        busy.recv().unwrap();
        let (finished, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = finished.send(pool.install(|| generating(|| other.install(|| 7))));
        });
        let got = ended.recv_timeout(std::time::Duration::from_secs(60));
        let _ = release.send(());
        assert_eq!(got, Ok(7));
    }
}
