//! Anthropic's `/v1/messages` (issue 43) over plain HTTP, as Anthropic's
//! clients speak it (`x-api-key`, `anthropic-version`): the whole answer and
//! the stream of named SSE events, and refusals in Anthropic's error shape.
//! (The official `anthropic` Python package runs against it in
//! `tests/anthropic_client.py`; there is no official Rust client.)
//!
//! A docstring is the request as JSON; `model` is filled in from
//! `GET /v1/models`.

use anyhow::{anyhow, Context};
use cucumber::gherkin::Step;
use cucumber::then;
use cucumber::when;
use serde_json::{json, Value};

use crate::check;
use crate::steps::{json_docstring, StepResult};
use crate::world::TestWorld;

/// The events of an SSE body: `(event name, data as JSON)`.
pub(crate) fn events(body: &str) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for block in body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = String::new();
        let mut data = String::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim_start());
            }
        }
        if data.is_empty() {
            continue; // a keep-alive comment
        }
        let data = serde_json::from_str(&data).with_context(|| format!("event data {data:?}"))?;
        out.push((name, data));
    }
    Ok(out)
}

/// POSTs `body` to `path` (`/v1/messages`, `/v1/responses`) as
/// Anthropic's clients do (the Responses API ignores their headers).
pub(crate) async fn post(w: &TestWorld, path: &str, body: &Value) -> anyhow::Result<(u16, String)> {
    let url = format!("{}{path}", w.client()?.base());
    let r = reqwest::Client::new()
        .post(url)
        .header("x-api-key", "unused")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await?;
    Ok((r.status().as_u16(), r.text().await?))
}

/// The docstring as JSON, `model` set to the served model's id unless it
/// names one.
pub(crate) async fn request(w: &mut TestWorld, step: &Step) -> anyhow::Result<Value> {
    let mut body = json_docstring(w, step)?;
    if body.get("model").is_none() {
        let models: Value = w.client()?.get("/v1/models").await?.json()?;
        body["model"] = models["data"][0]["id"].clone();
    }
    Ok(body)
}

#[when(expr = "I post this to \\/v1\\/messages whole and streamed:")]
async fn whole_and_streamed(w: &mut TestWorld, step: &Step) -> StepResult {
    let mut body = request(w, step).await?;
    let (status, text) = post(w, "/v1/messages", &body).await?;
    check!(status == 200, "whole: status {status}: {text}");
    w.openai.message = Some(serde_json::from_str(&text)?);
    body["stream"] = json!(true);
    let (status, text) = post(w, "/v1/messages", &body).await?;
    check!(status == 200, "stream: status {status}: {text}");
    w.openai.message_events = events(&text)?;
    Ok(())
}

#[then(expr = "the stream is Anthropic's event sequence with the whole answer's text")]
async fn stream_matches(w: &mut TestWorld) -> StepResult {
    let whole = w
        .openai
        .message
        .as_ref()
        .ok_or_else(|| anyhow!("no whole answer"))?;
    let ev = &w.openai.message_events;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    let mut want = vec!["message_start", "content_block_start", "ping"];
    want.extend(std::iter::repeat_n("content_block_delta", deltas));
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    check!(names == want, "events {names:?}");
    for (name, data) in ev {
        check!(
            data["type"] == name.as_str(),
            "{name} carries type {}",
            data["type"]
        );
    }
    let text: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    check!(
        whole["content"][0]["text"].as_str() == Some(text.as_str()),
        "streamed {text:?}, whole {}",
        whole["content"]
    );
    let delta = &ev[ev.len() - 2].1;
    check!(
        delta["delta"]["stop_reason"] == whole["stop_reason"]
            && delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"],
        "stream's end {delta} and whole {whole} disagree"
    );
    check!(
        ev[0].1["message"]["usage"]["input_tokens"] == whole["usage"]["input_tokens"],
        "input tokens differ"
    );
    Ok(())
}

#[then(expr = "the message stopped with {string} after {int} output tokens")]
async fn stopped(w: &mut TestWorld, reason: String, n: u64) -> StepResult {
    let m = w
        .openai
        .message
        .as_ref()
        .ok_or_else(|| anyhow!("no whole answer"))?;
    check!(
        m["type"] == "message" && m["role"] == "assistant",
        "not a message: {m}"
    );
    check!(
        m["stop_reason"] == reason.as_str(),
        "stop_reason {}",
        m["stop_reason"]
    );
    check!(m["usage"]["output_tokens"] == n, "usage {}", m["usage"]);
    Ok(())
}

#[then(expr = "\\/v1\\/messages answers {int} {string} naming {string} for:")]
async fn refused(
    w: &mut TestWorld,
    status: u16,
    kind: String,
    field: String,
    step: &Step,
) -> StepResult {
    let body = request(w, step).await?;
    let (got, text) = post(w, "/v1/messages", &body).await?;
    let e: Value = serde_json::from_str(&text).with_context(|| format!("body {text:?}"))?;
    check!(got == status, "status {got}, not {status}: {text}");
    check!(
        e["type"] == "error" && e["error"]["type"] == kind.as_str(),
        "error {e}"
    );
    let message = e["error"]["message"].as_str().unwrap_or_default();
    check!(
        message.starts_with(&format!("{field}: ")),
        "message {message:?} does not start with {field:?}"
    );
    Ok(())
}
