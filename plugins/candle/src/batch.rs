//! Continuous batching of decode steps: concurrent generations share forward passes.
//!
//! Decode is memory-bound: a pass reads every weight once whether it carries one row or eight,
//! and most of the rest of its cost is per pass, not per row. So a generation that wants its
//! next token queues its step here, and a waiting thread that finds no pass running takes
//! every step queued so far, runs them as one packed pass (each sequence against its own KV
//! state) and hands each its logits. Sequences join and leave between passes: a request that
//! arrives mid-way joins the next pass, one that finishes leaves. No thread of its own: the
//! callers take turns leading.
//!
//! After a pass, every generation samples its token before queueing the next step, so the
//! first to queue would find no pass running and lead alone, and the passes would alternate
//! one row and the rest (3.5 rows a pass on average for 8 generations on SmolLM2). So a pass
//! starts once every generation decoding now ([`Batcher::join`]) has queued, or [`LINGER`]
//! after its first step was queued, whichever comes first. And a pass does not start while a
//! new generation's prompt runs ([`Batcher::prompt`], up to [`YIELD`]), which keeps time to
//! first token near one request's.
//!
//! Prompts that arrive together are run together too ([`Prompts`]): where prompts run f32
//! GEMM, a short prompt's pass reads every prefill weight (540 MB on SmolLM2) for a few rows,
//! so eight prompts in one packed pass cost little more than one, where one after another
//! they would stall decoding eight times as long. Through the stored blocks (where the kernels
//! have AVX2 or AVX-512) a pass costs about its rows instead, and grouping spares only the
//! weight reads; groups of at most two cut the median time to first token at 8 clients but
//! raised its tail, so the groups stay whole.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use lmhost_plugin_api::{lock_or_reset, ConversationSnapshot, PluginError};
use rayon::prelude::*;

use crate::engine::Prefilled;
use crate::kernels::ROWS;
use crate::kv::KvState;
use crate::models::{CausalLm, Seq};
use crate::weights;

/// The longest a queued step waits for the other generations' steps before its pass starts
/// anyway: several times what sampling a token takes, far less than a pass.
pub const LINGER: Duration = Duration::from_millis(5);

/// The longest decode passes pause for prompts running on the pool: long enough for a chat
/// turn's prompt, short enough that a stream of new requests cannot stall the running ones.
pub const YIELD: Duration = Duration::from_millis(250);

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
    /// When the steps in `queued` could first have run: the oldest one's queueing, or the end
    /// of the pass that was running then.
    since: Option<Instant>,
    /// Generations between [`Batcher::join`] and the end of their [`Member`].
    active: usize,
    /// Prompts inside [`Batcher::prompt`].
    prompts: usize,
    next_id: u64,
    /// Passes run and steps they carried, for the batch-size figures in `stats`.
    passes: u64,
    stepped: u64,
}

impl Steps {
    /// How much longer the queued steps wait before a pass: for the generations that have
    /// not queued yet (up to [`LINGER`]), and for prompts running now (up to [`YIELD`]).
    fn wait(&self) -> Duration {
        let Some(since) = self.since else {
            return Duration::ZERO;
        };
        let waited = since.elapsed();
        let for_steps = if self.queued.len() >= self.active {
            Duration::ZERO
        } else {
            LINGER.saturating_sub(waited)
        };
        let for_prompts = if self.prompts > 0 {
            YIELD.saturating_sub(waited)
        } else {
            Duration::ZERO
        };
        for_steps.max(for_prompts)
    }
}

/// The decode steps of every generation of one model.
#[derive(Default)]
pub struct Batcher {
    steps: Mutex<Steps>,
    changed: Condvar,
}

/// A generation in its decode loop: passes wait for its steps (up to [`LINGER`]) until this
/// is dropped.
pub struct Member<'a>(&'a Batcher);

impl Drop for Member<'_> {
    fn drop(&mut self) {
        // A leader waiting for this generation's step stops waiting.
        self.0
            .update(|steps| steps.active = steps.active.saturating_sub(1));
    }
}

