//! Jobs made to end in each way of M0-W-1311, and hostile request bodies and
//! model files (EXT-004).

use std::time::Duration;

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::process::exit_code;
use crate::steps::params::{Code, Ending};
use crate::steps::{table_rows, StepResult};
use crate::world::{tail, TestWorld, JOB_TIMEOUT};

/// A greedy job that runs until it is stopped.
fn long_job(id: &str) -> Value {
    json!({"job_id": id, "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0})
}

/// M0-W-1311: makes one job end in the named way.
#[when(expr = "a job ends by {ending}")]
async fn job_ends_by(w: &mut TestWorld, ending: Ending) -> StepResult {
    let id = format!("w1311-{}", ending.name());
    match ending {
        Ending::MaxTokens => {
            w.run_job(json!({"job_id": id, "prompt": "Hello", "max_tokens": 3, "temperature": 0}))
                .await?;
            want_stop(w, &id, "max_tokens")?;
        }
        Ending::StopSequence => {
            w.run_job(json!({"job_id": id, "prompt": "Count: one, two, three,", "max_tokens": 16, "temperature": 0, "stop": [","]})).await?;
            want_stop(w, &id, "stop_sequence")?;
        }
        Ending::Eos => {
            // A short chat answer: the model ends it well before 48 tokens.
            w.run_job(json!({"job_id": id, "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 48, "temperature": 0})).await?;
            want_stop(w, &id, "eos")?;
        }
        Ending::Cancel => {
            w.post_job(long_job(&id), &[]).await?;
            w.stream.live(&id)?.wait_tokens(2, JOB_TIMEOUT).await?;
            w.client()?.cancel(&id).await?;
            w.finish_job(&id, Duration::from_secs(10)).await?;
        }
        Ending::Timeout => {
            w.post_job(long_job(&id), &[]).await?;
            let t = w.finish_job(&id, Duration::from_secs(60)).await?;
            check!(
                t.error_code() == Some("INFERENCE_TIMEOUT"),
                "job {id} did not time out: {:?}",
                t.terminal()
            );
        }
        Ending::Shutdown => shutdown_with_a_queued_job(w, &id).await?,
    }
    Ok(())
}

/// A running job and a queued one, then `/shutdown`; both streams must end.
async fn shutdown_with_a_queued_job(w: &mut TestWorld, id: &str) -> anyhow::Result<()> {
    w.post_job(long_job(id), &[]).await?;
    w.stream.live(id)?.wait_tokens(1, JOB_TIMEOUT).await?;
    let queued = format!("{id}-queued");
    w.post_job(
        json!({"job_id": queued, "prompt": "Hello", "max_tokens": 4}),
        &[],
    )
    .await?;
    w.stream
        .live
        .get(&queued)
        .ok_or_else(|| anyhow!("the queued job was refused"))?
        .wait_until(Duration::from_secs(10), |ev| !ev.is_empty())
        .await?;
    let r = w.client()?.shutdown().await?;
    if r.status != 202 {
        return Err(anyhow!("/shutdown answered {}", r.status));
    }
    w.finish_all(Duration::from_secs(30)).await
}

fn want_stop(w: &TestWorld, id: &str, reason: &str) -> anyhow::Result<()> {
    let t = w.stream.transcript(id)?;
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

#[when(expr = "I send these hostile requests to \\/execute:")]
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
        w.stream.hostile.push((case, status, r));
    }
    Ok(())
}

#[then(expr = "each got its status with an {code} body")]
async fn hostile_statuses(w: &mut TestWorld, code: Code) -> StepResult {
    let mut bad = Vec::new();
    for (case, want, r) in &w.stream.hostile {
        let body_code = r
            .json()
            .ok()
            .and_then(|v| v.get("code").and_then(Value::as_str).map(str::to_owned));
        if r.status != *want || body_code.as_deref() != Some(code.0.as_str()) {
            bad.push(format!(
                "{case}: {} {:?}, want {want} {code}",
                r.status,
                tail(&r.body, 3)
            ));
        }
    }
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(expr = "each of these hostile models makes the worker exit 1 cleanly with {code}:")]
async fn hostile_models(w: &mut TestWorld, code: Code, step: &Step) -> StepResult {
    let mut bad = Vec::new();
    for row in table_rows(step)? {
        let name = row.get("model").cloned().unwrap_or_default();
        let l = w.launch(&w.fixture(&name)?)?;
        w.process.spawn(l)?;
        let worker = w.process.worker()?;
        let st = worker.wait_exit(Duration::from_secs(30)).await?;
        let log = worker.log_text();
        match st {
            None => {
                worker.stop(Duration::from_secs(1)).await;
                bad.push(format!("{name}: still running after 30 s (hang?)"));
            }
            Some(st) if exit_code(st) != 1 => bad.push(format!("{name}: exit {st}, want 1")),
            Some(_) if log.contains("panicked at") => bad.push(format!("{name}: panicked")),
            Some(_) if !log.contains(&code.0) => bad.push(format!(
                "{name}: exit 1 but no {code} in the log: {}",
                tail(&log, 3)
            )),
            Some(_) => {}
        }
    }
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}
