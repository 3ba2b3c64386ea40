//! Running a batch's prompts concurrently on a few worker threads, the way a backend serves
//! `score_batch` or `generate_batch` when its model (or server) batches concurrent requests
//! itself: candle packs concurrent generations' decode steps into shared passes, a vLLM server
//! batches concurrent HTTP requests.

use std::sync::atomic::{AtomicUsize, Ordering};

use lmhost_plugin_api::PluginError;

/// `f` of each item, in order, computed by up to `workers` threads that take the items in the
/// order given (so prompts sorted for prefix sharing run in that order). The batch fails whole:
/// the first error stops the workers taking more items and comes back naming its prompt.
pub fn each<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> Result<R, PluginError> + Sync,
) -> Result<Vec<R>, PluginError> {
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else {
                return done;
            };
            let result = f(item);
            if result.is_err() {
                next.store(items.len(), Ordering::Relaxed);
            }
            done.push((i, result));
        }
    };
    let mut results: Vec<Option<Result<R, PluginError>>> =
        std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..workers.clamp(1, items.len().max(1)))
            .map(|_| scope.spawn(work))
            .collect();
        for thread in threads {
            let done = thread
                .join()
                .map_err(|_| PluginError::internal("a batch worker thread panicked"))?;
            for (i, result) in done {
                results[i] = Some(result);
            }
        }
        Ok::<_, PluginError>(())
    })?;
    if let Some(i) = results.iter().position(|r| matches!(r, Some(Err(_)))) {
        if let Some(Some(Err(e))) = results.get_mut(i).map(Option::take) {
            return Err(PluginError::new(
                e.kind,
                format!("prompt {i} of the batch: {}", e.message),
            ));
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(PluginError::internal("a prompt was not run"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn results_come_back_in_the_items_order_from_several_threads() {
        let threads = Mutex::new(std::collections::HashSet::new());
        let items: Vec<u32> = (0..40).collect();
        let out = each(&items, 4, |&x| {
            threads.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(std::time::Duration::from_millis(u64::from(x % 3)));
            Ok(x * 2)
        })
        .unwrap();
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert!(
            threads.lock().unwrap().len() > 1,
            "one thread did all the work"
        );
    }

    #[test]
    fn the_batch_fails_whole_naming_the_prompt() {
        let items: Vec<u32> = (0..10).collect();
        let err = each(&items, 3, |&x| {
            if x == 6 {
                Err(PluginError::invalid_input("bad prompt"))
            } else {
                Ok(x)
            }
        })
        .unwrap_err();
        assert_eq!(err.message.as_str(), "prompt 6 of the batch: bad prompt");
        assert!(each(&[] as &[u32], 3, |&x| Ok(x)).unwrap().is_empty());
    }
}
