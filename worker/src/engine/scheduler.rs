//! The engine thread's loop: up to `Backend::max_sequences` jobs run at once
//! (one unless `--parallel N`), stepped together in rounds (`round.rs`). Jobs
//! join at the start of a round and leave at its end; a job's sequence
//! closes at once.
//!
//! A job whose KV cache would not fit beside the running ones
//! (`Backend::has_room`) waits, first in line, until one of them ends; it
//! never fails for want of room while others run. Alone, it opens its
//! sequence and fails there if the memory cannot be had.

use std::time::Duration;

use crate::backend::BackendError;
use crate::engine::error::{JobError, Phase};
use crate::engine::generate::{AbortReason, GenerationObserver, GenerationSummary};
use crate::engine::job::Job;
use crate::engine::ledger::Outcome;
use crate::engine::queue::Pop;
use crate::engine::round::{guarded, round, Member};
use crate::engine::runner::{EngineThread, IdleClock, Observer};
use crate::engine::{Generation, GenerationError};

/// A running job.
type Running = Member<Observer>;

impl EngineThread {
    /// Runs up to `backend.max_sequences()` jobs at once until the queue
    /// closes and the last of them ends.
    pub(super) fn run_jobs(&mut self) {
        let most = self.backend.max_sequences();
        let mut running: Vec<Running> = Vec::with_capacity(most);
        let mut idle = IdleClock::new(self.residency_interval());
        let mut closed = false;
        // The oldest job taken whose KV cache does not fit beside the
        // running ones: it waits (first in line) for one of them to end.
        let mut held: Option<Box<Job>> = None;
        loop {
            if let Some(err) = self.lost.clone() {
                self.end_everything(std::mem::take(&mut running), held.take(), &err);
                return;
            }
            held = held.and_then(|job| self.still_waiting(job));
            // Join: while there is room, take waiting jobs; block only when
            // nothing runs.
            while running.len() < most {
                let job = match held.take() {
                    Some(job) => job,
                    None if closed => break,
                    None => {
                        let wait = if running.is_empty() {
                            idle.wait(self)
                        } else {
                            Some(Duration::ZERO)
                        };
                        match self.queue.pop(wait) {
                            Pop::Job(job) => job,
                            Pop::Idle => break,
                            Pop::Closed => {
                                closed = true;
                                break;
                            }
                        }
                    }
                };
                if !running.is_empty() && !self.backend.has_room(job.request.positions()) {
                    held = Some(job);
                    break;
                }
                if let Some(r) = self.start(job) {
                    running.push(r);
                }
            }
            if running.is_empty() {
                if closed && held.is_none() {
                    return;
                }
                continue;
            }
            let done = round(self.backend.as_mut(), &self.tokenizer, &mut running);
            if done.rows > 0 {
                self.metrics.observe_batch_rows(done.rows);
            }
            let mut ended = done.ended;
            // Leave: highest index first, so the others keep their places.
            ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
            for (i, result) in ended {
                let r = running.swap_remove(i);
                self.finish(r, result);
            }
        }
    }

    /// The device is lost (issue #47): every running job ends with `err`
    /// (`INFERENCE_FAILED`, retriable), as does the held one and every queued
    /// one, and the queue closes; the process exits once they are answered.
    fn end_everything(
        &mut self,
        running: Vec<Running>,
        held: Option<Box<Job>>,
        err: &BackendError,
    ) {
        for r in running {
            self.finish(r, Err(GenerationError::Backend(err.clone())));
        }
        let error = JobError::from_backend(err, self.backend.device().backend, Phase::Job);
        if let Some(job) = held {
            self.queue.finish_running(&job.id);
            job.finish_unrun(Outcome::Error, error.clone());
        }
        for job in self.queue.close() {
            job.finish_unrun(Outcome::Error, error.clone());
        }
    }

    /// A job waiting for room, unless it was cancelled (or the worker is
    /// shutting down) or its client left meanwhile: then it ends here, unrun.
    fn still_waiting(&mut self, job: Box<Job>) -> Option<Box<Job>> {
        let reason = match (job.cancel.get(), job.sink.is_closed()) {
            (Some(reason), _) => reason,
            (None, true) => AbortReason::Disconnected,
            (None, false) => return Some(job),
        };
        let (outcome, error) = self.abort_error(reason);
        self.queue.finish_running(&job.id);
        job.finish_unrun(outcome, error);
        None
    }

    /// Admits `job` and opens its sequence; `None` when it ended at once
    /// (client gone, or no room for its sequence).
    fn start(&mut self, job: Box<Job>) -> Option<Running> {
        let (request, observer) = self.admit(job)?;
        let mut gen = Generation::new(request, observer.wants_parity());
        match guarded(|| Ok(gen.begin(self.backend.as_mut())?)) {
            Ok(()) => {
                self.note_memory();
                Some(Member { gen, observer })
            }
            Err(e) => {
                self.close(&mut gen);
                self.end_job(observer, Err(e));
                None
            }
        }
    }

    /// Ends a job: its sequence closes, then its terminal event goes.
    fn finish(&mut self, mut r: Running, result: Result<GenerationSummary, GenerationError>) {
        self.close(&mut r.gen);
        self.end_job(r.observer, result);
    }

    fn close(&mut self, gen: &mut Generation) {
        if let Err(e) = guarded(|| {
            gen.end(self.backend.as_mut());
            Ok(())
        }) {
            tracing::error!(error = %e, "closing a job's sequence failed");
        }
    }
}
