//! Continuous batching of decode steps: concurrent generations share forward passes.
//!
//! Decode is memory-bound: a pass reads every weight once whether it carries one row or eight,
//! and most of the rest of its cost is per pass, not per row. So a generation that wants its
//! next token queues its step here, and the first waiting thread to find no pass running takes
//! every step queued so far, runs them as one packed pass (each sequence against its own KV
//! state) and hands each its logits. Sequences join and leave between passes: a request that
//! arrives mid-way joins the next pass, one that finishes simply stops queueing. No thread of
//! its own: the callers take turns leading.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard};

use lmhost_plugin_api::{lock_or_reset, PluginError};

use crate::kv::KvState;
use crate::models::{CausalLm, Seq};
use crate::weights;

/// One decode step: the token to run and the state it follows.
struct Step {
    id: u64,
    token: u32,
    kv: KvState,
}

/// What a step gives back: its state, one position longer, and the next token's logits.
type Stepped = Result<(KvState, Vec<f32>), PluginError>;

#[derive(Default)]
struct Steps {
    queued: Vec<Step>,
    done: HashMap<u64, Stepped>,
    running: bool,
    next_id: u64,
    /// Passes run and steps they carried, for the batch-size figures in `stats`.
    passes: u64,
    stepped: u64,
}

/// The decode steps of every generation of one model.
#[derive(Default)]
pub struct Batcher {
    steps: Mutex<Steps>,
    changed: Condvar,
}

impl Batcher {
    /// Runs `token` after `kv` in the next pass (on `pool`), packed with whatever other
    /// generations are stepping then. Call it from outside `pool`: the wait for a pass must not
    /// hold one of the threads the pass runs on.
    pub fn step(
        &self,
        pool: &rayon::ThreadPool,
        model: &dyn CausalLm,
        token: u32,
        kv: KvState,
    ) -> Stepped {
        let mut steps = self.lock();
        let id = steps.next_id;
        steps.next_id += 1;
        steps.queued.push(Step { id, token, kv });
        loop {
            if let Some(result) = steps.done.remove(&id) {
                return result;
            }
            if steps.running {
                steps = self
                    .changed
                    .wait(steps)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            // Lead: run everything queued (this step among it) as one pass. A pass that panics
            // fails its steps, and batching goes on.
            steps.running = true;
            let batch = std::mem::take(&mut steps.queued);
            drop(steps);
            let ids: Vec<u64> = batch.iter().map(|s| s.id).collect();
            let pass = AssertUnwindSafe(|| pool.install(|| run(model, batch)));
            let results = catch_unwind(pass).unwrap_or_else(|_| {
                let failed = || Err(PluginError::internal("a decode pass panicked"));
                ids.into_iter().map(|id| (id, failed())).collect()
            });
            steps = self.lock();
            steps.passes += 1;
            steps.stepped += results.len() as u64;
            steps.done.extend(results);
            steps.running = false;
            self.changed.notify_all();
        }
    }

    /// Passes run and the steps they carried (their ratio is the mean batch size).
    pub fn counts(&self) -> (u64, u64) {
        let steps = self.lock();
        (steps.passes, steps.stepped)
    }

    /// The queue; should a panic ever poison it, the steps queued fail rather than wait
    /// forever, and batching goes on.
    fn lock(&self) -> MutexGuard<'_, Steps> {
        lock_or_reset(&self.steps, |steps| {
            steps.running = false;
            for step in steps.queued.drain(..) {
                steps.done.insert(
                    step.id,
                    Err(PluginError::internal("a decode pass panicked")),
                );
            }
        })
    }
}

/// One packed pass over `batch`, in the decode phase (the stored blocks through our kernels).
fn run(model: &dyn CausalLm, mut batch: Vec<Step>) -> Vec<(u64, Stepped)> {
    let tokens: Vec<[u32; 1]> = batch.iter().map(|s| [s.token]).collect();
    let mut seqs: Vec<Seq<'_>> = batch
        .iter_mut()
        .zip(&tokens)
        .map(|(step, ids)| Seq {
            ids,
            kv: &mut step.kv,
            share: None,
            logits_from: 0,
        })
        .collect();
    let out = weights::decoding(|| model.forward_packed(&mut seqs, false));
    drop(seqs);
    let rows = out.map_err(|e| PluginError::internal(format!("candle: {e}")));
    let rows: Vec<Result<Vec<f32>, PluginError>> = match rows {
        Ok((logits, _)) => logits
            .into_iter()
            .map(|l| {
                l.ok_or_else(|| PluginError::internal("no logits"))
                    .and_then(|t| {
                        t.flatten_all()
                            .and_then(|t| t.to_vec1::<f32>())
                            .map_err(|e| PluginError::internal(format!("candle: {e}")))
                    })
            })
            .collect(),
        Err(e) => batch.iter().map(|_| Err(e.clone())).collect(),
    };
    batch
        .into_iter()
        .zip(rows)
        .map(|(step, row)| (step.id, row.map(|row| (step.kv, row))))
        .collect()
}
