//! Parity logs (EXT-001): the worker's `--parity-log`, compared with `harness parity`.

use std::path::PathBuf;

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::parity::{compare, read_log, Tolerance};
use crate::proof::Recorder;
use crate::steps::params::{Divergence, ParityCmd};
use crate::steps::StepResult;
use crate::world::{TestWorld, JOB_TIMEOUT};

fn path(w: &mut TestWorld, p: &str) -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(w.expand(p)?))
}

#[then(expr = "{string} has one parity record per token of job {string}")]
async fn one_per_token(w: &mut TestWorld, file: String, id: String) -> StepResult {
    let ids = w.settle(&id).await?.token_ids();
    let recs = read_log(&path(w, &file)?)?;
    let logged: Vec<i64> = recs.iter().map(|r| r.id).collect();
    check!(
        logged == ids,
        "parity log ids {logged:?} != streamed ids {ids:?}"
    );
    let steps: Vec<u64> = recs.iter().map(|r| r.step).collect();
    check!(
        steps.windows(2).all(|p| p[1] == p[0] + 1),
        "steps are not consecutive: {steps:?}"
    );
    check!(
        recs.iter()
            .all(|r| r.logits.as_ref().is_some_and(|l| !l.top.is_empty())),
        "a record lacks logits.top"
    );
    check!(
        recs.iter().all(|r| !r.checkpoints.is_empty()),
        "a record has no checkpoints"
    );
    Ok(())
}

fn run_parity(w: &mut TestWorld, a: &str, b: &str) -> anyhow::Result<crate::parity::Report> {
    let (a, b) = (path(w, a)?, path(w, b)?);
    let r = compare(&read_log(&a)?, &read_log(&b)?, Tolerance::default());
    Recorder::note(
        "parity",
        json!({"scenario": w.scenario, "a": a, "b": b, "report": r}),
    );
    Ok(r)
}

#[then(expr = "{parity_cmd} reports {divergence}")]
async fn reports(w: &mut TestWorld, cmd: ParityCmd, want: Divergence) -> StepResult {
    let r = run_parity(w, &cmd.0, &cmd.1)?;
    let Some(at) = want.0 else {
        check!(!r.diverged(), "{}", r.human());
        return Ok(());
    };
    let first = r
        .first_divergence
        .as_ref()
        .ok_or_else(|| anyhow!("no divergence reported:\n{}", r.human()))?;
    check!(
        first.step == at,
        "first divergence at step {}, want {at}:\n{}",
        first.step,
        r.human()
    );
    Ok(())
}

#[when(expr = "I doctor step {int}'s logits in {string} as {string}")]
async fn doctor(w: &mut TestWorld, at: u64, from: String, to: String) -> StepResult {
    let text = std::fs::read_to_string(path(w, &from)?)?;
    let mut out = String::new();
    let mut hit = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut v: Value = serde_json::from_str(line)?;
        if v["step"].as_u64() == Some(at) {
            // Either layout: `logits.top: [[id, logit]]` or `top_logits: [{id, logit}]`.
            if let Some(top) = v
                .get_mut("logits")
                .and_then(|l| l.get_mut("top"))
                .and_then(Value::as_array_mut)
            {
                for pair in top.iter_mut() {
                    pair[1] = json!(pair[1].as_f64().unwrap_or(0.0) + 1.0);
                }
                hit = true;
            } else if let Some(top) = v.get_mut("top_logits").and_then(Value::as_array_mut) {
                for item in top.iter_mut() {
                    item["logit"] = json!(item["logit"].as_f64().unwrap_or(0.0) + 1.0);
                }
                hit = true;
            }
        }
        out.push_str(&v.to_string());
        out.push('\n');
    }
    check!(hit, "step {at} has no logits.top to doctor");
    std::fs::write(path(w, &to)?, out)?;
    Ok(())
}

#[then(expr = "on cuda the parity logs of the CPU and CUDA backends for this job diff clean")]
async fn cpu_vs_cuda(w: &mut TestWorld) -> StepResult {
    if w.cfg.backend != "cuda" {
        return Ok(());
    }
    let req = w.stream.request("ext001-a")?.clone();
    let dir = w.scratch.clone();
    std::fs::create_dir_all(&dir)?;
    let model = w.cfg.model.clone();
    let mut launch = w.launch_for(&model, "cpu")?;
    launch.set(
        "--parity-log",
        Some(&dir.join("cpu.jsonl").display().to_string()),
    );
    let mut cpu = crate::process::Worker::spawn(launch)?;
    cpu.wait_healthy(w.cfg.start_timeout).await?;
    cpu.client().run(&req, JOB_TIMEOUT).await?;
    cpu.stop(std::time::Duration::from_secs(10)).await;
    let r = compare(
        &read_log(&dir.join("a.jsonl"))?,
        &read_log(&dir.join("cpu.jsonl"))?,
        Tolerance::default(),
    );
    Recorder::note(
        "parity",
        json!({"scenario": w.scenario, "a": "cuda", "b": "cpu", "report": r}),
    );
    check!(!r.diverged(), "{}", r.human());
    Ok(())
}