impl Batcher {
    /// Counts a generation as decoding until the returned member is dropped.
    pub fn join(&self) -> Member<'_> {
        self.lock().active += 1;
        Member(self)
    }

    /// Runs a new generation's prompt with decode passes paused (up to [`YIELD`]), so that it
    /// has the pool to itself: without it, its prompt shares the cores with passes of every
    /// running generation, and time to first token grows with their number.
    pub fn prompt<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Running<'a>(&'a Batcher);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0
                    .update(|steps| steps.prompts = steps.prompts.saturating_sub(1));
            }
        }
        self.lock().prompts += 1;
        let _running = Running(self);
        f()
    }

    /// Changes the queue's counts and wakes the waiting steps to look again.
    fn update(&self, change: impl FnOnce(&mut Steps)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

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
        steps.since.get_or_insert_with(Instant::now);
        // No one is woken: the step that completes the queue leads its pass itself.
        loop {
            if let Some(result) = steps.done.remove(&id) {
                return result;
            }
            let wait = steps.wait();
            if steps.running || !wait.is_zero() {
                steps = if steps.running {
                    self.changed
                        .wait(steps)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                } else {
                    self.changed
                        .wait_timeout(steps, wait)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                };
                continue;
            }
            // Lead: run everything queued (this step among it) as one pass. A pass that panics
            // fails its steps, and batching goes on.
            steps.running = true;
            steps.since = None;
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
            // Steps queued during the pass wait from now for those it just answered.
            steps.since = (!steps.queued.is_empty()).then(Instant::now);
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
            steps.since = None;
            for step in steps.queued.drain(..) {
                steps.done.insert(
                    step.id,
                    Err(PluginError::internal("a decode pass panicked")),
                );
            }
        })
    }
}

struct Queued<T> {
    prompts: Vec<(u64, ConversationSnapshot)>,
    done: HashMap<u64, Result<T, PluginError>>,
    running: bool,
    next_id: u64,
}

/// The prompts of concurrent generations: whoever finds no prompt pass running takes the first
/// [`ROWS`] queued prompts and runs them as one packed pass (and leads again while its own has
/// not run); the others wait for their states. No waiting to gather them: prompts queued while
/// a pass runs make up the next one. `T` is what a prompt leaves ([`Prefilled`] for the
/// engine's).
pub struct Prompts<T = Prefilled> {
    queued: Mutex<Queued<T>>,
    changed: Condvar,
}

impl<T> Default for Prompts<T> {
    fn default() -> Self {
        Prompts {
            queued: Mutex::new(Queued {
                prompts: Vec::new(),
                done: HashMap::new(),
                running: false,
                next_id: 0,
            }),
            changed: Condvar::new(),
        }
    }
}

impl<T> Prompts<T> {
    /// Runs `snapshot`'s prompt, packed by `run` with whatever prompts are queued with it.
    /// `run` answers each of a group in order; when it fails a whole group, each prompt runs
    /// alone, so that one bad prompt's error reaches only its own request.
    pub fn start(
        &self,
        snapshot: &ConversationSnapshot,
        run: impl Fn(&[ConversationSnapshot]) -> Result<Vec<T>, PluginError>,
    ) -> Result<T, PluginError> {
        let mut queued = self.lock();
        let id = queued.next_id;
        queued.next_id += 1;
        queued.prompts.push((id, snapshot.clone()));
        loop {
            if let Some(result) = queued.done.remove(&id) {
                return result;
            }
            if queued.running {
                queued = self
                    .changed
                    .wait(queued)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            queued.running = true;
            let take = queued.prompts.len().min(ROWS);
            let (ids, group): (Vec<u64>, Vec<ConversationSnapshot>) =
                queued.prompts.drain(..take).unzip();
            drop(queued);
            let (results, panic) =
                match catch_unwind(AssertUnwindSafe(|| answer_each(&group, &run))) {
                    Ok(results) => (results, None),
                    Err(payload) => {
                        let failed = || Err(PluginError::internal("a prompt pass panicked"));
                        (group.iter().map(|_| failed()).collect(), Some(payload))
                    }
                };
            let mine = ids.contains(&id);
            queued = self.lock();
            queued.done.extend(ids.into_iter().zip(results));
            queued.running = false;
            self.changed.notify_all();
            // The others of the group fail with an error; the leader's own call panics on, as
            // it would have alone (the plugin boundary reports it with its message).
            if let (Some(payload), true) = (panic, mine) {
                queued.done.remove(&id);
                drop(queued);
                std::panic::resume_unwind(payload);
            }
        }
    }

    /// The queue; should a panic ever poison it, the prompts queued fail rather than wait
    /// forever.
    fn lock(&self) -> MutexGuard<'_, Queued<T>> {
        lock_or_reset(&self.queued, |queued| {
            queued.running = false;
            for (id, _) in queued.prompts.drain(..) {
                queued
                    .done
                    .insert(id, Err(PluginError::internal("a prompt pass panicked")));
            }
        })
    }
}

/// `run` over `group`, one result per prompt: the group's, or each prompt's alone when the
/// group fails.
fn answer_each<T>(
    group: &[ConversationSnapshot],
    run: &impl Fn(&[ConversationSnapshot]) -> Result<Vec<T>, PluginError>,
) -> Vec<Result<T, PluginError>> {
    match run(group) {
        Ok(started) if started.len() == group.len() => started.into_iter().map(Ok).collect(),
        Ok(_) => group
            .iter()
            .map(|_| Err(PluginError::internal("a prompt pass lost a prompt")))
            .collect(),
        Err(e) if group.len() == 1 => vec![Err(e)],
        Err(_) => group
            .iter()
            .map(|one| {
                run(std::slice::from_ref(one))?
                    .pop()
                    .ok_or_else(|| PluginError::internal("no prompt state"))
            })
            .collect(),
    }
}

