//! The bounded, fair queue in front of the backend.
//!
//! Backend calls block, so they run on tokio's blocking threads, at most `workers` at once.
//! Requests beyond that wait in FIFO order (tokio's semaphore is fair), and at most `depth` may
//! wait: past that a request is refused at once (`503` + `Retry-After`) instead of piling up
//! memory and latency. The per-request timeout covers waiting and running; a call that times out
//! keeps its worker slot until the backend returns, because a blocking call cannot be cancelled,
//! so an overloaded server sheds load rather than starting more work than it has workers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::metrics::Load;

/// Why a queued call produced no value.
#[derive(Debug, PartialEq, Eq)]
pub enum QueueError {
    /// `workers + depth` requests are already admitted.
    Full,
    /// The call did not finish within the timeout.
    Timeout,
    /// The blocking task panicked (the plugin layer catches plugin panics; this is a host bug).
    Panicked,
}

pub struct Queue {
    workers: Arc<Semaphore>,
    worker_count: usize,
    admitted: Arc<AtomicUsize>,
    capacity: usize,
    timeout: Duration,
}

/// One admitted request; dropping it frees its place.
struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Queue {
    pub fn new(workers: usize, depth: usize, timeout: Duration) -> Self {
        let workers = workers.max(1);
        Queue {
            workers: Arc::new(Semaphore::new(workers)),
            worker_count: workers,
            admitted: Arc::new(AtomicUsize::new(0)),
            capacity: workers + depth,
            timeout,
        }
    }

    /// Requests admitted and not yet finished (running or waiting).
    pub fn in_flight(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }

    /// Requests running on a worker now, and those admitted and waiting for one.
    pub fn load(&self) -> Load {
        let admitted = self.in_flight();
        let running = (self.worker_count - self.workers.available_permits()).min(admitted);
        Load {
            running,
            waiting: admitted - running,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `f` on a blocking thread once a worker is free, in arrival order.
    pub async fn run<T, F>(&self, f: F) -> Result<T, QueueError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let ticket = self.admit()?;
        let workers = self.workers.clone();
        let work = async move {
            let permit = workers
                .acquire_owned()
                .await
                .map_err(|_| QueueError::Panicked)?;
            tokio::task::spawn_blocking(move || {
                let _held = (permit, ticket);
                f()
            })
            .await
            .map_err(|_| QueueError::Panicked)
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| QueueError::Timeout)?
    }

    fn admit(&self) -> Result<Ticket, QueueError> {
        let capacity = self.capacity;
        self.admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < capacity).then_some(n + 1)
            })
            .map(|_| Ticket(self.admitted.clone()))
            .map_err(|_| QueueError::Full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[tokio::test]
    async fn refuses_beyond_workers_plus_depth_and_recovers() {
        let queue = Arc::new(Queue::new(1, 1, Duration::from_secs(60)));
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(std::sync::Mutex::new(gate));
        let mut running = Vec::new();
        for _ in 0..2 {
            let (queue, gate) = (queue.clone(), gate.clone());
            running.push(tokio::spawn(async move {
                queue
                    .run(move || gate.lock().map(|g| g.recv().is_ok()).unwrap_or(false))
                    .await
            }));
        }
        while queue.in_flight() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(queue.run(|| ()).await, Err(QueueError::Full));
        release.send(()).unwrap();
        release.send(()).unwrap();
        for task in running {
            assert_eq!(task.await.unwrap(), Ok(true));
        }
        assert_eq!(queue.in_flight(), 0);
        assert_eq!(queue.run(|| 7).await, Ok(7));
    }
}
