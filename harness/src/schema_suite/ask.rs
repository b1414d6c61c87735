//! One request of the suite: a chat under a strict `response_format` for one
//! schema and one seed, and the verdict on its answer.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

use super::corpus::Entry;
use crate::client::{Client, Reply};

/// What every request shares.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// The served model's id (`GET /v1/models`).
    pub model: String,
    pub temperature: f64,
    pub max_tokens: u32,
    /// How long one request may take, queueing included.
    pub timeout: Duration,
}

/// The verdict on one answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", content = "detail", rename_all = "snake_case")]
pub enum Verdict {
    /// Complete (`finish_reason: stop`) and valid against the schema.
    Valid,
    /// Complete but not JSON, or invalid: each way the validator says so.
    Invalid(Vec<String>),
    /// Cut off at `max_tokens` (`finish_reason: length`), so not checked.
    Truncated,
    /// A 400: the worker's message.
    Refused(String),
    /// Any other answer (a 5xx, a timeout, an unknown finish reason).
    Error(String),
}

/// One request's result.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub schema: String,
    pub seed: u64,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// The message's content (empty for a refusal or an error).
    pub output: String,
    /// `usage.completion_tokens`.
    pub tokens: u64,
    pub seconds: f64,
}

/// The `/v1/chat/completions` body for `entry` and `seed`.
pub fn body(entry: &Entry, seed: u64, s: &Sampling) -> Value {
    json!({
        "model": s.model,
        "messages": [{"role": "user", "content": entry.prompt()}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": entry.format_name(), "schema": entry.schema, "strict": true},
        },
        "temperature": s.temperature,
        "seed": seed,
        "max_tokens": s.max_tokens,
    })
}

/// Sends the request and judges its answer.
pub async fn ask(client: &Client, entry: &Entry, seed: u64, s: &Sampling) -> Outcome {
    let reply = client
        .post_json_within("/v1/chat/completions", &body(entry, seed, s), s.timeout)
        .await;
    let (verdict, output, tokens, seconds) = match reply {
        Ok(r) => {
            let (verdict, output, tokens) = judge(entry, &r);
            (verdict, output, tokens, r.elapsed.as_secs_f64())
        }
        Err(e) => (Verdict::Error(format!("{e:#}")), String::new(), 0, 0.0),
    };
    Outcome {
        schema: entry.id(),
        seed,
        verdict,
        output,
        tokens,
        seconds,
    }
}

/// The verdict on `reply`, the message's content and its token count.
pub fn judge(entry: &Entry, reply: &Reply) -> (Verdict, String, u64) {
    let body: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
    if reply.status == 400 {
        let message = body["error"]["message"].as_str().unwrap_or(&reply.body);
        return (Verdict::Refused(message.to_string()), String::new(), 0);
    }
    if reply.status != 200 {
        let e = format!("HTTP {}: {}", reply.status, reply.body);
        return (Verdict::Error(e), String::new(), 0);
    }
    let choice = &body["choices"][0];
    let output = choice["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let tokens = body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    let verdict = match choice["finish_reason"].as_str() {
        Some("stop") => check(entry, &output),
        Some("length") => Verdict::Truncated,
        other => Verdict::Error(format!("finish_reason {other:?} in {}", reply.body)),
    };
    (verdict, output, tokens)
}

/// `output` against the entry's schema, by the independent validator.
fn check(entry: &Entry, output: &str) -> Verdict {
    let value: Value = match serde_json::from_str(output) {
        Ok(v) => v,
        Err(e) => return Verdict::Invalid(vec![format!("not JSON: {e}")]),
    };
    let errors: Vec<String> = entry
        .validator
        .iter_errors(&value)
        .map(|e| format!("{e} at {:?}", e.instance_path().to_string()))
        .collect();
    match errors.is_empty() {
        true => Verdict::Valid,
        false => Verdict::Invalid(errors),
    }
}
