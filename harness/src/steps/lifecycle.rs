//! Starting, stopping and signalling the worker; exit codes; start-up output.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::{given, then, when};
use serde_json::Value;

use super::{docstring, StepResult};
use crate::check;
use crate::process::{exit_code, Worker};
use crate::world::{Callback, Poll, TestWorld};

async fn start_reference(w: &mut TestWorld, flags: &str, without: Option<&str>) -> StepResult {
    let mut l = w.launch(&w.cfg.model.clone())?;
    let flags = w.expand(flags)?;
    l.apply(&flags)?;
    if let Some(f) = without {
        l.remove(f);
    }
    w.start_ready(l).await?;
    Ok(())
}

#[given(regex = r"^a worker on the reference model$")]
#[when(regex = r"^a worker on the reference model$")]
async fn worker_on_reference(w: &mut TestWorld) -> StepResult {
    start_reference(w, "", None).await
}

#[given(regex = r#"^a worker on the reference model with flags "(.*)"$"#)]
#[when(regex = r#"^a worker on the reference model with flags "(.*)"$"#)]
async fn worker_with_flags(w: &mut TestWorld, flags: String) -> StepResult {
    start_reference(w, &flags, None).await
}

#[given(regex = r#"^a worker on the reference model without "(.*)"$"#)]
async fn worker_without(w: &mut TestWorld, flag: String) -> StepResult {
    start_reference(w, "", Some(&flag)).await
}

#[given(regex = r#"^a worker on the "([^"]+)" model$"#)]
async fn worker_on_fixture(w: &mut TestWorld, model: super::Model) -> StepResult {
    let path = w.fixture(&model.0)?;
    let l = w.launch(&path)?;
    w.start_ready(l).await?;
    Ok(())
}

#[given(regex = r"^a second worker on the reference model$")]
async fn second_worker(w: &mut TestWorld) -> StepResult {
    let l = w.launch(&w.cfg.model.clone())?;
    let mut second = Worker::spawn(l)?;
    second.wait_healthy(w.cfg.start_timeout).await?;
    w.second = Some(second);
    Ok(())
}

#[given(regex = r#"^the worker environment "([^"]+)" is "(.*)"$"#)]
async fn worker_env(w: &mut TestWorld, key: String, value: String) -> StepResult {
    w.env.push((key, value));
    Ok(())
}

#[given(regex = r"^a callback listener$")]
async fn callback_listener(w: &mut TestWorld) -> StepResult {
    w.callback = Some(Callback::start().await?);
    Ok(())
}

#[then(regex = r"^the callback listener received no request$")]
async fn callback_untouched(w: &mut TestWorld) -> StepResult {
    let hits = w
        .callback
        .as_ref()
        .ok_or_else(|| anyhow!("no callback listener"))?
        .hits
        .load(Ordering::SeqCst);
    check!(hits == 0, "the worker connected to --callback-url {hits} time(s); a standalone worker sends no ready callback");
    Ok(())
}

#[given(regex = r#"^a config file "([^"]+)":$"#)]
#[when(regex = r#"^a config file "([^"]+)":$"#)]
async fn config_file(w: &mut TestWorld, name: String, step: &Step) -> StepResult {
    let text = w.expand(docstring(step)?)?;
    std::fs::create_dir_all(&w.scratch)?;
    std::fs::write(w.scratch.join(name), text + "\n")?;
    Ok(())
}

