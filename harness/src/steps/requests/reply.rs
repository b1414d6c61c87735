//! Checks of plain (non-stream) replies to `/execute`: refusals, their codes and headers.

use cucumber::then;
use serde_json::Value;

use crate::check;
use crate::events;
use crate::steps::params::Code;
use crate::steps::StepResult;
use crate::world::TestWorld;

/// The reply has that status, that code and a well-typed error body; with `naming`, its
/// message names the field and it is not retriable (an invalid request).
fn check_reply(w: &TestWorld, status: u16, code: &Code, naming: Option<&str>) -> StepResult {
    let r = w.stream.reply()?;
    check!(
        r.status == status,
        "reply {} {}, want {status}",
        r.status,
        r.body
    );
    let v = r.json()?;
    check!(
        v.get("code").and_then(Value::as_str) == Some(code.0.as_str()),
        "reply body {}, want code {code}",
        r.body
    );
    let bad = events::check_error_body(&v);
    check!(bad.is_empty(), "{}: {}", r.body, bad.join("; "));
    if let Some(field) = naming {
        let msg = v.get("message").and_then(Value::as_str).unwrap_or("");
        check!(
            msg.contains(field),
            "the message {msg:?} does not name {field}"
        );
        check!(
            v.get("retriable") == Some(&Value::Bool(false)),
            "an invalid request must have retriable false: {}",
            r.body
        );
    }
    Ok(())
}

#[then(expr = "the reply is {int} {code}")]
async fn reply_code(w: &mut TestWorld, status: u16, code: Code) -> StepResult {
    check_reply(w, status, &code, None)
}

#[then(expr = "the reply is {int} {code} naming {string}")]
async fn reply_naming(w: &mut TestWorld, status: u16, code: Code, field: String) -> StepResult {
    check_reply(w, status, &code, Some(&field))
}

#[then(expr = "the reply is 200 with content type {string}")]
async fn reply_stream(w: &mut TestWorld, ct: String) -> StepResult {
    let r = w.stream.reply()?;
    check!(
        r.status == 200 && r.header("content-type").is_some_and(|v| v.starts_with(&ct)),
        "reply {} {:?}: {}",
        r.status,
        r.header("content-type"),
        r.body
    );
    Ok(())
}

#[then(expr = "the reply is not an event stream")]
async fn reply_not_stream(w: &mut TestWorld) -> StepResult {
    let r = w.stream.reply()?;
    check!(
        !r.header("content-type")
            .unwrap_or("")
            .starts_with("text/event-stream"),
        "an error reply came as an event stream"
    );
    Ok(())
}

#[then(
    expr = "{int} jobs were accepted and {int} refused with {int} {code} and a Retry-After header"
)]
async fn accepted_refused(
    w: &mut TestWorld,
    accepted: usize,
    refused: usize,
    status: u16,
    code: Code,
) -> StepResult {
    let s = &w.stream;
    check!(
        s.done.len() == accepted,
        "{} jobs streamed, want {accepted}",
        s.done.len()
    );
    check!(
        s.refused.len() == refused,
        "{} jobs refused, want {refused}",
        s.refused.len()
    );
    for (id, r) in &s.refused {
        let v = r.json()?;
        check!(
            r.status == status && v.get("code").and_then(Value::as_str) == Some(code.0.as_str()),
            "job {id}: {} {}",
            r.status,
            r.body
        );
        check!(
            r.header("retry-after").is_some(),
            "job {id}'s {status} has no Retry-After header"
        );
    }
    Ok(())
}
