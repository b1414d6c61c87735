//! Posting jobs to `/execute`, running them to their end, concurrent posts,
//! disconnects, the job kinds of M0-W-1311 and hostile request bodies (EXT-004).

use std::time::Duration;

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::{given, then, when};
use serde_json::{json, Value};

use super::{docstring, table_rows, StepResult};
use crate::check;
use crate::client::{Execute, Reply};
use crate::world::TestWorld;

/// The longest a job of this suite may take (a 2048-token job is always cancelled earlier).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(300);

pub fn body(w: &mut TestWorld, step: &Step) -> anyhow::Result<Value> {
    let text = w.expand(docstring(step)?)?;
    serde_json::from_str(&text).with_context(|| format!("docstring is not JSON: {text}"))
}

fn job_id(v: &Value) -> String {
    v.get("job_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

#[when(regex = r"^I run the job:$")]
#[given(regex = r"^I run the job:$")]
async fn run_job(w: &mut TestWorld, step: &Step) -> StepResult {
    let b = body(w, step)?;
    let id = job_id(&b);
    w.post_job(b, &[]).await?;
    w.finish_job(&id, JOB_TIMEOUT).await?;
    Ok(())
}

#[when(regex = r"^I start the job:$")]
async fn start_job(w: &mut TestWorld, step: &Step) -> StepResult {
    let b = body(w, step)?;
    let id = job_id(&b);
    w.post_job(b, &[]).await?;
    check!(
        w.live.contains_key(&id),
        "job {id} was refused: {:?}",
        w.reply.as_ref().map(|r| (r.status, &r.body))
    );
    Ok(())
}

#[when(regex = r"^I run this job (\d+) times:$")]
async fn run_n(w: &mut TestWorld, n: usize, step: &Step) -> StepResult {
    let b = body(w, step)?;
    let base = job_id(&b);
    for k in 1..=n {
        let mut bk = b.clone();
        let id = format!("{base}-{k}");
        bk["job_id"] = json!(id);
        w.post_job(bk, &[]).await?;
        w.finish_job(&id, JOB_TIMEOUT).await?;
        w.repeat_ids.push(id);
    }
    Ok(())
}

/// A stream's reply as a plain `Reply` so reply steps can check it.
fn stream_reply(content_type: &str) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type".into(), content_type.into())],
        body: String::new(),
        elapsed: Duration::ZERO,
    }
}

async fn post_and_finish(w: &mut TestWorld, b: Value, headers: &[(&str, &str)]) -> StepResult {
    let id = job_id(&b);
    w.reply = None;
    w.post_job(b, headers).await?;
    if w.live.contains_key(&id) {
        let t = w.finish_job(&id, JOB_TIMEOUT).await?;
        let ct = t.content_type.clone();
        w.reply = Some(stream_reply(&ct));
    }
    Ok(())
}

#[when(regex = r"^I post to /execute:$")]
async fn post_execute(w: &mut TestWorld, step: &Step) -> StepResult {
    let b = body(w, step)?;
    post_and_finish(w, b, &[]).await
}

#[when(regex = r#"^I post to /execute with header "([^:]+): (.+)":$"#)]
async fn post_with_header(
    w: &mut TestWorld,
    name: String,
    value: String,
    step: &Step,
) -> StepResult {
    let b = body(w, step)?;
    post_and_finish(w, b, &[(&name, &value)]).await
}

#[when(regex = r"^I post to /execute the body (.+)$")]
async fn post_inline(w: &mut TestWorld, text: String) -> StepResult {
    let b: Value = serde_json::from_str(&text).with_context(|| format!("not JSON: {text}"))?;
    post_and_finish(w, b, &[]).await
}

#[when(regex = r"^I post these jobs at once:$")]
async fn post_at_once(w: &mut TestWorld, step: &Step) -> StepResult {
    let list = body(w, step)?;
    let bodies = list
        .as_array()
        .ok_or_else(|| anyhow!("want a JSON array of job bodies"))?
        .clone();
    let client = w.client()?;
    let posts = bodies.iter().map(|b| {
        let c = client.clone();
        let b = b.clone();
        async move { c.execute(&b).await }
    });
    let results = futures::future::join_all(posts).await;
    for (b, r) in bodies.into_iter().zip(results) {
        let id = job_id(&b);
        w.requests.insert(id.clone(), b);
        w.posted.push(id.clone());
        match r? {
            Execute::Stream(j) => {
                w.live.insert(id, j);
            }
            Execute::Refused(r) => {
                crate::proof::Recorder::refusal(&w.scenario, &id, r.status, &r.body);
                w.refused.push((id, r.clone()));
                w.reply = Some(r);
            }
        }
    }
    Ok(())
}

