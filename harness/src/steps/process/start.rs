//! Starting workers: on which model, with which flags, environment and config file.

use std::time::{Duration, Instant};

use cucumber::gherkin::Step;
use cucumber::{given, when};

use crate::process::{Launch, Worker};
use crate::proof::Recorder;
use crate::steps::params::{Flags, Model, Watch};
use crate::steps::{docstring, StepResult};
use crate::world::TestWorld;

/// The standard command line on the model, with the flags applied.
fn launch(w: &mut TestWorld, model: &Model, flags: &Flags) -> anyhow::Result<Launch> {
    let mut l = w.launch(&w.fixture(&model.0)?)?;
    match flags {
        Flags::None => {}
        Flags::With(f) => l.apply(&w.expand(f)?)?,
        Flags::Without(f) => l.remove(f),
    }
    Ok(l)
}

#[given(expr = "a worker on the {model} model{flags}")]
async fn worker_on(w: &mut TestWorld, model: Model, flags: Flags) -> StepResult {
    let l = launch(w, &model, &flags)?;
    w.start_ready(l).await?;
    Ok(())
}

#[given(expr = "a second worker on the reference model")]
async fn second_worker(w: &mut TestWorld) -> StepResult {
    let l = w.launch(&w.cfg.model.clone())?;
    let mut second = Worker::spawn(l)?;
    second.wait_healthy(w.cfg.start_timeout).await?;
    w.process.second = Some(second);
    Ok(())
}

#[given(expr = "the worker environment {string} is {string}")]
async fn worker_env(w: &mut TestWorld, key: String, value: String) -> StepResult {
    w.process.env.push((key, value));
    Ok(())
}

#[given(expr = "a config file {string}:")]
#[when(expr = "a config file {string}:")]
async fn config_file(w: &mut TestWorld, name: String, step: &Step) -> StepResult {
    let text = w.expand(docstring(step)?)?;
    std::fs::create_dir_all(&w.scratch)?;
    std::fs::write(w.scratch.join(name), text + "\n")?;
    Ok(())
}

/// Spawns without waiting for readiness, polling `/health` in the background
/// (the start may fail; `exit` steps judge it).
#[when(expr = "the worker is started on the {model} model{flags}")]
async fn started_on(w: &mut TestWorld, model: Model, flags: Flags) -> StepResult {
    let l = launch(w, &model, &flags)?;
    w.process.spawn(l)?;
    w.process.poll_health()?;
    Ok(())
}

#[when(expr = "the worker is started on the {model} model while {watch}")]
async fn started_watching(w: &mut TestWorld, model: Model, watch: Watch) -> StepResult {
    let spawned = Instant::now();
    started_on(w, model, Flags::None).await?;
    match watch {
        Watch::Health => {
            let timeout = w.cfg.start_timeout;
            w.process.worker()?.wait_healthy(timeout).await?;
            // Let the poller see the healthy answers.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Watch::Memory => {
            let (peak_kib, healthy) = sample_rss_until_ready(w).await?;
            w.process.rss_peak_kib = Some(peak_kib);
            record_load_memory(&w.scenario, peak_kib, healthy.then(|| spawned.elapsed()));
        }
    }
    Ok(())
}

/// M0-W-1221's figures in the proof bundle (`timings.json` and its README), so
/// the bundle shows the peak and the load time, not only pass or fail.
fn record_load_memory(scenario: &str, peak_kib: u64, load_time: Option<Duration>) {
    Recorder::measurement(
        scenario,
        "load_peak_rss_anon_mib",
        "MiB",
        &[peak_kib as f64 / 1024.0],
    );
    if let Some(t) = load_time {
        Recorder::measurement(scenario, "load_spawn_to_healthy_s", "s", &[t.as_secs_f64()]);
    }
}

/// The `RssAnon:` line of a `/proc/PID/status` text, in KiB.
fn rss_anon_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The peak `RssAnon` (KiB) of the worker until it answers `/health` or exits
/// (at most 120 s), and whether it answered.
async fn sample_rss_until_ready(w: &mut TestWorld) -> anyhow::Result<(u64, bool)> {
    let pid = w.process.worker()?.pid;
    let client = w.client()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut peak = 0u64;
    while Instant::now() < deadline {
        if let Some(kib) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .as_deref()
            .and_then(rss_anon_kib)
        {
            peak = peak.max(kib);
        }
        if client.health().await.is_ok() {
            return Ok((peak, true));
        }
        if w.process.worker()?.try_exit()?.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((peak, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_anon_is_read_from_proc_status() {
        let status =
            "Name:\tworker-orcd\nVmRSS:\t  204800 kB\nRssAnon:\t   51234 kB\nRssFile:\t1 kB\n";
        assert_eq!(rss_anon_kib(status), Some(51234));
        assert_eq!(rss_anon_kib("VmRSS:\t1 kB\n"), None);
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(rss_anon_kib(&own).unwrap() > 0, "this test's own RssAnon");
    }
}
