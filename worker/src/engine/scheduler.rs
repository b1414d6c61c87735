//! Several jobs at once (`--parallel N`): each running job holds one of the
//! backend's slots (its own sequence), and the engine steps them together.
//!
//! One round: every job still in its prompt prefills one chunk (so a long
//! prompt never stalls the others' streams for more than a chunk); every job
//! past its prompt samples its next token; the tokens that do not end their
//! job go back to the backend as one batched decode step
//! ([`Backend::decode_rows`]), queued before the tokens' text is worked out
//! and streamed, so the host's work overlaps the device's. Jobs join at the
//! start of a round and leave at its end; a job's slot goes back at once.
//!
//! A job whose KV cache would not fit beside the running ones
//! (`Backend::has_room`) waits, first in line, until one of them ends; it
//! never fails for want of room while others run.
//!
//! A job's tokens do not depend on which others share its rounds: each slot's
//! sequence is computed as it would be alone (the backend's promise for
//! `decode_rows`), prompts are cut into the same chunks as alone, and each
//! job draws from its own seeded generator.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::backend::Backend;
use crate::engine::generate::{
    AbortReason, GenerationError, GenerationObserver, GenerationSummary, Sampled, SampledId,
    StopReason,
};
use crate::engine::job::Job;
use crate::engine::queue::Pop;
use crate::engine::runner::{panic_message, EngineThread, Failure, IdleClock, Observer};
use crate::engine::Generation;

/// A job holding a slot.
struct Running {
    slot: usize,
    gen: Generation,
    observer: Observer,
}

/// What ended in a round: the job's index among the running ones, and how.
type Ended = (usize, Result<GenerationSummary, Failure>);

