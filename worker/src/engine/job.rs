//! One accepted job: its validated request, its event channel and its cancel
//! flag, plus the SSE event payloads of M0-W-1312.
//!
//! A [`JobSink`] is the only way to end a job's stream. `finish` sends the one
//! terminal event and records the job's outcome; a sink dropped without it
//! sends `error` `INTERNAL`, so every accepted job gets exactly one terminal
//! event (M0-W-1311) whatever path it takes.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::engine::error::JobError;
use crate::engine::generate::{AbortReason, GenerationRequest, GenerationSummary, StopReason};
pub use crate::telemetry::metrics::Outcome;
use crate::telemetry::metrics::Metrics;

/// `started`: sent when the job is accepted, before it is queued.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StartedEvent {
    pub job_id: String,
    pub model: String,
    /// RFC 3339 acceptance time.
    pub started_at: String,
    pub seed: u64,
}

/// One entry of a token's `logprobs` list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogprobEntry {
    pub id: u32,
    pub t: String,
    pub logprob: f32,
}

/// `token`: one generated token and the text released with it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenEvent {
    pub t: String,
    pub i: usize,
    pub id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<LogprobEntry>>,
}

/// `end`: the job finished normally.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EndEvent {
    pub tokens_out: usize,
    pub decode_time_ms: u64,
    pub first_token_ms: u64,
    pub stop_reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
}

impl From<&GenerationSummary> for EndEvent {
    fn from(s: &GenerationSummary) -> Self {
        EndEvent {
            tokens_out: s.tokens_out,
            decode_time_ms: s.decode_time_ms,
            first_token_ms: s.first_token_ms,
            stop_reason: s.stop_reason.as_str(),
            stop_sequence: match &s.stop_reason {
                StopReason::StopSequence(stop) => Some(stop.clone()),
                _ => None,
            },
        }
    }
}

/// What travels from the engine to a job's SSE stream.
#[derive(Clone, Debug, PartialEq)]
pub enum JobEvent {
    Started(StartedEvent),
    Token(TokenEvent),
    End(EndEvent),
    Error(JobError),
}

impl JobEvent {
    /// The SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::Started(_) => "started",
            JobEvent::Token(_) => "token",
            JobEvent::End(_) => "end",
            JobEvent::Error(_) => "error",
        }
    }

    /// The SSE `data:` line: one line of JSON.
    pub fn data(&self) -> String {
        let json = match self {
            JobEvent::Started(e) => serde_json::to_string(e),
            JobEvent::Token(e) => serde_json::to_string(e),
            JobEvent::End(e) => serde_json::to_string(e),
            JobEvent::Error(e) => serde_json::to_string(e),
        };
        json.expect("event payloads serialize")
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self, JobEvent::End(_) | JobEvent::Error(_))
    }
}

/// The engine's end of a job's event stream.
pub struct JobSink {
    tx: mpsc::UnboundedSender<JobEvent>,
    metrics: Arc<Metrics>,
    finished: bool,
}

impl JobSink {
    /// A sink and the stream it feeds.
    pub fn channel(metrics: Arc<Metrics>) -> (JobSink, mpsc::UnboundedReceiver<JobEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (JobSink { tx, metrics, finished: false }, rx)
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

    /// Sends the terminal event and counts the outcome. Consumes the sink, so
    /// a job ends exactly once; the stream closes when the sink is dropped.
    pub fn finish(mut self, outcome: Outcome, event: JobEvent) {
        debug_assert!(event.is_terminal());
        self.finished = true;
        self.metrics.request_finished(outcome);
        let _ = self.tx.send(event);
    }
}

impl Drop for JobSink {
    fn drop(&mut self) {
        if !self.finished {
            self.metrics.request_finished(Outcome::Error);
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
        let _ = self.0.compare_exchange(NOT_CANCELLED, value, Ordering::AcqRel, Ordering::Acquire);
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
        self.sink.finish(outcome, JobEvent::Error(error));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_event_json_has_short_keys_and_omits_absent_logprobs() {
        let e = JobEvent::Token(TokenEvent { t: "hi".into(), i: 0, id: 7, logprobs: None });
        assert_eq!(e.name(), "token");
        assert_eq!(e.data(), r#"{"t":"hi","i":0,"id":7}"#);
    }

    #[test]
    fn end_event_carries_stop_sequence_only_when_matched() {
        let mut s = GenerationSummary {
            tokens_in: 3,
            tokens_out: 2,
            first_token_ms: 5,
            decode_time_ms: 9,
            stop_reason: StopReason::MaxTokens,
        };
        let e = JobEvent::End(EndEvent::from(&s));
        assert_eq!(
            e.data(),
            r#"{"tokens_out":2,"decode_time_ms":9,"first_token_ms":5,"stop_reason":"max_tokens"}"#
        );
        s.stop_reason = StopReason::StopSequence("\n\n".into());
        let v: serde_json::Value = serde_json::from_str(&JobEvent::End(EndEvent::from(&s)).data()).unwrap();
        assert_eq!(v["stop_reason"], "stop_sequence");
        assert_eq!(v["stop_sequence"], "\n\n");
    }

    #[test]
    fn a_dropped_sink_still_ends_the_stream_once() {
        let metrics = Arc::new(Metrics::new_for_tests());
        let (sink, mut rx) = JobSink::channel(metrics.clone());
        drop(sink);
        let ev = rx.try_recv().unwrap();
        assert!(matches!(ev, JobEvent::Error(ref e) if e.code == crate::engine::ErrorCode::Internal));
        assert!(rx.try_recv().is_err());
        assert_eq!(metrics.requests(Outcome::Error), 1);
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
