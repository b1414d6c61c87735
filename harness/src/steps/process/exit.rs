//! Signals, stops and exits; whether and when the worker listened while it started.

use std::time::Duration;

use anyhow::{anyhow, Context};
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::process::exit_code;
use crate::steps::params::{StartOutcome, Stop};
use crate::steps::process::logs::{mentions, no_panic};
use crate::steps::StepResult;
use crate::world::{tail, Poll, TestWorld};

#[then(expr = "the worker becomes healthy within {int} s")]
async fn becomes_healthy(w: &mut TestWorld, secs: u64) -> StepResult {
    w.process
        .worker()?
        .wait_healthy(Duration::from_secs(secs))
        .await?;
    Ok(())
}

#[then(expr = "the worker exits with code {int} within {int} s")]
pub async fn exits_with(w: &mut TestWorld, code: i32, secs: u64) -> StepResult {
    let st = w
        .process
        .worker()?
        .wait_exit(Duration::from_secs(secs))
        .await?;
    w.process.stop_polling();
    let st = st.ok_or_else(|| anyhow!("the worker still runs after {secs} s"))?;
    check!(
        exit_code(st) == code,
        "the worker exited with {} ({st}), want {code}",
        exit_code(st)
    );
    Ok(())
}

#[then(expr = "the worker never listened")]
async fn never_listened(w: &mut TestWorld) -> StepResult {
    let polls = w.process.polls();
    let answered: Vec<&Poll> = polls.iter().filter(|p| !p.refused).collect();
    check!(
        answered.is_empty(),
        "{} of {} /health polls were answered: {:?}",
        answered.len(),
        polls.len(),
        answered.first()
    );
    let events = w.process.worker()?.events("ready");
    check!(events.is_empty(), "the worker logged ready");
    Ok(())
}

#[then(expr = "the peak RssAnon while loading stayed under {int} MiB")]
async fn rss_under(w: &mut TestWorld, mib: u64) -> StepResult {
    let peak = w
        .process
        .rss_peak_kib
        .ok_or_else(|| anyhow!("memory was not sampled"))?;
    check!(
        peak > 0 && peak < mib * 1024,
        "peak RssAnon {} KiB, limit {} MiB",
        peak,
        mib
    );
    Ok(())
}

#[when(expr = "I stop the worker")]
async fn stop_worker(w: &mut TestWorld) -> StepResult {
    w.process.stop_polling();
    w.stream.disconnect_all();
    if let Some(worker) = w.process.worker.as_mut() {
        worker.stop(Duration::from_secs(30)).await;
    }
    Ok(())
}

#[when(expr = "I kill the second worker")]
async fn kill_second(w: &mut TestWorld) -> StepResult {
    w.process.second()?.signal(libc::SIGKILL)?;
    Ok(())
}

#[then(expr = "the second worker has exited")]
async fn second_exited(w: &mut TestWorld) -> StepResult {
    let s = w.process.second()?;
    check!(
        s.wait_exit(Duration::from_secs(10)).await?.is_some(),
        "the second worker still runs"
    );
    Ok(())
}

#[when(expr = "I send SIGTERM to the worker")]
async fn sigterm(w: &mut TestWorld) -> StepResult {
    w.process.worker()?.signal(libc::SIGTERM)?;
    Ok(())
}