#[when(regex = r"^all jobs end$")]
async fn all_end(w: &mut TestWorld) -> StepResult {
    w.finish_all(JOB_TIMEOUT).await?;
    Ok(())
}

#[when(regex = r#"^I rerun job "([^"]+)" as "([^"]+)" with the seed it reported$"#)]
async fn rerun_with_seed(w: &mut TestWorld, from: String, to: String) -> StepResult {
    let t = w.transcript(&from)?;
    let seed = t
        .first("started")
        .and_then(|e| e.data.get("seed"))
        .and_then(Value::as_u64)
        .ok_or_else(|| anyhow!("job {from}'s started event has no u64 seed"))?;
    let mut b = w
        .requests
        .get(&from)
        .cloned()
        .ok_or_else(|| anyhow!("no request {from}"))?;
    b["job_id"] = json!(to);
    b["seed"] = json!(seed);
    w.post_job(b, &[]).await?;
    w.finish_job(&to, JOB_TIMEOUT).await?;
    Ok(())
}

#[when(regex = r#"^job "([^"]+)" has streamed (\d+) tokens$"#)]
#[given(regex = r#"^job "([^"]+)" has streamed (\d+) tokens$"#)]
async fn has_streamed(w: &mut TestWorld, id: String, n: usize) -> StepResult {
    let job = w
        .live
        .get(&id)
        .ok_or_else(|| anyhow!("job {id} is not running"))?;
    job.wait_tokens(n, JOB_TIMEOUT).await?;
    Ok(())
}

