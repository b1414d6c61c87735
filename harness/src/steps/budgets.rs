//! Measurements against budgets.yaml (the `@bench` scenarios). Each measuring step
//! stores its samples under a fixed name; a budget step picks them by description (`{samples}`),
//! summarises them (p50/p95/p99) into the proof bundle and compares with slack.

use std::time::{Duration, Instant};

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::{json, Value};

use crate::check;
use crate::proof::Recorder;
use crate::stats::Summary;
use crate::steps::params::Samples;
use crate::steps::workspace::commands::run_line;
use crate::steps::StepResult;
use crate::world::{tail, TestWorld, JOB_TIMEOUT};

const SHORT: &str = "Name three colours.";

fn long_job(id: &str) -> Value {
    json!({"job_id": id, "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0})
}

#[when(expr = "I time {int} cold starts of the worker to \"ready\"")]
async fn cold_starts(w: &mut TestWorld, n: usize) -> StepResult {
    for _ in 0..n {
        let mut worker = crate::process::Worker::spawn(w.launch(&w.cfg.model)?)?;
        let ready = worker
            .wait_log(w.cfg.start_timeout, |l| l.event() == Some("ready"))
            .await?;
        w.budgets.push("startup_s", ready.at.as_secs_f64());
        let ev = |name: &str| worker.events(name).into_iter().next();
        let (start, done) = (
            ev("model_load_start").ok_or_else(|| anyhow!("no model_load_start"))?,
            ev("model_load_complete").ok_or_else(|| anyhow!("no model_load_complete"))?,
        );
        // Prefer the worker's own timestamps; fall back to arrival times.
        let load = match (start.timestamp(), done.timestamp()) {
            (Some(a), Some(b)) => (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6,
            _ => (done.at - start.at).as_secs_f64(),
        };
        w.budgets.push("load_s", load);
        worker.stop(Duration::from_secs(10)).await;
    }
    Ok(())
}

#[when(expr = "I run {int} sequential jobs of {int} tokens on a short prompt")]
async fn sequential(w: &mut TestWorld, n: usize, tokens: u64) -> StepResult {
    let client = w.client()?;
    for k in 0..n {
        let req = json!({"job_id": format!("bench-{k}"), "prompt": SHORT, "max_tokens": tokens, "temperature": 0, "seed": k});
        let t = client.run(&req, JOB_TIMEOUT).await?;
        Recorder::transcript(&w.scenario, &req, &t);
        let toks: Vec<_> = t.tokens().collect();
        let end = t.first("end").ok_or_else(|| {
            anyhow!(
                "job {k} did not end: {:?}",
                t.terminal().map(|e| &e.raw_data)
            )
        })?;
        if let Some(first) = toks.first() {
            w.budgets
                .push("first_token_client_ms", first.at.as_secs_f64() * 1e3);
        }
        for pair in toks.windows(2) {
            w.budgets.push(
                "inter_token_ms",
                (pair[1].at - pair[0].at).as_secs_f64() * 1e3,
            );
        }
        if let Some(ms) = end.data.get("first_token_ms").and_then(Value::as_f64) {
            w.budgets.push("first_token_worker_ms", ms);
        }
        let (out, ms) = (
            end.data.get("tokens_out").and_then(Value::as_f64),
            end.data.get("decode_time_ms").and_then(Value::as_f64),
        );
        if let (Some(out), Some(ms)) = (out, ms) {
            if ms > 0.0 {
                w.budgets.push("decode_tok_s", out / (ms / 1e3));
            }
        }
    }
    Ok(())
}

#[when(expr = "I call \\/health {int} times")]
async fn health_calls(w: &mut TestWorld, n: usize) -> StepResult {
    let client = w.client()?;
    for _ in 0..n {
        let t = Instant::now();
        let r = client.get("/health").await?;
        check!(r.status == 200, "/health answered {}", r.status);
        w.budgets.push("health_ms", t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

#[when(expr = "I cancel {int} long jobs after {int} tokens each")]
async fn cancel_many(w: &mut TestWorld, n: usize, after: usize) -> StepResult {
    let client = w.client()?;
    for k in 0..n {
        let id = format!("cancel-{k}");
        let req = long_job(&id);
        let job = client.execute(&req).await?.into_stream()?;
        job.wait_tokens(after, JOB_TIMEOUT).await?;
        let sent = Instant::now();
        let r = client.cancel(&id).await?;
        check!(r.status == 202, "/cancel answered {}", r.status);
        let t = job.finish(Duration::from_secs(10)).await?;
        let term = t
            .terminal()
            .ok_or_else(|| anyhow!("job {id} has no terminal event"))?;
        w.budgets.push(
            "cancel_ms",
            t.arrival(term)
                .saturating_duration_since(sent)
                .as_secs_f64()
                * 1e3,
        );
        Recorder::transcript(&w.scenario, &req, &t);
    }
    Ok(())
}

#[when(expr = "I time {int} SIGTERM shutdowns during a long job")]
async fn shutdowns(w: &mut TestWorld, n: usize) -> StepResult {
    for k in 0..n {
        let mut worker = w.start_other(&w.cfg.model, &w.cfg.backend).await?;
        let job = worker
            .client()
            .execute(&long_job(&format!("term-{k}")))
            .await?
            .into_stream()?;
        job.wait_tokens(2, JOB_TIMEOUT).await?;
        let sent = Instant::now();
        worker.signal(libc::SIGTERM)?;
        let st = worker.wait_exit(Duration::from_secs(60)).await?;
        let exited = worker
            .exited_at()
            .ok_or_else(|| anyhow!("the worker did not exit within 60 s of SIGTERM"))?;
        w.budgets.push(
            "shutdown_ms",
            exited.saturating_duration_since(sent).as_secs_f64() * 1e3,
        );
        check!(
            st.is_some_and(|s| s.success()),
            "shutdown {k} exited with {st:?}"
        );
        job.disconnect();
    }
    Ok(())
}

#[when(expr = "I run the criterion benchmark {string}")]
async fn criterion(w: &mut TestWorld, name: String) -> StepResult {
    // The bench target is named after the benchmark (benches/benches/NAME.rs).
    let line = format!("cargo bench -p worker-benches --bench {name} -- --output-format bencher");
    let o = run_line(&w.cfg.workspace, &line, &[])?;
    let text = o.output;
    check!(o.code == Some(0), "cargo bench failed: {}", tail(&text, 20));
    // bencher format: `test NAME ... bench:   123,456 ns/iter (+/- 789)`
    let re = regex::Regex::new(r"test (\S+)\s+\.\.\. bench:\s+([\d,]+) ns/iter").unwrap();
    let ns: Vec<f64> = re
        .captures_iter(&text)
        .filter(|c| c[1].contains(&name))
        .filter_map(|c| c[2].replace(',', "").parse().ok())
        .collect();
    check!(
        !ns.is_empty(),
        "no benchmark named like {name:?} reported a time:\n{}",
        tail(&text, 20)
    );
    for v in ns {
        w.budgets.push("execute_parse_ms", v / 1e6);
    }
    Ok(())
}

/// The statistic a budget key asks for.
fn statistic(budget: &str) -> &'static str {
    if budget.ends_with("_p95") {
        "p95"
    } else if budget.ends_with("_p99") {
        "p99"
    } else if budget.starts_with("decode_tok_s_min") {
        "p50"
    } else if budget == "execute_parse_ms" {
        "mean"
    } else {
        "max"
    }
}

#[then(expr = "the {string} budget holds for {samples}")]
async fn budget_holds(w: &mut TestWorld, budget: String, what: Samples) -> StepResult {
    let key = what.key(&budget)?;
    let samples = w.budgets.samples(key).to_vec();
    let summary = Summary::of(&samples).ok_or_else(|| anyhow!("no {key} samples were taken"))?;
    Recorder::measurement(
        &w.scenario,
        key,
        if key.ends_with("_s") {
            "s"
        } else if key == "decode_tok_s" {
            "tok/s"
        } else {
            "ms"
        },
        &samples,
    );
    let stat = statistic(&budget);
    let v = w
        .cfg
        .budgets
        .check(&w.cfg.backend, &budget, summary.stat(stat))?;
    println!("{budget}: {stat} of {} {key} samples = {:.3} (budget {}, {:?}, slack {}; p50 {:.3} p95 {:.3} p99 {:.3})", summary.n, v.measured, v.budget, v.bound, v.slack, summary.p50, summary.p95, summary.p99);
    let met = v.met;
    let line = format!(
        "{budget}: {stat} {:.3} against {} ({:?}, slack {})",
        v.measured, v.budget, v.bound, v.slack
    );
    Recorder::verdict(&w.scenario, v);
    check!(met, "budget missed: {line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn budget_keys_pick_their_statistic() {
        assert_eq!(super::statistic("first_token_ms_p95"), "p95");
        assert_eq!(super::statistic("health_ms_p99"), "p99");
        assert_eq!(super::statistic("decode_tok_s_min.x"), "p50");
        assert_eq!(super::statistic("shutdown_ms_max"), "max");
        assert_eq!(super::statistic("load_s.x"), "max");
    }
}
