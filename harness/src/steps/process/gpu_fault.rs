//! A GPU fault mid-job (EXT-047.2): a worker built with the worker's
//! `fault-injection` feature (its path in `HARNESS_FAULT_WORKER`) makes its
//! next kernel launch fail as a kernel fault does (`CUDA_ERROR_ILLEGAL_ADDRESS`,
//! sticky) when it gets SIGUSR1.

use anyhow::{anyhow, Context};
use cucumber::{given, then, when};
use serde_json::json;

use crate::check;
use crate::events;
use crate::steps::StepResult;
use crate::world::{TestWorld, JOB_TIMEOUT};

/// Ids of the jobs the scenario started.
fn fault_jobs(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("fault-{i}")).collect()
}

#[given(expr = "a worker built with fault injection on the reference model with --parallel {int}")]
async fn fault_worker(w: &mut TestWorld, parallel: usize) -> StepResult {
    let bin = std::env::var_os("HARNESS_FAULT_WORKER").ok_or_else(|| {
        anyhow!("HARNESS_FAULT_WORKER is not set: build `cargo build --release -p worker-orcd --features fault-injection` and name that binary")
    })?;
    let model = w.cfg.model.clone();
    let mut l = w.launch(&model)?;
    l.bin = bin.into();
    l.set("--parallel", Some(&parallel.to_string()));
    w.start_ready(l).await?;
    Ok(())
}

/// Jobs that run until stopped: the end-of-text and chat-end tokens are
/// banned (`logit_bias`) and `max_tokens` is large.
#[when(expr = "I start {int} jobs that do not end by themselves")]
async fn start_endless(w: &mut TestWorld, n: usize) -> StepResult {
    for id in fault_jobs(n) {
        let body = json!({"job_id": id, "prompt": "Tell me a long story.", "max_tokens": 2000,
                          "temperature": 1.0, "seed": 7, "logit_bias": {"0": -100, "1": -100, "2": -100}});
        w.post_job(body, &[]).await?;
        check!(w.stream.live.contains_key(&id), "job {id} was refused");
    }
    Ok(())
}

#[when(expr = "each of the {int} jobs has streamed {int} tokens")]
async fn each_streamed(w: &mut TestWorld, n: usize, tokens: usize) -> StepResult {
    for id in fault_jobs(n) {
        w.stream.live(&id)?.wait_tokens(tokens, JOB_TIMEOUT).await?;
    }
    Ok(())
}

#[when(expr = "the worker's next kernel launch fails")]
async fn inject(w: &mut TestWorld) -> StepResult {
    w.process
        .worker()?
        .signal(libc::SIGUSR1)
        .context("sending SIGUSR1")?;
    Ok(())
}

#[then(expr = "each of the {int} jobs ended with one error {string}, retriable")]
async fn each_failed(w: &mut TestWorld, n: usize, code: String) -> StepResult {
    for id in fault_jobs(n) {
        let t = w.settle(&id).await?;
        let bad = events::check_order(&t.events);
        check!(bad.is_empty(), "job {id}: {}", bad.join("; "));
        let last = t
            .events
            .last()
            .ok_or_else(|| anyhow!("job {id} has no event"))?;
        check!(
            last.kind == "error" && t.error_code() == Some(code.as_str()),
            "job {id} ended with {:?}",
            (&last.kind, &last.raw_data)
        );
        check!(
            last.data["retriable"] == json!(true),
            "job {id}: {}",
            last.raw_data
        );
    }
    Ok(())
}