impl EngineThread {
    /// Runs up to `backend.slots()` jobs at once until the queue closes and
    /// the last of them ends.
    pub(super) fn run_parallel(&mut self) {
        let slots = self.backend.slots();
        let mut free: Vec<usize> = (0..slots).rev().collect();
        let mut running: Vec<Running> = Vec::with_capacity(slots);
        let mut idle = IdleClock::new(self.residency_interval());
        let mut closed = false;
        // The oldest job taken whose KV cache does not fit beside the
        // running ones: it waits (first in line) for one of them to end.
        let mut held: Option<Box<Job>> = None;
        loop {
            held = held.and_then(|job| self.still_waiting(job));
            // Join: while slots are free, take waiting jobs; block only when
            // nothing runs.
            while !free.is_empty() {
                let job = match held.take() {
                    Some(job) => job,
                    None if closed => break,
                    None => {
                        let wait = if running.is_empty() {
                            idle.wait(self)
                        } else {
                            Some(std::time::Duration::ZERO)
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
                let slot = free.pop().expect("a slot is free");
                match self.start(job, slot) {
                    Some(r) => running.push(r),
                    None => free.push(slot),
                }
            }
            if running.is_empty() {
                if closed && held.is_none() {
                    return;
                }
                continue;
            }
            let mut ended = self.round(&mut running);
            // Leave: highest index first, so the others keep their places.
            ended.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
            for (i, result) in ended {
                let r = running.swap_remove(i);
                free.push(r.slot);
                self.finish(r, result);
            }
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

    /// Admits `job` into `slot` and opens its sequence; `None` when it ended
    /// at once (client gone, or no room for its sequence).
    fn start(&mut self, job: Box<Job>, slot: usize) -> Option<Running> {
        let (request, observer) = self.admit(job)?;
        let mut gen = Generation::new(request, observer.wants_parity());
        let opened = guarded(|| {
            self.backend.select_slot(slot)?;
            gen.begin(self.backend.as_mut())?;
            Ok(())
        });
        match opened {
            Ok(()) => {
                self.note_memory();
                Some(Running {
                    slot,
                    gen,
                    observer,
                })
            }
            Err(failure) => {
                self.close_slot(slot);
                self.end_job(observer, Err(failure));
                None
            }
        }
    }

    /// Ends a job: its slot's sequence closes, then its terminal event goes.
    fn finish(&mut self, r: Running, result: Result<GenerationSummary, Failure>) {
        self.close_slot(r.slot);
        self.end_job(r.observer, result);
    }

    fn close_slot(&mut self, slot: usize) {
        let closed = guarded(|| {
            self.backend.select_slot(slot)?;
            self.backend.end_sequence();
            Ok(())
        });
        if let Err(failure) = closed {
            let message = match failure {
                Failure::Panic(m) => m,
                Failure::Generation(e) => e.to_string(),
            };
            tracing::error!(slot, error = %message, "closing a slot's sequence failed");
        }
    }

    /// One round over the running jobs; returns those that ended in it.
    fn round(&mut self, running: &mut [Running]) -> Vec<Ended> {
        let mut ended: Vec<Ended> = Vec::new();
        let backend = self.backend.as_mut();
        let tokenizer = self.tokenizer.as_ref();

        // Between steps, as alone: cancelled, client gone, timed out?
        for (i, r) in running.iter_mut().enumerate() {
            if let Some(reason) = r.observer.should_abort() {
                ended.push((i, Err(GenerationError::Aborted(reason).into())));
            }
        }
        let gone = |ended: &[Ended], i: usize| ended.iter().any(|(j, _)| *j == i);

        let t0 = Instant::now();
        // Prompts: one chunk each.
        for (i, r) in running.iter_mut().enumerate() {
            if !r.gen.prefilling() || gone(&ended, i) {
                continue;
            }
            if let Err(f) = guarded(|| prefill(backend, r)) {
                ended.push((i, Err(f)));
            }
        }

        let t1 = Instant::now();
        // Tokens: every job past its prompt samples one, all in one call.
        let ready: Vec<usize> = (0..running.len())
            .filter(|&i| !running[i].gen.prefilling() && !gone(&ended, i))
            .collect();
        let draws: Vec<Option<f64>> = ready.iter().map(|&i| running[i].gen.draw()).collect();
        let requests: Vec<_> = ready
            .iter()
            .zip(&draws)
            .map(|(&i, &u)| (running[i].slot, running[i].gen.request(u)))
            .collect();
        let chosen = guarded(|| Ok(backend.sample_rows(&requests)?));
        drop(requests);
        let mut sampled: Vec<(usize, SampledId)> = Vec::new();
        match chosen {
            Ok(tokens) => {
                for (&i, token) in ready.iter().zip(tokens) {
                    let r = &mut running[i];
                    let (drawn, parity) = r.gen.accept(token, tokenizer);
                    if let Some(record) = parity {
                        r.observer.on_parity(record);
                    }
                    match drawn {
                        Sampled::Token(t) => sampled.push((i, t)),
                        Sampled::Eos => ended.push((i, Ok(r.gen.summary(StopReason::Eos)))),
                    }
                }
            }
            // The sampling is shared: each of its jobs ends with its error.
            Err(f) => ended.extend(ready.iter().map(|&i| (i, Err(f.clone())))),
        }
        let t2 = Instant::now();
        // The next step of every job that goes on, queued before the tokens
        // are streamed (a stop string found below wastes its row). Jobs that
        // record parity run theirs alone after streaming, as they would alone.
        let rows: Vec<(usize, usize, u32)> = sampled
            .iter()
            .filter(|(i, t)| !t.is_last && !running[*i].gen.records_parity())
            .map(|(i, t)| (*i, running[*i].slot, t.id))
            .collect();
        if !rows.is_empty() {
            let step: Vec<(usize, u32)> = rows.iter().map(|&(_, s, t)| (s, t)).collect();
            self.metrics.observe_batch_rows(step.len());
            let decoded = guarded(|| Ok(backend.decode_rows(&step)?));
            if let Err(f) = decoded {
                // The step is shared: each of its jobs ends with its error.
                for &(i, _, _) in &rows {
                    ended.push((i, Err(f.clone())));
                }
                sampled.retain(|(i, _)| !rows.iter().any(|(j, _, _)| j == i));
            }
        }

        let t3 = Instant::now();
        let tokens = sampled.len();
        // Stream each token; end the jobs it ends.
        for (i, token) in sampled {
            let r = &mut running[i];
            let id = token.id;
            let (out, stop) = r.gen.emit(tokenizer, token);
            if let Some(reason) = r.observer.on_token(out) {
                ended.push((i, Err(GenerationError::Aborted(reason).into())));
            } else if let Some(reason) = stop {
                ended.push((i, Ok(r.gen.summary(reason))));
            } else if r.gen.records_parity() {
                if let Err(f) = guarded(|| feed(backend, r, id)) {
                    ended.push((i, Err(f)));
                }
            }
        }
        // Where a round's time goes: the first sample waits for the step
        // before it, queued in the last round.
        tracing::debug!(
            jobs = running.len(),
            tokens,
            rows = rows.len(),
            prefill_us = (t1 - t0).as_micros() as u64,
            sample_us = (t2 - t1).as_micros() as u64,
            queue_us = (t3 - t2).as_micros() as u64,
            stream_us = t3.elapsed().as_micros() as u64,
            "round"
        );
        ended
    }
}

fn prefill(backend: &mut dyn Backend, r: &mut Running) -> Result<(), Failure> {
    backend.select_slot(r.slot)?;
    r.gen.prefill(backend)?;
    Ok(())
}

fn feed(backend: &mut dyn Backend, r: &mut Running, id: u32) -> Result<(), Failure> {
    backend.select_slot(r.slot)?;
    r.gen.feed(backend, id)?;
    Ok(())
}

/// Runs `f`, turning a panic into a [`Failure`] of the job it was for.
fn guarded<T>(f: impl FnOnce() -> Result<T, Failure>) -> Result<T, Failure> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(Failure::Panic(panic_message(p))))
}
