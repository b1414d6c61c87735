//! Parity logging (EXT-001): one JSONL record per generated token, written by
//! a background thread.
//!
//! The engine hands each [`ParityStep`] over a bounded channel with
//! `try_send`; when the writer falls behind, the record is dropped and counted
//! (`worker_parity_records_dropped_total`), so neither the engine nor HTTP
//! ever waits on the file. Summaries (min/max/mean/L2, first values, top-k)
//! are computed on the writer thread, not the engine's.
//!
//! Record layout (one JSON object per line):
//! `{job_id, step, token_id, checkpoints: [{name, len, min, max, mean, l2, first}],
//!   top_logprobs: [{id, logprob}], top_logits: [{id, logit}], logits: {len, min, max, mean, l2}}`

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;

use crate::engine::generate::ParityStep;

/// Records waiting for the writer before new ones are dropped.
pub const PARITY_CHANNEL_CAPACITY: usize = 256;
/// Leading values kept from each checkpoint.
pub const PARITY_FIRST_VALUES: usize = 16;
/// Largest raw logits kept per step.
pub const PARITY_TOP_LOGITS: usize = 10;

struct ParityRecord {
    job_id: Arc<str>,
    step: ParityStep,
}

/// The engine's end: never blocks.
#[derive(Clone)]
pub struct ParitySender {
    tx: SyncSender<ParityRecord>,
    dropped: Counter,
}

impl ParitySender {
    /// Hands a record to the writer, or drops and counts it when the writer is behind.
    pub fn offer(&self, job_id: &Arc<str>, step: ParityStep) {
        match self.tx.try_send(ParityRecord {
            job_id: job_id.clone(),
            step,
        }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }
}

/// The writer thread; ends when every sender is gone and the channel is drained.
pub struct ParityWriter {
    thread: JoinHandle<()>,
}

impl ParityWriter {
    /// Creates (truncates) `path` and starts the writer.
    pub fn spawn(path: &Path, dropped: Counter) -> std::io::Result<(ParitySender, ParityWriter)> {
        let file = File::create(path)?;
        let (tx, rx) = mpsc::sync_channel(PARITY_CHANNEL_CAPACITY);
        let thread = std::thread::Builder::new()
            .name("parity-writer".into())
            .spawn(move || write_loop(rx, BufWriter::new(file)))?;
        Ok((ParitySender { tx, dropped }, ParityWriter { thread }))
    }

    /// Waits for the writer to drain and flush. Call after the engine has stopped.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

fn write_loop(rx: Receiver<ParityRecord>, mut out: BufWriter<File>) {
    let mut failed = false;
    loop {
        let record = match rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => {
                // Idle: make what we have visible, then wait.
                let _ = out.flush();
                match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let line = serde_json::to_string(&summarize(&record)).expect("parity records serialize");
        if let Err(e) = writeln!(out, "{line}") {
            if !failed {
                tracing::error!(event = "error", code = "INTERNAL", message = %format!("parity log write failed: {e}"));
                failed = true;
            }
        }
    }
    let _ = out.flush();
}

#[derive(Serialize, Debug, PartialEq)]
struct Stats {
    len: usize,
    min: f32,
    max: f32,
    mean: f32,
    l2: f32,
}

#[derive(Serialize)]
struct CheckpointSummary<'a> {
    name: &'a str,
    #[serde(flatten)]
    stats: Stats,
    first: &'a [f32],
}

#[derive(Serialize)]
struct TopLogprob {
    id: u32,
    logprob: f32,
}

#[derive(Serialize)]
struct TopLogit {
    id: u32,
    logit: f32,
}

#[derive(Serialize)]
struct RecordSummary<'a> {
    job_id: &'a str,
    step: usize,
    token_id: u32,
    checkpoints: Vec<CheckpointSummary<'a>>,
    top_logprobs: Vec<TopLogprob>,
    top_logits: Vec<TopLogit>,
    logits: Stats,
}

fn summarize(r: &ParityRecord) -> RecordSummary<'_> {
    let s = &r.step;
    RecordSummary {
        job_id: &r.job_id,
        step: s.step,
        token_id: s.token_id,
        checkpoints: s
            .checkpoints
            .entries
            .iter()
            .map(|(name, values)| CheckpointSummary {
                name,
                stats: stats(values),
                first: &values[..values.len().min(PARITY_FIRST_VALUES)],
            })
            .collect(),
        top_logprobs: s
            .top_logits
            .iter()
            .map(|t| TopLogprob {
                id: t.id,
                logprob: t.logprob,
            })
            .collect(),
        top_logits: top_k(&s.logits, PARITY_TOP_LOGITS),
        logits: stats(&s.logits),
    }
}