#[when(regex = r#"^job "([^"]+)" has streamed its started event$"#)]
async fn has_started(w: &mut TestWorld, id: String) -> StepResult {
    let job = w
        .live
        .get(&id)
        .ok_or_else(|| anyhow!("job {id} is not running"))?;
    job.wait_until(Duration::from_secs(30), |ev| {
        ev.iter().any(|e| e.kind == "started")
    })
    .await?;
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" ends within (\d+) s$"#)]
async fn ends_within(w: &mut TestWorld, id: String, secs: u64) -> StepResult {
    w.finish_job(&id, Duration::from_secs(secs)).await?;
    Ok(())
}

#[when(regex = r#"^I disconnect from job "([^"]+)"$"#)]
async fn disconnect(w: &mut TestWorld, id: String) -> StepResult {
    let job = w
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

/// M0-W-1311: makes one job end in the named way.
#[when(regex = r#"^a job ends by "([^"]+)"$"#)]
async fn job_ends_by(w: &mut TestWorld, kind: String) -> StepResult {
    let long = json!({"job_id": format!("w1311-{kind}"), "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0});
    let id = format!("w1311-{kind}");
    match kind.as_str() {
        "max_tokens" => {
            w.post_job(
                json!({"job_id": id, "prompt": "Hello", "max_tokens": 3, "temperature": 0}),
                &[],
            )
            .await?;
            w.finish_job(&id, JOB_TIMEOUT).await?;
            want_stop(w, &id, "max_tokens")?;
        }
        "stop_sequence" => {
            w.post_job(json!({"job_id": id, "prompt": "Count: one, two, three,", "max_tokens": 16, "temperature": 0, "stop": [","]}), &[]).await?;
            w.finish_job(&id, JOB_TIMEOUT).await?;
            want_stop(w, &id, "stop_sequence")?;
        }
        "eos" => {
            // A short chat answer: the model ends it well before 48 tokens.
            w.post_job(json!({"job_id": id, "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 48, "temperature": 0}), &[]).await?;
            w.finish_job(&id, JOB_TIMEOUT).await?;
            want_stop(w, &id, "eos")?;
        }
        "cancel" => {
            w.post_job(long, &[]).await?;
            w.live[&id].wait_tokens(2, JOB_TIMEOUT).await?;
            w.client()?.cancel(&id).await?;
            w.finish_job(&id, Duration::from_secs(10)).await?;
        }
        "timeout" => {
            w.post_job(long, &[]).await?;
            w.finish_job(&id, Duration::from_secs(60)).await?;
            check!(
                w.transcript(&id)?.error_code() == Some("INFERENCE_TIMEOUT"),
                "job {id} did not time out: {:?}",
                w.transcript(&id)?.terminal()
            );
        }
        "shutdown" => {
            w.post_job(long, &[]).await?;
            w.live[&id].wait_tokens(1, JOB_TIMEOUT).await?;
            let queued = format!("{id}-queued");
            w.post_job(
                json!({"job_id": queued, "prompt": "Hello", "max_tokens": 4}),
                &[],
            )
            .await?;
            w.live
                .get(&queued)
                .ok_or_else(|| anyhow!("the queued job was refused"))?
                .wait_until(Duration::from_secs(10), |ev| !ev.is_empty())
                .await?;
            let r = w.client()?.shutdown().await?;
            check!(r.status == 202, "/shutdown answered {}", r.status);
            w.finish_all(Duration::from_secs(30)).await?;
        }
        other => return Err(anyhow!("unknown job kind {other}").into()),
    }
    Ok(())
}

fn want_stop(w: &TestWorld, id: &str, reason: &str) -> anyhow::Result<()> {
    let t = w.transcript(id)?;
    let got = t
        .first("end")
        .and_then(|e| e.data.get("stop_reason"))
        .and_then(Value::as_str);
    if got != Some(reason) {
        return Err(anyhow!(
            "job {id} ended with {:?}, want stop_reason {reason}",
            t.terminal().map(|e| &e.raw_data)
        ));
    }
    Ok(())
}

/// EXT-004: hostile bodies by name.
fn hostile_request(case: &str) -> anyhow::Result<(Option<&'static str>, Vec<u8>)> {
    let json_ct = Some("application/json");
    Ok(match case {
        "malformed JSON" => (json_ct, br#"{"job_id": "h", "prompt": "hi""#.to_vec()),
        "invalid UTF-8" => (
            json_ct,
            b"{\"job_id\": \"h\", \"prompt\": \"\xff\xfe\xfd\"}".to_vec(),
        ),
        "wrong content type" => (
            Some("text/plain"),
            br#"{"job_id": "h", "prompt": "hi"}"#.to_vec(),
        ),
        "oversized body" => (
            json_ct,
            format!(r#"{{"job_id": "h", "prompt": "{}"}}"#, "a".repeat(8 << 20)).into_bytes(),
        ),
        "JSON array" => (json_ct, br#"[{"job_id": "h", "prompt": "hi"}]"#.to_vec()),
        "deep nesting" => (
            json_ct,
            format!(
                r#"{{"job_id": "h", "prompt": "hi", "stop": {}{}}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            )
            .into_bytes(),
        ),
        other => return Err(anyhow!("unknown hostile case {other:?}")),
    })
}

#[when(regex = r"^I send these hostile requests to /execute:$")]
async fn hostile_requests(w: &mut TestWorld, step: &Step) -> StepResult {
    let client = w.client()?;
    for row in table_rows(step)? {
        let case = row.get("case").cloned().unwrap_or_default();
        let status: u16 = row
            .get("status")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("row without a status"))?;
        let (ct, bytes) = hostile_request(&case)?;
        let r = client
            .raw(reqwest::Method::POST, "/execute", ct, bytes, &[])
            .await
            .with_context(|| format!("hostile case {case}"))?;
        w.hostile.push((case, status, r));
    }
    Ok(())
}

#[then(regex = r#"^each got its status with an "([^"]+)" body$"#)]
async fn hostile_statuses(w: &mut TestWorld, code: String) -> StepResult {
    let mut bad = Vec::new();
    for (case, want, r) in &w.hostile {
        let body_code = r
            .json()
            .ok()
            .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned));
        if r.status != *want || body_code.as_deref() != Some(code.as_str()) {
            bad.push(format!(
                "{case}: {} {:?}, want {want} {code}",
                r.status,
                crate::world::tail(&r.body, 3)
            ));
        }
    }
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(regex = r#"^each of these hostile models makes the worker exit 1 cleanly with "([^"]+)":$"#)]
async fn hostile_models(w: &mut TestWorld, code: String, step: &Step) -> StepResult {
    let mut bad = Vec::new();
    for row in table_rows(step)? {
        let name = row.get("model").cloned().unwrap_or_default();
        let path = w.fixture(&name)?;
        let l = w.launch(&path)?;
        w.spawn(l)?;
        let worker = w.worker()?;
        let st = worker.wait_exit(Duration::from_secs(30)).await?;
        let log = worker.log_text();
        match st {
            None => {
                worker.stop(Duration::from_secs(1)).await;
                bad.push(format!("{name}: still running after 30 s (hang?)"));
            }
            Some(st) if crate::process::exit_code(st) != 1 => {
                bad.push(format!("{name}: exit {st}, want 1"))
            }
            Some(_) if log.contains("panicked at") => bad.push(format!("{name}: panicked")),
            Some(_) if !log.contains(&code) => bad.push(format!(
                "{name}: exit 1 but no {code} in the log: {}",
                crate::world::tail(&log, 3)
            )),
            Some(_) => {}
        }
    }
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}