/// SIGTERM waits until `/health` says it was seen, so the steps after this one
/// test the shutdown itself and not the signal's delivery time.
#[when(expr = "I shut the worker down by {stop}")]
async fn shut_down(w: &mut TestWorld, how: Stop) -> StepResult {
    let client = w.client()?;
    if how == Stop::Sigterm {
        w.process.worker()?.signal(libc::SIGTERM)?;
        let seen = async {
            loop {
                // Any status: /health may answer 503 once shutting down.
                let h = client.get("/health").await.and_then(|r| r.json());
                if h.is_ok_and(|h| h["shutting_down"] == true) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        check!(
            tokio::time::timeout(Duration::from_secs(5), seen)
                .await
                .is_ok(),
            "/health did not report shutting_down within 5 s of SIGTERM"
        );
    } else {
        let r = client
            .raw(reqwest::Method::POST, "/shutdown", None, Vec::new(), &[])
            .await?;
        check!(
            r.status == 202,
            "POST /shutdown with an empty body answered {} {}, want 202",
            r.status,
            r.body
        );
    }
    Ok(())
}

#[then(expr = "the worker is a separate child process of the suite")]
async fn child_process(w: &mut TestWorld) -> StepResult {
    let pid = w.process.worker()?.pid;
    check!(
        pid != std::process::id(),
        "the worker runs in the suite's own process"
    );
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .context("reading the worker's /proc stat")?;
    // Field 4 (after the parenthesised command) is the parent pid.
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let ppid: u32 = after
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    check!(
        ppid == std::process::id(),
        "the worker's parent is {ppid}, not the suite ({})",
        std::process::id()
    );
    Ok(())
}

#[then(expr = "\\/health was refused until the model was loaded and healthy after \"ready\"")]
async fn refused_until_loaded(w: &mut TestWorld) -> StepResult {
    let polls = w.process.polls();
    let worker = w.process.worker()?;
    let loaded = worker
        .events("model_load_complete")
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no model_load_complete record"))?;
    let loaded_at = loaded
        .timestamp()
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or_else(|| worker.spawned_wall + chrono::Duration::from_std(loaded.at).unwrap());
    check!(
        polls.iter().any(|p| p.refused),
        "no /health poll was refused before the load finished ({} polls)",
        polls.len()
    );
    if let Some(early) = polls.iter().find(|p| !p.refused && p.sent_wall < loaded_at) {
        return Err(anyhow!(
            "/health answered {:?} at {} before model_load_complete at {loaded_at}",
            early.status,
            early.sent_wall
        )
        .into());
    }
    let odd: Vec<&Poll> = polls
        .iter()
        .filter(|p| !p.refused && p.status.as_deref() != Some("healthy"))
        .collect();
    check!(
        odd.is_empty(),
        "polls that were neither refused nor healthy: {odd:?}"
    );
    check!(
        polls.iter().any(|p| p.status.as_deref() == Some("healthy")),
        "no poll saw healthy"
    );
    Ok(())
}

#[then(expr = "the start {outcome}")]
async fn the_start(w: &mut TestWorld, outcome: StartOutcome) -> StepResult {
    match outcome {
        StartOutcome::Serves { tokenizer } => serves(w, tokenizer).await,
        StartOutcome::FailsNaming(name) => {
            exits_with(w, 1, 30).await?;
            no_panic(w).await?;
            mentions(w, crate::steps::params::Names(vec![name])).await
        }
    }
}

/// The worker becomes healthy (with that tokenizer) and streams a 2-token job.
async fn serves(w: &mut TestWorld, tokenizer: Option<String>) -> StepResult {
    let timeout = w.cfg.start_timeout;
    let worker = w.process.worker()?;
    let h = match worker.wait_healthy(timeout).await {
        Ok(h) => h,
        Err(e) => return Err(anyhow!("{e}\n{}", tail(&worker.log_text(), 20)).into()),
    };
    check!(
        h.get("status").and_then(Value::as_str) == Some("healthy"),
        "/health: {h}"
    );
    if let Some(kind) = tokenizer {
        check!(
            h.get("tokenizer_kind").and_then(Value::as_str) == Some(kind.as_str()),
            "tokenizer_kind {:?}, want {kind}",
            h.get("tokenizer_kind")
        );
    }
    let job = json!({"job_id": "start-check", "prompt": "Count: 1, 2, 3,", "max_tokens": 2, "temperature": 0});
    w.post_job(job, &[]).await?;
    let t = w
        .finish_job("start-check", Duration::from_secs(120))
        .await?;
    check!(
        t.tokens().count() >= 1 && t.first("end").is_some(),
        "a 2-token job on it did not stream and end: {:?}",
        t.events.iter().map(|e| &e.kind).collect::<Vec<_>>()
    );
    Ok(())
}

#[then(expr = "without a GPU it exits 1 suggesting {string}, and with one it serves on {string}")]
async fn default_backend(w: &mut TestWorld, hint: String, backend: String) -> StepResult {
    if crate::suite::gpu_present() {
        let timeout = w.cfg.start_timeout;
        let h = w.process.worker()?.wait_healthy(timeout).await?;
        check!(
            h.get("backend").and_then(Value::as_str) == Some(backend.as_str()),
            "a default start on a GPU host reports backend {:?}",
            h.get("backend")
        );
    } else {
        exits_with(w, 1, 30).await?;
        mentions(w, crate::steps::params::Names(vec![hint])).await?;
    }
    Ok(())
}