fn stats(values: &[f32]) -> Stats {
    let (mut min, mut max, mut sum, mut sq) = (f32::INFINITY, f32::NEG_INFINITY, 0f64, 0f64);
    for &v in values {
        min = min.min(v);
        max = max.max(v);
        sum += v as f64;
        sq += (v as f64) * (v as f64);
    }
    let n = values.len();
    Stats {
        len: n,
        min: if n == 0 { 0.0 } else { min },
        max: if n == 0 { 0.0 } else { max },
        mean: if n == 0 { 0.0 } else { (sum / n as f64) as f32 },
        l2: sq.sqrt() as f32,
    }
}

/// The `k` largest values with their indices, largest first; ties by lower index.
fn top_k(values: &[f32], k: usize) -> Vec<TopLogit> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    let by_value = |a: &usize, b: &usize| values[*b].total_cmp(&values[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, by_value);
        idx.truncate(k);
    }
    idx.sort_by(by_value);
    idx.into_iter()
        .map(|i| TopLogit {
            id: i as u32,
            logit: values[i],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Checkpoints;
    use crate::sampling::TokenLogprob;

    fn step(i: usize) -> ParityStep {
        let mut cp = Checkpoints::default();
        cp.record("inp_embd", &(0..40).map(|v| v as f32).collect::<Vec<_>>());
        ParityStep {
            step: i,
            token_id: 3,
            checkpoints: cp,
            top_logits: vec![TokenLogprob {
                id: 3,
                logprob: -0.1,
            }],
            logits: vec![0.0, 1.0, 5.0, -2.0, 5.0],
        }
    }

    #[test]
    fn stats_and_top_k() {
        let s = stats(&[3.0, -4.0]);
        assert_eq!(
            s,
            Stats {
                len: 2,
                min: -4.0,
                max: 3.0,
                mean: -0.5,
                l2: 5.0
            }
        );
        let t = top_k(&[0.0, 1.0, 5.0, -2.0, 5.0], 3);
        assert_eq!(t.iter().map(|t| t.id).collect::<Vec<_>>(), vec![2, 4, 1]);
    }

    #[test]
    fn writer_emits_one_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("parity.jsonl");
        let dropped = Counter::default();
        let (tx, writer) = ParityWriter::spawn(&path, dropped.clone()).unwrap();
        let job: Arc<str> = Arc::from("job-1");
        for i in 0..3 {
            tx.offer(&job, step(i));
        }
        drop(tx);
        writer.join();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64 + dropped.get(), 3);
        let first = &lines[0];
        assert_eq!(first["job_id"], "job-1");
        assert_eq!(first["step"], 0);
        assert_eq!(first["checkpoints"][0]["name"], "inp_embd");
        assert_eq!(first["checkpoints"][0]["len"], 40);
        assert_eq!(
            first["checkpoints"][0]["first"].as_array().unwrap().len(),
            PARITY_FIRST_VALUES
        );
        assert_eq!(first["top_logits"][0]["id"], 2);
        assert_eq!(first["logits"]["max"], 5.0);
    }
}
