//! One accepted job: its validated request, its event channel and its cancel
//! flag, and the domain events it produces (M0-W-1312). The events are plain
//! Rust values; `server::events` gives them their SSE names and JSON.
//!
//! A [`JobSink`] is the only way to end a job's stream. `finish` sends the one
//! terminal event, records the job's outcome and logs its one `execute_end`;
//! a sink dropped without it sends `error` `INTERNAL`, so every accepted job
//! gets exactly one terminal event (M0-W-1311) whatever path it takes.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::engine::error::JobError;
use crate::engine::generate::{AbortReason, GenerationRequest, GenerationSummary};
use crate::engine::ledger::{Ledger, Outcome};
use crate::narrate;

/// The job was accepted: sent before it is queued.
#[derive(Clone, Debug, PartialEq)]
pub struct JobStarted {
    pub job_id: String,
    /// The model as named at start (`--model`).
    pub model: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub seed: u64,
}

/// One of the most likely tokens at a position, with its text.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenAlternative {
    pub id: u32,
    pub text: String,
    /// Natural-log probability of the raw logits.
    pub logprob: f32,
}

/// One generated token and the text released with it.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOut {
    /// 0-based, consecutive.
    pub index: usize,
    pub id: u32,
    pub text: String,
    /// Present when the job asked for log-probabilities.
    pub logprobs: Option<Vec<TokenAlternative>>,
    /// The channel the token belongs to: gpt-oss's harmony channel
    /// (`analysis`, `final`, `commentary`), or `analysis` for a token of a
    /// think block (Qwen3 and its kind); `None` for structure tokens and
    /// markers, a think model's answer and models without either format.
    pub channel: Option<std::sync::Arc<str>>,
}

/// What travels from the engine to a job's stream.
#[derive(Clone, Debug, PartialEq)]
pub enum JobEvent {
    Started(JobStarted),
    Token(TokenOut),
    /// The job finished normally.
    End(GenerationSummary),
    Error(JobError),
}

impl JobEvent {
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobEvent::End(_) | JobEvent::Error(_))
    }
}

/// How a job ended: the terminal event its client gets, the outcome it is
/// counted under, and what its `execute_end` record says.
#[derive(Clone, Debug)]
pub struct JobEnd {
    pub outcome: Outcome,
    /// `End` or `Error`.
    pub event: JobEvent,
    pub tokens_out: usize,
    /// `(first_token_ms, decode_time_ms)` of a job stopped while running;
    /// a completed job's come from its summary.
    pub timings: Option<(u64, u64)>,
    /// Why the record has no run to report.
    pub note: Option<&'static str>,
}

impl JobEnd {
    pub fn completed(summary: GenerationSummary) -> Self {
        let tokens_out = summary.tokens_out;
        JobEnd {
            outcome: Outcome::Completed,
            event: JobEvent::End(summary),
            tokens_out,
            timings: None,
            note: None,
        }
    }

    /// Stopped with `error` after `tokens_out` tokens.
    pub fn failed(outcome: Outcome, error: JobError, tokens_out: usize) -> Self {
        JobEnd {
            outcome,
            event: JobEvent::Error(error),
            tokens_out,
            timings: None,
            note: None,
        }
    }

    /// Ended before it ran (cancelled in the queue, dropped at shutdown).
    pub fn unrun(outcome: Outcome, error: JobError) -> Self {
        JobEnd {
            note: Some("job ended before it ran"),
            ..JobEnd::failed(outcome, error, 0)
        }
    }
}

/// The engine's end of a job's event stream.
pub struct JobSink {
    tx: mpsc::UnboundedSender<JobEvent>,
    ledger: Ledger,
    /// What the job's `execute_end` record names it by.
    job_id: String,
    tokens_in: usize,
    finished: bool,
}