/// One packed pass over `batch`, in the decode phase (the stored blocks through our kernels).
fn run(model: &dyn CausalLm, mut batch: Vec<Step>) -> Vec<(u64, Stepped)> {
    let out = decode_pass(model, batch.iter_mut().map(|s| (&mut s.kv, s.token)));
    let rows = out.map_err(|e| PluginError::internal(format!("candle: {e}")));
    let rows: Vec<Result<Vec<f32>, PluginError>> = match rows {
        Ok(logits) => logits
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

/// One packed decode pass: each token after its state (one position longer after it), in the
/// decode phase; each row's logits. What [`Batcher::step`] runs for the steps it packs.
pub fn decode_pass<'a>(
    model: &dyn CausalLm,
    rows: impl IntoIterator<Item = (&'a mut KvState, u32)>,
) -> candle_core::Result<Vec<Option<Tensor>>> {
    let (states, tokens): (Vec<&mut KvState>, Vec<[u32; 1]>) =
        rows.into_iter().map(|(kv, token)| (kv, [token])).unzip();
    let mut seqs: Vec<Seq<'_>> = states
        .into_iter()
        .zip(&tokens)
        .map(|(kv, ids)| Seq {
            ids,
            kv,
            share: None,
            logits_from: 0,
            hidden: None,
            sampled: true,
        })
        .collect();
    if seqs.len() <= ROWS {
        return weights::generating(|| model.forward_packed(&mut seqs, false))
            .map(|(logits, _)| logits);
    }
    // A kernel call carries at most `ROWS` activation rows, so a larger pass reads every
    // weight once per `ROWS` rows anyway; as passes of at most `ROWS` rows side by side, each
    // pool thread goes on with its own share where one pass would wait for the pool at every
    // op (`bench_batch` shows the difference at 16 rows). The pool no longer idles inside the
    // pass, so a prompt arriving then waits for its end: more tokens at 32 clients, a longer
    // median time to first token.
    let share = seqs.len().div_ceil(seqs.len().div_ceil(ROWS));
    let shares: Vec<Vec<Option<Tensor>>> = weights::generating(|| {
        seqs.par_chunks_mut(share)
            .map(|seqs| {
                weights::generating_share(|| model.forward_packed(seqs, false))
                    .map(|(logits, _)| logits)
            })
            .collect::<candle_core::Result<_>>()
    })?;
    Ok(shares.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A prompt's text, as the fake prompt pass answers it.
    fn text(s: &ConversationSnapshot) -> String {
        s.turns
            .iter()
            .flat_map(|t| t.messages.iter())
            .map(|m| m.text_content())
            .collect()
    }

    impl<T> Prompts<T> {
        fn waiting(&self) -> usize {
            self.lock().prompts.len()
        }
    }

    /// Prompts queued while a pass runs make up the next pass, one call, each prompt answered
    /// with its own result; a group that fails is retried one prompt at a time, so only the
    /// bad prompt's request sees the error.
    #[test]
    fn prompts_queued_during_a_pass_run_together_and_errors_stay_their_own() {
        let prompts = Prompts::<String>::default();
        let groups = Mutex::new(Vec::new());
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let run = |group: &[ConversationSnapshot]| {
            groups.lock().unwrap().push(group.len());
            if group.len() == 1 && text(&group[0]) == "first" {
                gate.lock().unwrap().recv().unwrap();
            }
            let texts: Vec<String> = group.iter().map(text).collect();
            match texts.iter().find(|t| t.contains("bad")) {
                Some(bad) => Err(PluginError::invalid_input(format!("refused `{bad}`"))),
                None => Ok(texts),
            }
        };
        let results: Vec<Result<String, PluginError>> = std::thread::scope(|s| {
            let first = s.spawn(|| prompts.start(&ConversationSnapshot::from_prompt("first"), run));
            while groups.lock().unwrap().is_empty() {
                std::thread::yield_now();
            }
            let others: Vec<_> = ["a", "bad b", "c"]
                .into_iter()
                .map(|t| {
                    let (prompts, run) = (&prompts, &run);
                    s.spawn(move || prompts.start(&ConversationSnapshot::from_prompt(t), run))
                })
                .collect();
            while prompts.waiting() < 3 {
                std::thread::yield_now();
            }
            release.send(()).unwrap();
            std::iter::once(first)
                .chain(others)
                .map(|t| t.join().unwrap())
                .collect()
        });
        // The first pass alone; the three queued behind it in one pass, which failed, then each.
        assert_eq!(*groups.lock().unwrap(), [1, 3, 1, 1, 1]);
        let texts: Vec<String> = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| e.message.to_string()))
            .collect();
        assert_eq!(texts, ["first", "a", "refused `bad b`", "c"]);
    }
}
