//! The stream part of the World: jobs posted to `/execute`, live or finished,
//! their requests and transcripts, plain (refused) replies and `/cancel` replies.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde_json::Value;

use crate::client::{Execute, LiveJob, Reply, Transcript};
use crate::proof::Recorder;

/// The longest a job of this suite may take (a 2048-token job is always cancelled earlier).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
pub struct Stream {
    pub live: BTreeMap<String, LiveJob>,
    pub done: BTreeMap<String, Transcript>,
    pub requests: BTreeMap<String, Value>,
    /// Job ids in the order they were posted.
    pub posted: Vec<String>,
    /// The last plain reply (a refusal, or a stream's status line).
    pub reply: Option<Reply>,
    pub refused: Vec<(String, Reply)>,
    pub cancel_replies: Vec<Reply>,
    /// Job ids of `I run this job N times`.
    pub repeat_ids: Vec<String>,
    /// Job ids posted at once after running alone (`parallel.rs`).
    pub parallel_ids: Vec<String>,
    /// `(case, wanted status, reply)` of each hostile request.
    pub hostile: Vec<(String, u16, Reply)>,
}

/// A body's `job_id` (empty when absent).
pub fn job_id(body: &Value) -> String {
    body.get("job_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

impl Stream {
    /// Files a post's outcome: a stream becomes a live job, a refusal the plain reply.
    pub fn file(&mut self, scenario: &str, body: Value, outcome: Execute) {
        let id = job_id(&body);
        self.requests.insert(id.clone(), body);
        self.posted.push(id.clone());
        match outcome {
            Execute::Stream(job) => {
                self.live.insert(id, job);
            }
            Execute::Refused(r) => {
                Recorder::refusal(scenario, &id, r.status, &r.body);
                self.refused.push((id, r.clone()));
                self.reply = Some(r);
            }
        }
    }

    /// Waits for a live job's end, records its transcript and files it.
    pub async fn finish(
        &mut self,
        scenario: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<&Transcript> {
        let job = self.live.remove(id).ok_or_else(|| {
            anyhow!(
                "no running job {id:?} (refused? {:?})",
                self.refused
                    .iter()
                    .find(|(j, _)| j == id)
                    .map(|(_, r)| (r.status, &r.body))
            )
        })?;
        let t = job.finish(timeout).await?;
        let req = self.requests.get(id).cloned().unwrap_or(Value::Null);
        Recorder::transcript(scenario, &req, &t);
        conformance::register(scenario, &t);
        self.done.insert(id.to_owned(), t);
        Ok(&self.done[id])
    }

    /// Finishes every live job, in the order they were posted.
    pub async fn finish_all(&mut self, scenario: &str, timeout: Duration) -> Result<()> {
        let ids: Vec<String> = self
            .posted
            .iter()
            .filter(|id| self.live.contains_key(*id))
            .cloned()
            .collect();
        for id in ids {
            self.finish(scenario, &id, timeout).await?;
        }
        Ok(())
    }

    /// Lets a still-running job finish (up to a minute), then returns its transcript.
    pub async fn settle(&mut self, scenario: &str, id: &str) -> Result<&Transcript> {
        if self.live.contains_key(id) {
            self.finish(scenario, id, Duration::from_secs(60)).await?;
        }
        self.transcript(id)
    }

    pub fn transcript(&self, id: &str) -> Result<&Transcript> {
        self.done.get(id).ok_or_else(|| {
            anyhow!(
                "job {id:?} has not finished (running: {}, refused: {})",
                self.live.contains_key(id),
                self.refused.iter().any(|(j, _)| j == id)
            )
        })
    }

    pub fn live(&self, id: &str) -> Result<&LiveJob> {
        self.live
            .get(id)
            .ok_or_else(|| anyhow!("job {id} is not running"))
    }

    pub fn request(&self, id: &str) -> Result<&Value> {
        self.requests
            .get(id)
            .ok_or_else(|| anyhow!("no request {id}"))
    }

    pub fn reply(&self) -> Result<&Reply> {
        self.reply
            .as_ref()
            .ok_or_else(|| anyhow!("no plain reply recorded (the request opened a stream?)"))
    }

    /// Drops every live job's connection.
    pub fn disconnect_all(&mut self) {
        for (_, job) in std::mem::take(&mut self.live) {
            job.disconnect();
        }
    }
}

/// Every transcript of the run checked against the event rules (M0-W-1312 checks them all).
pub mod conformance {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use crate::client::Transcript;
    use crate::events;

    /// (scenario, job, violations) of each transcript that broke the rules.
    static VIOLATIONS: Mutex<Vec<(String, String, Vec<String>)>> = Mutex::new(Vec::new());
    static CHECKED: AtomicUsize = AtomicUsize::new(0);

    /// Checks one finished transcript of the run.
    pub fn register(scenario: &str, t: &Transcript) {
        CHECKED.fetch_add(1, Ordering::SeqCst);
        let bad = events::check_all(t);
        if !bad.is_empty() {
            VIOLATIONS
                .lock()
                .unwrap()
                .push((scenario.to_owned(), t.job_id.clone(), bad));
        }
    }

    /// How many transcripts were checked, and one line per transcript that broke the rules.
    pub fn report() -> (usize, Vec<String>) {
        let lines = VIOLATIONS
            .lock()
            .unwrap()
            .iter()
            .map(|(s, j, b)| format!("{s} / {j}: {}", b.join("; ")))
            .collect();
        (CHECKED.load(Ordering::SeqCst), lines)
    }
}
