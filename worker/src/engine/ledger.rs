//! The admission ledger (M0-W-1350): how every request on `/execute` and the
//! `/v1` routes ended, counted once.
//!
//! A request ends in one of two ways. Refused before admission (a malformed
//! body, a full queue, shutdown): the server calls [`Ledger::refused`] where
//! it answers. Accepted: the queue counts it under its lock as it takes the
//! job ([`Ledger::accepted`], so the engine can never end a job before it is
//! counted), and the job's [`JobSink`](super::JobSink) counts its end and
//! outcome when it sends the terminal event ([`Ledger::ended`]). Nothing else
//! writes `worker_requests_total` or the jobs counters; `Metrics` takes the
//! outcome only as a label.

use std::sync::Arc;

use crate::telemetry::metrics::Metrics;

/// How a request ended, as counted in `worker_requests_total{outcome}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Completed,
    Cancelled,
    Disconnected,
    Timeout,
    Error,
    /// Refused by validation (400).
    Invalid,
    /// Refused for lack of room or at shutdown (503).
    Rejected,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::Completed,
        Outcome::Cancelled,
        Outcome::Disconnected,
        Outcome::Timeout,
        Outcome::Error,
        Outcome::Invalid,
        Outcome::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::Disconnected => "disconnected",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
            Outcome::Invalid => "invalid",
            Outcome::Rejected => "rejected",
        }
    }
}

/// The one writer of the request and job counters.
#[derive(Clone)]
pub struct Ledger {
    metrics: Arc<Metrics>,
}

impl Ledger {
    /// A ledger writing to `metrics`. Every outcome's series shows from the
    /// start, so a scrape before and after one job can subtract.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let labels: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        metrics.declare_request_outcomes(&labels);
        Ledger { metrics }
    }

    /// A ledger over fresh metrics, for tests.
    pub fn new_for_tests() -> Self {
        Ledger::new(Arc::new(Metrics::new_for_tests()))
    }

    /// A request answered without becoming a job.
    pub fn refused(&self, outcome: Outcome) {
        debug_assert!(
            matches!(
                outcome,
                Outcome::Invalid | Outcome::Rejected | Outcome::Error
            ),
            "a refusal is invalid, rejected or an error, not {outcome:?}"
        );
        self.metrics.request_finished(outcome.as_str());
    }

    /// A job was admitted: its stream is open and the queue holds it.
    pub(super) fn accepted(&self) {
        self.metrics.job_accepted();
    }

    /// An admitted job got its terminal event.
    pub(super) fn ended(&self, outcome: Outcome) {
        self.metrics.request_finished(outcome.as_str());
        self.metrics.job_ended();
    }

    /// Requests counted with `outcome` so far.
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.metrics.requests(outcome.as_str())
    }

    /// `(accepted, ended)` jobs so far.
    pub fn jobs(&self) -> (u64, u64) {
        self.metrics.jobs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_shows_before_any_request() {
        let ledger = Ledger::new_for_tests();
        let text = ledger.metrics.render(Default::default());
        for outcome in Outcome::ALL {
            let series = format!(
                "worker_requests_total{{outcome=\"{}\"}} 0",
                outcome.as_str()
            );
            assert!(text.contains(&series), "{series} missing from:\n{text}");
        }
    }

    #[test]
    fn an_admitted_job_counts_once_at_its_end_and_a_refusal_once_where_answered() {
        let ledger = Ledger::new_for_tests();
        ledger.accepted();
        assert_eq!(ledger.jobs(), (1, 0));
        assert_eq!(ledger.requests(Outcome::Completed), 0);
        ledger.ended(Outcome::Completed);
        ledger.refused(Outcome::Rejected);
        assert_eq!(ledger.jobs(), (1, 1));
        assert_eq!(ledger.requests(Outcome::Completed), 1);
        assert_eq!(ledger.requests(Outcome::Rejected), 1);
        assert_eq!(ledger.requests(Outcome::Invalid), 0);
    }
}
