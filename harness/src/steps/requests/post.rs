//! Posting jobs to `/execute` and running them to their end; concurrent posts,
//! reruns, waiting on a running job and disconnecting from it.

use std::time::Duration;

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::client::Reply;
use crate::steps::params::Header;
use crate::steps::{json_docstring, StepResult};
use crate::world::{job_id, TestWorld, JOB_TIMEOUT};

#[when(expr = "I run the job:")]
async fn run_job(w: &mut TestWorld, step: &Step) -> StepResult {
    let b = json_docstring(w, step)?;
    w.run_job(b).await?;
    Ok(())
}

#[when(expr = "I start the job:")]
async fn start_job(w: &mut TestWorld, step: &Step) -> StepResult {
    let b = json_docstring(w, step)?;
    let id = job_id(&b);
    w.post_job(b, &[]).await?;
    check!(
        w.stream.live.contains_key(&id),
        "job {id} was refused: {:?}",
        w.stream.reply.as_ref().map(|r| (r.status, &r.body))
    );
    Ok(())
}

#[when(expr = "I run this job {int} times:")]
async fn run_n(w: &mut TestWorld, n: usize, step: &Step) -> StepResult {
    let b = json_docstring(w, step)?;
    let base = job_id(&b);
    for k in 1..=n {
        let mut bk = b.clone();
        let id = format!("{base}-{k}");
        bk["job_id"] = json!(id);
        w.run_job(bk).await?;
        w.stream.repeat_ids.push(id);
    }
    Ok(())
}

/// Posts a body; a stream is run to its end and stands as a plain 200 reply
/// with its content type, so reply steps can check either.
async fn post_and_finish(w: &mut TestWorld, b: Value, headers: &[(&str, &str)]) -> StepResult {
    let id = job_id(&b);
    w.stream.reply = None;
    w.post_job(b, headers).await?;
    if w.stream.live.contains_key(&id) {
        let t = w.finish_job(&id, JOB_TIMEOUT).await?;
        let ct = t.content_type.clone();
        w.stream.reply = Some(Reply {
            status: 200,
            headers: vec![("content-type".into(), ct)],
            body: String::new(),
            elapsed: Duration::ZERO,
        });
    }
    Ok(())
}

#[when(expr = "I post to \\/execute{header}:")]
async fn post_execute(w: &mut TestWorld, header: Header, step: &Step) -> StepResult {
    let b = json_docstring(w, step)?;
    match &header.0 {
        None => post_and_finish(w, b, &[]).await,
        Some((name, value)) => post_and_finish(w, b, &[(name, value)]).await,
    }
}

#[when(expr = "I post to \\/execute the body {}")]
async fn post_inline(w: &mut TestWorld, text: String) -> StepResult {
    let b: Value = serde_json::from_str(&text).with_context(|| format!("not JSON: {text}"))?;
    post_and_finish(w, b, &[]).await
}

/// The step's docstring, expanded, as a JSON array of job bodies.
pub(super) fn job_list(w: &mut TestWorld, step: &Step) -> anyhow::Result<Vec<Value>> {
    let list = json_docstring(w, step)?;
    list.as_array()
        .cloned()
        .ok_or_else(|| anyhow!("want a JSON array of job bodies"))
}

/// Posts every body at once, each stream filed as a live job.
pub(super) async fn post_all(w: &mut TestWorld, bodies: &[Value]) -> anyhow::Result<()> {
    let client = w.client()?;
    let posts = bodies.iter().map(|b| {
        let c = client.clone();
        let b = b.clone();
        async move { c.execute(&b).await }
    });
    let results = futures::future::join_all(posts).await;
    for (b, r) in bodies.iter().zip(results) {
        w.stream.file(&w.scenario, b.clone(), r?);
    }
    Ok(())
}

#[when(expr = "I post these jobs at once:")]
async fn post_at_once(w: &mut TestWorld, step: &Step) -> StepResult {
    let bodies = job_list(w, step)?;
    post_all(w, &bodies).await?;
    Ok(())
}

#[when(expr = "all jobs end")]
async fn all_end(w: &mut TestWorld) -> StepResult {
    w.finish_all(JOB_TIMEOUT).await?;
    Ok(())
}

#[when(expr = "I rerun job {string} as {string} with the seed it reported")]
async fn rerun_with_seed(w: &mut TestWorld, from: String, to: String) -> StepResult {
    let seed = w
        .stream
        .transcript(&from)?
        .first("started")
        .and_then(|e| e.data.get("seed"))
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("job {from}'s started event has no u64 seed"))?;
    let mut b = w.stream.request(&from)?.clone();
    b["job_id"] = json!(to);
    b["seed"] = json!(seed);
    w.run_job(b).await?;
    Ok(())
}

#[when(expr = "job {string} has streamed {int} tokens")]
async fn has_streamed(w: &mut TestWorld, id: String, n: usize) -> StepResult {
    w.stream.live(&id)?.wait_tokens(n, JOB_TIMEOUT).await?;
    Ok(())
}

#[when(expr = "job {string} has streamed its started event")]
async fn has_started(w: &mut TestWorld, id: String) -> StepResult {
    w.stream
        .live(&id)?
        .wait_until(Duration::from_secs(30), |ev| {
            ev.iter().any(|e| e.kind == "started")
        })
        .await?;
    Ok(())
}

#[then(expr = "job {string} ends within {int} s")]
async fn ends_within(w: &mut TestWorld, id: String, secs: u64) -> StepResult {
    w.finish_job(&id, Duration::from_secs(secs)).await?;
    Ok(())
}

#[when(expr = "I disconnect from job {string}")]
async fn disconnect(w: &mut TestWorld, id: String) -> StepResult {
    let job = w
        .stream
        .live
        .remove(&id)
        .ok_or_else(|| anyhow!("job {id} is not running"))?;
    let events = job.disconnect();
    check!(
        !events.iter().any(|e| e.kind == "end" || e.kind == "error"),
        "job {id} had already ended before the disconnect"
    );
    Ok(())
}