impl JobSink {
    /// A sink for job `job_id` with `tokens_in` prompt tokens, and the stream it feeds.
    pub fn channel(
        job_id: &str,
        tokens_in: usize,
        ledger: Ledger,
    ) -> (JobSink, mpsc::UnboundedReceiver<JobEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            JobSink {
                tx,
                ledger,
                job_id: job_id.to_string(),
                tokens_in,
                finished: false,
            },
            rx,
        )
    }

    /// Sends a non-terminal event; false when the client has gone away.
    pub fn send(&self, event: JobEvent) -> bool {
        debug_assert!(!event.is_terminal(), "terminal events go through finish");
        self.tx.send(event).is_ok()
    }

    /// Whether the client has gone away (its stream was dropped).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Disarms a sink whose job was never accepted (its stream never opened):
    /// nothing is sent and nothing counted here; the caller answers and counts.
    pub fn discard(mut self) {
        self.finished = true;
    }

    /// Counts the job as admitted: the queue calls this under its lock as it
    /// takes the job, before the engine can end it.
    pub(super) fn admitted(&self) {
        self.ledger.accepted();
    }

    /// Sends the terminal event, counts the outcome and logs `execute_end`:
    /// the one place a job's end is recorded. Consumes the sink, so a job
    /// ends exactly once; the stream closes when the sink is dropped.
    pub fn finish(mut self, end: JobEnd) {
        debug_assert!(end.event.is_terminal());
        self.finished = true;
        self.log_end(&end);
        self.ledger.ended(end.outcome);
        let _ = self.tx.send(end.event);
    }

    fn log_end(&self, end: &JobEnd) {
        let (tokens_in, timings, stop_reason) = match &end.event {
            JobEvent::End(s) => (
                s.tokens_in,
                Some((s.first_token_ms, s.decode_time_ms)),
                Some(s.stop_reason.as_str()),
            ),
            _ => (self.tokens_in, end.timings, None),
        };
        narrate!(
            info,
            "execute_end",
            job_id = %self.job_id,
            outcome = end.outcome.as_str(),
            tokens_in,
            tokens_out = end.tokens_out,
            decode_time_ms = timings.map(|t| t.1),
            first_token_ms = timings.map(|t| t.0),
            stop_reason,
            message = end.note,
        );
    }
}

impl Drop for JobSink {
    fn drop(&mut self) {
        if !self.finished {
            self.ledger.ended(Outcome::Error);
            let _ = self.tx.send(JobEvent::Error(JobError::internal(
                "the job ended without a result (internal error)",
            )));
        }
    }
}

/// A job's cancel request, set from outside and read by the engine between
/// steps. The first reason set wins.
#[derive(Debug, Default)]
pub struct CancelFlag(AtomicU8);

const NOT_CANCELLED: u8 = 0;
const BY_CLIENT: u8 = 1;
const BY_SHUTDOWN: u8 = 2;

impl CancelFlag {
    pub fn cancel(&self, reason: AbortReason) {
        let value = match reason {
            AbortReason::ShuttingDown => BY_SHUTDOWN,
            _ => BY_CLIENT,
        };
        let _ = self
            .0
            .compare_exchange(NOT_CANCELLED, value, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn get(&self) -> Option<AbortReason> {
        match self.0.load(Ordering::Acquire) {
            BY_CLIENT => Some(AbortReason::Cancelled),
            BY_SHUTDOWN => Some(AbortReason::ShuttingDown),
            _ => None,
        }
    }
}

/// Facts about a job's prompt that may be logged (M0-W-1902): never the text.
#[derive(Clone, Debug, Default)]
pub struct PromptFacts {
    pub sha256: String,
    pub chars: usize,
    /// `X-Deadline` as the client sent it; logged, not enforced.
    pub deadline: Option<String>,
}

/// An accepted job on its way to the engine.
pub struct Job {
    pub id: String,
    pub request: GenerationRequest,
    pub accepted_at: Instant,
    pub prompt: PromptFacts,
    pub cancel: Arc<CancelFlag>,
    pub sink: JobSink,
}

impl Job {
    /// Ends a job that never ran (cancelled in the queue, dropped at shutdown,
    /// or its client left before its turn).
    pub fn finish_unrun(self, outcome: Outcome, error: JobError) {
        self.sink.finish(JobEnd::unrun(outcome, error));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_sink_still_ends_the_stream_once() {
        let ledger = Ledger::new_for_tests();
        let (sink, mut rx) = JobSink::channel("j", 1, ledger.clone());
        drop(sink);
        let ev = rx.try_recv().unwrap();
        assert!(
            matches!(ev, JobEvent::Error(ref e) if e.code == crate::engine::ErrorCode::Internal)
        );
        assert!(rx.try_recv().is_err());
        assert_eq!(ledger.requests(Outcome::Error), 1);
        assert_eq!(
            ledger.jobs(),
            (0, 1),
            "ended once; admitting is the queue's count"
        );
        let (refused, _rx) = JobSink::channel("k", 1, ledger.clone());
        refused.discard();
        assert_eq!(ledger.jobs(), (0, 1), "a discarded sink never ended a job");
    }

    #[test]
    fn first_cancel_reason_wins() {
        let f = CancelFlag::default();
        assert_eq!(f.get(), None);
        f.cancel(AbortReason::ShuttingDown);
        f.cancel(AbortReason::Cancelled);
        assert_eq!(f.get(), Some(AbortReason::ShuttingDown));
    }
}
