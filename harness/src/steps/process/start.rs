//! Starting workers: on which model, with which flags, environment and config file.

use std::time::{Duration, Instant};

use cucumber::gherkin::Step;
use cucumber::{given, when};

use crate::process::{Launch, Worker};
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
    started_on(w, model, Flags::None).await?;
    match watch {
        Watch::Health => {
            let timeout = w.cfg.start_timeout;
            w.process.worker()?.wait_healthy(timeout).await?;
            // Let the poller see the healthy answers.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Watch::Memory => w.process.rss_peak_kib = Some(sample_rss_until_ready(w).await?),
    }
    Ok(())
}

/// The peak `RssAnon` (KiB) of the worker until it answers `/health` or exits (at most 120 s).
async fn sample_rss_until_ready(w: &mut TestWorld) -> anyhow::Result<u64> {
    let pid = w.process.worker()?.pid;
    let client = w.client()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut peak = 0u64;
    while Instant::now() < deadline {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kib) = s
                .lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kib);
            }
        }
        if client.health().await.is_ok() || w.process.worker()?.try_exit()?.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(peak)
}
