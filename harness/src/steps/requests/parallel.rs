//! Jobs running alongside (`--parallel N`, issue 18): the same jobs alone and
//! at once, and how many streamed at the same time.

use std::time::Instant;

use anyhow::anyhow;
use cucumber::gherkin::Step;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::client::Transcript;
use crate::steps::requests::post::{job_list, post_all};
use crate::steps::StepResult;
use crate::world::{job_id, TestWorld, JOB_TIMEOUT};

/// The id a job of the list runs under alone.
fn alone_id(id: &str) -> String {
    format!("{id}-alone")
}

/// Runs each job of the list alone (as `<id>-alone`, one after the other),
/// then posts them all at once under their own ids and waits for every end.
#[when(expr = "I run each of these jobs alone, then all of them at once:")]
async fn alone_then_at_once(w: &mut TestWorld, step: &Step) -> StepResult {
    let bodies = job_list(w, step)?;
    for b in &bodies {
        let mut alone = b.clone();
        alone["job_id"] = json!(alone_id(&job_id(b)));
        w.run_job(alone).await?;
    }
    post_all(w, &bodies).await?;
    w.stream.parallel_ids.extend(bodies.iter().map(job_id));
    w.finish_all(JOB_TIMEOUT).await?;
    Ok(())
}

/// Token ids, texts and log-probabilities of a finished job, in order.
fn tokens(t: &Transcript) -> Vec<(i64, String, String)> {
    t.tokens()
        .map(|e| {
            let id = e.data.get("id").and_then(Value::as_i64).unwrap_or(-1);
            let text = e
                .data
                .get("t")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let logprobs = e
                .data
                .get("logprobs")
                .map(Value::to_string)
                .unwrap_or_default();
            (id, text, logprobs)
        })
        .collect()
}

#[then(expr = "each job gave the same tokens at once as alone")]
async fn same_as_alone(w: &mut TestWorld) -> StepResult {
    let ids = w.stream.parallel_ids.clone();
    check!(!ids.is_empty(), "no jobs were posted at once");
    for id in &ids {
        let together = w.stream.transcript(id)?;
        let alone = w.stream.transcript(&alone_id(id))?;
        for t in [together, alone] {
            check!(
                t.terminal().map(|e| e.kind.as_str()) == Some("end"),
                "job {} ended with {:?}",
                t.job_id,
                t.terminal().map(|e| &e.raw_data)
            );
        }
        let (a, b) = (tokens(alone), tokens(together));
        check!(!a.is_empty(), "job {id} gave no tokens");
        if let Some(k) = (0..a.len().max(b.len())).find(|&k| a.get(k) != b.get(k)) {
            return Err(anyhow!(
                "job {id} at once differs from alone at token {k}: {:?} vs {:?} ({} vs {} tokens)",
                b.get(k),
                a.get(k),
                b.len(),
                a.len()
            )
            .into());
        }
    }
    Ok(())
}

/// The most of the jobs posted at once (else every finished job) that were
/// streaming at one moment: from the first token's arrival to the terminal
/// event's.
fn most_at_once(w: &TestWorld) -> anyhow::Result<usize> {
    let ids: Vec<String> = if w.stream.parallel_ids.is_empty() {
        w.stream.done.keys().cloned().collect()
    } else {
        w.stream.parallel_ids.clone()
    };
    let mut edges: Vec<(Instant, i32)> = Vec::new();
    for id in &ids {
        let t = w.stream.transcript(id)?;
        let first = t.tokens().next().map(|e| t.arrival(e));
        let end = t.terminal().map(|e| t.arrival(e));
        if let (Some(a), Some(b)) = (first, end) {
            edges.push((a, 1));
            edges.push((b, -1));
        }
    }
    // An end and a start at the same instant do not overlap.
    edges.sort_by_key(|&(at, d)| (at, d));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    Ok(most as usize)
}

#[then(expr = "at least {int} of the jobs streamed at the same time")]
async fn streamed_together(w: &mut TestWorld, n: usize) -> StepResult {
    let most = most_at_once(w)?;
    check!(most >= n, "at most {most} jobs streamed at once, want {n}");
    Ok(())
}

#[then(expr = "at most {int} of the jobs streamed at the same time")]
async fn streamed_apart(w: &mut TestWorld, n: usize) -> StepResult {
    let most = most_at_once(w)?;
    check!(most <= n, "{most} jobs streamed at once, want at most {n}");
    Ok(())
}
