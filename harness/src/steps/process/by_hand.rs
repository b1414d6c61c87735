//! The worker as a person starts and reads it (issue 48): `worker-orcd serve`
//! and other command lines typed by hand, what it printed and how often,
//! its text log, and `GET /`.

use std::collections::BTreeSet;

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::Value;

use crate::check;
use crate::process::{free_port, shell_words, Launch};
use crate::steps::StepResult;
use crate::world::{tail, TestWorld};

/// Starts the worker binary with `line`'s words and nothing else, without
/// waiting for it. Besides the suite's `{scratch}`-style names, `line` may
/// hold `{backend}` (the backend under test), `{port}` (a free port, the one
/// the suite's client then uses), `{fixture:NAME}` (a model fixture's path)
/// and `{model_file}` (the reference model's file name: the worker then runs
/// in the model's folder, so that the path is relative).
#[when(expr = "the worker is started by hand with {string}")]
async fn started_by_hand(w: &mut TestWorld, line: String) -> StepResult {
    let port = free_port()?;
    let mut line = w
        .expand(&line)?
        .replace("{backend}", &w.cfg.backend)
        .replace("{port}", &port.to_string());
    while let Some(start) = line.find("{fixture:") {
        let end = start
            + line[start..]
                .find('}')
                .ok_or_else(|| anyhow!("unclosed {{fixture:"))?;
        let path = w.fixture(&line[start + "{fixture:".len()..end])?;
        line.replace_range(start..=end, &path.display().to_string());
    }
    let mut cwd = Some(w.cfg.workspace.clone());
    if line.contains("{model_file}") {
        let model = &w.cfg.model;
        let name = model
            .file_name()
            .ok_or_else(|| anyhow!("no model file name"))?;
        line = line.replace("{model_file}", &name.to_string_lossy());
        cwd = model.parent().map(Into::into);
    }
    let words = shell_words(&line)?;
    let launch = Launch {
        bin: w.cfg.worker_bin.clone(),
        port: port_in(&words).unwrap_or(port),
        args: words.into_iter().map(|word| (word, None)).collect(),
        env: w.process.env.clone(),
        host: "127.0.0.1".into(),
        cwd,
        own_group: false,
    };
    w.process.spawn(launch)?;
    Ok(())
}

/// The value of `-p` or `--port` among `words`.
fn port_in(words: &[String]) -> Option<u16> {
    let at = words.iter().position(|w| w == "-p" || w == "--port")?;
    words.get(at + 1)?.parse().ok()
}

/// The whole output holds `text` exactly once: an error is printed once,
/// not once per layer that passed it on.
#[then(expr = "the worker's output says {string} once")]
async fn says_once(w: &mut TestWorld, text: String) -> StepResult {
    let out = w.process.worker()?.log_text();
    let count = out.matches(text.as_str()).count();
    check!(
        count == 1,
        "the output says {text:?} {count} times:\n{}",
        tail(&out, 20)
    );
    Ok(())
}

#[then(expr = "the \"startup\" record carries a generated worker id that \\/health reports")]
async fn generated_id(w: &mut TestWorld) -> StepResult {
    let worker = w.process.worker()?;
    check!(
        !worker.launch.args.iter().any(|(a, _)| a == "--worker-id"),
        "the command line gave a worker id"
    );
    let startup = worker
        .events("startup")
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no startup record"))?;
    let id = startup
        .field("worker_id")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("the startup record has no worker_id"))?
        .to_owned();
    let uuid =
        regex::Regex::new("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")?;
    check!(
        uuid.is_match(&id),
        "worker_id {id:?} is not a version-4 UUID"
    );
    let health = w.process.client()?.health().await?;
    check!(
        health.get("worker_id").and_then(Value::as_str) == Some(id.as_str()),
        "/health worker_id {:?}, the log's {id}",
        health.get("worker_id")
    );
    Ok(())
}

/// Text, not JSON; no line over `most` characters and half of them within
/// `half`.
#[then(
    expr = "the worker's output is text, every line at most {int} characters and half at most {int}"
)]
async fn short_lines(w: &mut TestWorld, most: usize, half: usize) -> StepResult {
    let out = w.process.worker()?.log_text();
    let mut lengths: Vec<usize> = out.lines().map(|l| l.chars().count()).collect();
    lengths.sort_unstable();
    let median = lengths.get(lengths.len() / 2).copied().unwrap_or(0);
    let longest = out.lines().max_by_key(|l| l.chars().count()).unwrap_or("");
    check!(
        lengths.last().is_some_and(|&l| l <= most) && median <= half,
        "median line {median} characters (want at most {half}), the longest:\n{longest}"
    );
    check!(
        !out.lines().any(|l| l.trim_start().starts_with('{')),
        "the output holds JSON records:\n{}",
        tail(&out, 5)
    );
    Ok(())
}

/// The fields every record carries are shown once, on `startup`.
#[then(expr = "only the worker's {string} line carries its worker id and model path")]
async fn constants_once(w: &mut TestWorld, event: String) -> StepResult {
    let worker = w.process.worker()?;
    let id = worker
        .launch
        .get("--worker-id")
        .ok_or_else(|| anyhow!("the worker was started without --worker-id"))?
        .to_owned();
    let path = worker
        .model_path()
        .ok_or_else(|| anyhow!("the worker was started without --model"))?
        .display()
        .to_string();
    let out = worker.log_text();
    for needle in [id, path] {
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(&needle)).collect();
        check!(
            lines.len() == 1 && lines[0].contains(&format!(" {event} ")),
            "{needle} is on {} lines, want only the {event} line: {lines:?}",
            lines.len()
        );
    }
    Ok(())
}

#[then(
    expr = "GET \\/ names the worker, its version, the model and every route of \\/openapi.json"
)]
async fn about(w: &mut TestWorld) -> StepResult {
    let client = w.process.client()?;
    let reply = client.get("/").await?;
    check!(reply.status == 200, "GET / answered {}", reply.status);
    let about: Value = reply.json()?;
    let health = client.health().await?;
    check!(about["name"] == "worker-orcd", "name: {}", about["name"]);
    check!(
        about["version"].as_str().is_some_and(|v| !v.is_empty()),
        "version: {}",
        about["version"]
    );
    check!(
        about["model"] == health["model"],
        "model {} where /health says {}",
        about["model"],
        health["model"]
    );
    let doc: Value = client.get("/openapi.json").await?.json()?;
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
            documented.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    let listed: BTreeSet<String> = about["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    check!(
        listed == documented && listed.contains("POST /v1/chat/completions"),
        "GET / lists {listed:?}; /openapi.json documents {documented:?}"
    );
    Ok(())
}