/// Spawns without waiting, and polls `/health` in the background until the
/// worker has answered three times, the scenario stops it, or 120 s pass.
fn spawn_polling(w: &mut TestWorld, launch: crate::process::Launch) -> StepResult {
    w.spawn(launch)?;
    let client = w.client()?;
    let polls = w.polls.clone();
    polls.lock().unwrap().clear();
    let stop = w.poll_stop.clone();
    stop.store(false, Ordering::SeqCst);
    tokio::spawn(async move {
        let began = Instant::now();
        let mut answered = 0;
        while answered < 3
            && !stop.load(Ordering::SeqCst)
            && began.elapsed() < Duration::from_secs(120)
        {
            let sent_wall = chrono::Utc::now();
            let poll = match client.get("/health").await {
                Ok(r) => {
                    answered += 1;
                    let status = serde_json::from_str::<Value>(&r.body)
                        .ok()
                        .and_then(|v| v.get("status").and_then(Value::as_str).map(str::to_owned));
                    Poll {
                        sent_wall,
                        refused: false,
                        status: status.or(Some(format!("HTTP {}", r.status))),
                    }
                }
                Err(e) => {
                    let refused = e
                        .downcast_ref::<reqwest::Error>()
                        .is_some_and(reqwest::Error::is_connect);
                    Poll {
                        sent_wall,
                        refused,
                        status: (!refused).then(|| format!("{e:#}")),
                    }
                }
            };
            polls.lock().unwrap().push(poll);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    Ok(())
}

#[when(regex = r#"^the worker is started with "(.*)"$"#)]
async fn started_with(w: &mut TestWorld, flags: String) -> StepResult {
    let mut l = w.launch(&w.cfg.model.clone())?;
    l.apply(&w.expand(&flags)?)?;
    spawn_polling(w, l)
}

#[when(regex = r#"^the worker is started on the "([^"]+)" model$"#)]
async fn started_on(w: &mut TestWorld, model: super::Model) -> StepResult {
    let l = w.launch(&w.fixture(&model.0)?)?;
    spawn_polling(w, l)
}

#[when(regex = r#"^the worker is started on the "([^"]+)" model with "(.*)"$"#)]
async fn started_on_with(w: &mut TestWorld, model: super::Model, flags: String) -> StepResult {
    let mut l = w.launch(&w.fixture(&model.0)?)?;
    l.apply(&w.expand(&flags)?)?;
    spawn_polling(w, l)
}

#[when(regex = r#"^the worker is started on the "([^"]+)" model without "(.*)"$"#)]
async fn started_on_without(w: &mut TestWorld, model: super::Model, flag: String) -> StepResult {
    let mut l = w.launch(&w.fixture(&model.0)?)?;
    l.remove(&flag);
    spawn_polling(w, l)
}

#[when(regex = r#"^the worker is started on the "([^"]+)" model while polling /health$"#)]
async fn started_polling(w: &mut TestWorld, model: super::Model) -> StepResult {
    started_on(w, model).await?;
    let timeout = w.cfg.start_timeout;
    w.worker()?.wait_healthy(timeout).await?;
    // Let the poller see the healthy answers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

#[when(regex = r#"^the worker is started on the "([^"]+)" model while sampling its memory$"#)]
async fn started_sampling(w: &mut TestWorld, model: super::Model) -> StepResult {
    started_on(w, model).await?;
    let pid = w.worker()?.pid;
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
        if client.health().await.is_ok() || w.worker()?.try_exit()?.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.rss_peak_kib = Some(peak);
    Ok(())
}

#[then(regex = r"^the peak RssAnon while loading stayed under (\d+) MiB$")]
async fn rss_under(w: &mut TestWorld, mib: u64) -> StepResult {
    let peak = w
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

#[then(regex = r"^the worker becomes healthy within (\d+) s$")]
async fn becomes_healthy(w: &mut TestWorld, secs: u64) -> StepResult {
    w.worker()?.wait_healthy(Duration::from_secs(secs)).await?;
    Ok(())
}

#[then(regex = r"^the worker exits with code (\d+) within (\d+) s$")]
async fn exits_with(w: &mut TestWorld, code: i32, secs: u64) -> StepResult {
    let worker = w.worker()?;
    let st = worker.wait_exit(Duration::from_secs(secs)).await?;
    w.poll_stop.store(true, Ordering::SeqCst);
    let st = st.ok_or_else(|| anyhow!("the worker still runs after {secs} s"))?;
    check!(
        exit_code(st) == code,
        "the worker exited with {} ({st}), want {code}",
        exit_code(st)
    );
    Ok(())
}

#[then(regex = r"^the worker never listened$")]
async fn never_listened(w: &mut TestWorld) -> StepResult {
    w.poll_stop.store(true, Ordering::SeqCst);
    let polls = w.polls.lock().unwrap().clone();
    let answered: Vec<&Poll> = polls.iter().filter(|p| !p.refused).collect();
    check!(
        answered.is_empty(),
        "{} of {} /health polls were answered: {:?}",
        answered.len(),
        polls.len(),
        answered.first()
    );
    let events = w.worker()?.events("ready");
    check!(events.is_empty(), "the worker logged ready");
    Ok(())
}

/// The output, case-insensitively, for "names"/"mentions" checks.
fn output(w: &mut TestWorld) -> anyhow::Result<String> {
    Ok(w.worker()?.log_text().to_lowercase())
}

#[then(regex = r#"^the worker's output names the flag "([^"]+)"$"#)]
async fn names_flag(w: &mut TestWorld, flag: String) -> StepResult {
    let out = output(w)?;
    let variants = [flag.to_lowercase(), flag.to_lowercase().replace('-', "_")];
    check!(
        variants.iter().any(|v| out.contains(v.as_str())),
        "the output does not name {flag}:\n{}",
        crate::world::tail(&out, 20)
    );
    Ok(())
}

#[then(regex = r#"^the worker's output mentions "([^"]+)"$"#)]
async fn mentions(w: &mut TestWorld, text: String) -> StepResult {
    let out = output(w)?;
    check!(
        out.contains(&text.to_lowercase()),
        "the output does not mention {text:?}:\n{}",
        crate::world::tail(&out, 20)
    );
    Ok(())
}

#[then(regex = r#"^the worker's output mentions "([^"]+)" and "([^"]+)"$"#)]
async fn mentions_both(w: &mut TestWorld, a: String, b: String) -> StepResult {
    let out = output(w)?;
    // Both must occur in one line (one record names the thing and its value).
    let hit = out
        .lines()
        .any(|l| l.contains(&a.to_lowercase()) && l.contains(&b.to_lowercase()));
    check!(
        hit,
        "no output line mentions both {a:?} and {b:?}:\n{}",
        crate::world::tail(&out, 20)
    );
    Ok(())
}

#[then(regex = r"^the worker did not panic$")]
async fn no_panic(w: &mut TestWorld) -> StepResult {
    let out = w.worker()?.log_text();
    check!(
        !out.contains("panicked at"),
        "the worker panicked:\n{}",
        crate::world::tail(&out, 20)
    );
    if let Some(st) = w.worker()?.try_exit()? {
        check!(exit_code(st) != 101, "exit code 101 is Rust's panic code");
    }
    Ok(())
}

#[when(regex = r"^I stop the worker$")]
async fn stop_worker(w: &mut TestWorld) -> StepResult {
    w.poll_stop.store(true, Ordering::SeqCst);
    for (_, job) in std::mem::take(&mut w.live) {
        job.disconnect();
    }
    if let Some(worker) = w.worker.as_mut() {
        worker.stop(Duration::from_secs(30)).await;
    }
    Ok(())
}

#[when(regex = r"^I kill the second worker$")]
async fn kill_second(w: &mut TestWorld) -> StepResult {
    let s = w
        .second
        .as_ref()
        .ok_or_else(|| anyhow!("no second worker"))?;
    s.signal(libc::SIGKILL)?;
    Ok(())
}

#[then(regex = r"^the second worker has exited$")]
async fn second_exited(w: &mut TestWorld) -> StepResult {
    let s = w
        .second
        .as_mut()
        .ok_or_else(|| anyhow!("no second worker"))?;
    check!(
        s.wait_exit(Duration::from_secs(10)).await?.is_some(),
        "the second worker still runs"
    );
    Ok(())
}

#[when(regex = r"^I send SIGTERM to the worker$")]
async fn sigterm(w: &mut TestWorld) -> StepResult {
    w.worker()?.signal(libc::SIGTERM)?;
    Ok(())
}

#[when(regex = r"^I shut the worker down by (/shutdown|SIGTERM)$")]
async fn shut_down(w: &mut TestWorld, how: super::Stop) -> StepResult {
    if how == super::Stop::Sigterm {
        w.worker()?.signal(libc::SIGTERM)?;
        // A signal is handled asynchronously: wait until the worker says it
        // has seen it, so the steps after this one test the shutdown itself
        // and not the signal's delivery time.
        let client = w.client()?;
        let seen = async {
            loop {
                // Any status: /health may answer 503 once shutting down.
                let h = client.get("/health").await.and_then(|r| r.json());
                if h.is_ok_and(|h| h["shutting_down"] == true) {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        check!(
            tokio::time::timeout(std::time::Duration::from_secs(5), seen)
                .await
                .is_ok(),
            "/health did not report shutting_down within 5 s of SIGTERM"
        );
    } else {
        let r = w
            .client()?
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

#[then(regex = r"^the worker is a separate child process of the suite$")]
async fn child_process(w: &mut TestWorld) -> StepResult {
    let pid = w.worker()?.pid;
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

#[then(regex = r"^/health was refused until the model was loaded and healthy after .ready.$")]
async fn refused_until_loaded(w: &mut TestWorld) -> StepResult {
    w.poll_stop.store(true, Ordering::SeqCst);
    let polls = w.polls.lock().unwrap().clone();
    let worker = w.worker()?;
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

#[then(regex = r"^the start (.+)$")]
async fn the_start(w: &mut TestWorld, outcome: String) -> StepResult {
    if outcome == "serves" || outcome.starts_with("serves with tokenizer") {
        let timeout = w.cfg.start_timeout;
        let h = w.worker()?.wait_healthy(timeout).await.map_err(|e| {
            anyhow!(
                "{e}\n{}",
                crate::world::tail(&w.worker.as_ref().unwrap().log_text(), 20)
            )
        })?;
        check!(
            h.get("status").and_then(Value::as_str) == Some("healthy"),
            "/health: {h}"
        );
        if let Some(kind) = super::quoted_list(&outcome).first() {
            check!(
                h.get("tokenizer_kind").and_then(Value::as_str) == Some(kind.as_str()),
                "tokenizer_kind {:?}, want {kind}",
                h.get("tokenizer_kind")
            );
        }
        let job = serde_json::json!({"job_id": "start-check", "prompt": "Count: 1, 2, 3,", "max_tokens": 2, "temperature": 0});
        w.post_job(job, &[]).await?;
        let t = w
            .finish_job("start-check", Duration::from_secs(120))
            .await?;
        check!(
            t.tokens().count() >= 1 && t.first("end").is_some(),
            "a 2-token job on it did not stream and end: {:?}",
            t.events.iter().map(|e| &e.kind).collect::<Vec<_>>()
        );
    } else if let Some(name) = super::quoted_list(&outcome)
        .first()
        .filter(|_| outcome.starts_with("fails naming"))
    {
        exits_with(w, 1, 30).await?;
        no_panic(w).await?;
        mentions(w, name.clone()).await?;
    } else {
        return Err(anyhow!("unknown start outcome {outcome:?}").into());
    }
    Ok(())
}

#[then(
    regex = r#"^without a GPU it exits 1 suggesting "([^"]+)", and with one it serves on "([^"]+)"$"#
)]
async fn default_backend(w: &mut TestWorld, hint: String, backend: String) -> StepResult {
    if crate::suite::gpu_present() {
        let timeout = w.cfg.start_timeout;
        let h = w.worker()?.wait_healthy(timeout).await?;
        check!(
            h.get("backend").and_then(Value::as_str) == Some(backend.as_str()),
            "a default start on a GPU host reports backend {:?}",
            h.get("backend")
        );
    } else {
        exits_with(w, 1, 30).await?;
        mentions(w, hint).await?;
    }
    Ok(())
}
