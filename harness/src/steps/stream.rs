//! Checks of finished jobs' streams and of plain replies: order, terminal events,
//! payloads, framing, timing and text.

use std::sync::Mutex;

use anyhow::anyhow;
use cucumber::then;
use serde_json::Value;

use super::StepResult;
use crate::check;
use crate::client::Transcript;
use crate::events;
use crate::world::TestWorld;

/// Every transcript of the run that broke the event rules: (scenario, job, violations).
static VIOLATIONS: Mutex<Vec<(String, String, Vec<String>)>> = Mutex::new(Vec::new());
static CHECKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Called for every finished transcript of the run (M0-W-1312 checks them all).
pub fn register(scenario: &str, t: &Transcript) {
    CHECKED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let bad = events::check_all(t);
    if !bad.is_empty() {
        VIOLATIONS
            .lock()
            .unwrap()
            .push((scenario.to_owned(), t.job_id.clone(), bad));
    }
}

fn kinds(t: &Transcript) -> String {
    t.events
        .iter()
        .map(|e| e.kind.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[then(regex = r#"^job "([^"]+)" streamed started, at least 1 token and end$"#)]
async fn started_tokens_end(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let bad = events::check_order(&t.events);
    check!(bad.is_empty(), "job {id}: {}", bad.join("; "));
    check!(
        t.tokens().count() >= 1,
        "job {id} streamed no token: {}",
        kinds(t)
    );
    check!(
        t.events.last().is_some_and(|e| e.kind == "end"),
        "job {id} did not end with end: {} {:?}",
        kinds(t),
        t.terminal().map(|e| &e.raw_data)
    );
    Ok(())
}

fn same_ids(w: &TestWorld, ids: &[String]) -> StepResult {
    let first = w.transcript(&ids[0])?.token_ids();
    check!(!first.is_empty(), "job {} produced no tokens", ids[0]);
    for id in &ids[1..] {
        let other = w.transcript(id)?.token_ids();
        check!(
            other == first,
            "job {id} produced {other:?}, job {} produced {first:?}",
            ids[0]
        );
    }
    Ok(())
}

#[then(regex = r#"^jobs "([^"]+)" and "([^"]+)" produced the same token ids$"#)]
async fn same_tokens(w: &mut TestWorld, a: String, b: String) -> StepResult {
    w.settle(&a).await?;
    w.settle(&b).await?;
    same_ids(w, &[a, b])
}

#[then(regex = r"^all (\d+) runs produced the same token ids$")]
async fn all_runs_same(w: &mut TestWorld, n: usize) -> StepResult {
    check!(
        w.repeat_ids.len() == n,
        "{} runs recorded, want {n}",
        w.repeat_ids.len()
    );
    let ids = w.repeat_ids.clone();
    same_ids(w, &ids)
}

fn ended_with_error(w: &TestWorld, id: &str, code: &str) -> anyhow::Result<usize> {
    let t = w.transcript(id)?;
    let bad = events::check_order(&t.events);
    if !bad.is_empty() {
        return Err(anyhow!("job {id}: {}", bad.join("; ")));
    }
    if t.error_code() != Some(code) || t.events.last().map(|e| e.kind.as_str()) != Some("error") {
        return Err(anyhow!(
            "job {id} ended with {:?}, want error {code}",
            t.terminal().map(|e| (&e.kind, &e.raw_data))
        ));
    }
    Ok(t.tokens().count())
}

#[then(regex = r#"^job "([^"]+)" ended with error "([^"]+)"$"#)]
async fn error_code(w: &mut TestWorld, id: String, code: super::Code) -> StepResult {
    w.settle(&id).await?;
    ended_with_error(w, &id, &code.0)?;
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" ended with error "([^"]+)" after (\d+) tokens$"#)]
async fn error_after_exactly(
    w: &mut TestWorld,
    id: String,
    code: super::Code,
    n: usize,
) -> StepResult {
    w.settle(&id).await?;
    let got = ended_with_error(w, &id, &code.0)?;
    check!(
        got == n,
        "job {id} streamed {got} tokens before {code}, want {n}"
    );
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" ended with error "([^"]+)" after at least (\d+) tokens$"#)]
async fn error_after_at_least(
    w: &mut TestWorld,
    id: String,
    code: super::Code,
    n: usize,
) -> StepResult {
    w.settle(&id).await?;
    let got = ended_with_error(w, &id, &code.0)?;
    check!(
        got >= n,
        "job {id} streamed {got} tokens before {code}, want at least {n}"
    );
    Ok(())
}

fn ended_with_end(w: &TestWorld, id: &str) -> StepResult {
    let t = w.transcript(id)?;
    let bad = events::check_order(&t.events);
    check!(bad.is_empty(), "job {id}: {}", bad.join("; "));
    check!(
        t.events.last().is_some_and(|e| e.kind == "end"),
        "job {id} ended with {:?}",
        t.terminal().map(|e| &e.raw_data)
    );
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" ended with "end"$"#)]
async fn ended_end(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    ended_with_end(w, &id)
}

#[then(regex = r#"^jobs "([^"]+)" and "([^"]+)" ended with "end"$"#)]
async fn both_ended_end(w: &mut TestWorld, a: String, b: String) -> StepResult {
    w.settle(&a).await?;
    w.settle(&b).await?;
    ended_with_end(w, &a)?;
    ended_with_end(w, &b)
}

#[then(regex = r#"^job "([^"]+)" ended with "end" or error "([^"]+)"$"#)]
async fn end_or_error(w: &mut TestWorld, id: String, code: super::Code) -> StepResult {
    w.settle(&id).await?;
    if ended_with_end(w, &id).is_err() {
        ended_with_error(w, &id, &code.0)?;
    }
    Ok(())
}

fn retriable_of(v: &Value) -> anyhow::Result<bool> {
    v.get("retriable")
        .and_then(Value::as_bool)
        .ok_or_else(|| anyhow!("error body has no boolean retriable: {v}"))
}

#[then(regex = r#"^job "([^"]+)"'s error is (not )?retriable$"#)]
async fn job_retriable(w: &mut TestWorld, id: String, not: String) -> StepResult {
    w.settle(&id).await?;
    let e = w
        .transcript(&id)?
        .first("error")
        .ok_or_else(|| anyhow!("job {id} has no error event"))?;
    let want = not.is_empty();
    check!(
        retriable_of(&e.data)? == want,
        "job {id}'s error {} has retriable != {want}",
        e.raw_data
    );
    Ok(())
}

#[then(
    regex = r#"^job "([^"]+)"'s error has a string code, a string message and a boolean retriable$"#
)]
async fn error_typed(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let e = w
        .transcript(&id)?
        .first("error")
        .ok_or_else(|| anyhow!("job {id} has no error event"))?;
    let bad = events::check_error_body(&e.data);
    check!(bad.is_empty(), "{}: {}", e.raw_data, bad.join("; "));
    Ok(())
}

#[then(regex = r#"^job "([^"]+)"'s error message does not contain "([^"]+)"$"#)]
async fn error_message_clean(w: &mut TestWorld, id: String, text: String) -> StepResult {
    w.settle(&id).await?;
    let e = w
        .transcript(&id)?
        .first("error")
        .ok_or_else(|| anyhow!("job {id} has no error event"))?;
    check!(
        !e.raw_data.contains(&text),
        "the error event repeats prompt text: {}",
        e.raw_data
    );
    Ok(())
}

#[then(regex = r#"^job "([^"]+)"'s first token came after job "([^"]+)"'s terminal event$"#)]
async fn serial(w: &mut TestWorld, second: String, first: String) -> StepResult {
    w.settle(&second).await?;
    w.settle(&first).await?;
    let (a, b) = (w.transcript(&first)?, w.transcript(&second)?);
    let a_end = a.arrival(
        a.terminal()
            .ok_or_else(|| anyhow!("job {first} has no terminal event"))?,
    );
    let b_tok = b.arrival(
        b.tokens()
            .next()
            .ok_or_else(|| anyhow!("job {second} streamed no token"))?,
    );
    check!(
        b_tok >= a_end,
        "job {second}'s first token came {:?} before job {first}'s terminal event",
        a_end - b_tok
    );
    Ok(())
}

#[then(regex = r"^every job streamed a conformant transcript$")]
async fn all_conformant(w: &mut TestWorld) -> StepResult {
    check!(!w.done.is_empty(), "no job finished in this scenario");
    let bad: Vec<String> = w
        .done
        .values()
        .flat_map(|t| {
            events::check_all(t)
                .into_iter()
                .map(move |m| format!("{}: {m}", t.job_id))
        })
        .collect();
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(regex = r"^every job streamed started, tokens, then one terminal event and nothing after$")]
async fn all_ordered(w: &mut TestWorld) -> StepResult {
    check!(!w.done.is_empty(), "no job finished in this scenario");
    let mut bad = Vec::new();
    for t in w.done.values() {
        bad.extend(
            events::check_order(&t.events)
                .into_iter()
                .map(|m| format!("{}: {m}", t.job_id)),
        );
        if !t.closed {
            bad.push(format!(
                "{}: the stream was not closed by the server ({:?})",
                t.job_id, t.transport_error
            ));
        }
    }
    check!(bad.is_empty(), "{}", bad.join("\n"));
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" has conformant SSE framing$"#)]
async fn framing(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let bad = events::check_framing(&t.raw);
    check!(bad.is_empty(), "{}", bad.join("\n"));
    check!(
        t.content_type.starts_with("text/event-stream"),
        "content type {}",
        t.content_type
    );
    Ok(())
}

#[then(regex = r#"^job "([^"]+)"'s tokens arrived spread over its decode time$"#)]
async fn spread(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let toks: Vec<_> = t.tokens().collect();
    check!(
        toks.len() >= 8,
        "job {id} streamed only {} tokens; need 8 to judge flushing",
        toks.len()
    );
    let decode_ms = t
        .first("end")
        .and_then(|e| e.data.get("decode_time_ms"))
        .and_then(Value::as_f64)
        .ok_or_else(|| anyhow!("no end.decode_time_ms"))?;
    let span_ms = (toks[toks.len() - 1].at - toks[0].at).as_secs_f64() * 1e3;
    // Streaming each token as made spreads arrivals over ~(n-1)/n of the decode time;
    // buffering to the end collapses them.
    check!(span_ms >= 0.5 * decode_ms * (toks.len() - 1) as f64 / toks.len() as f64, "tokens arrived within {span_ms:.1} ms of each other over a {decode_ms:.1} ms decode: not flushed as produced");
    Ok(())
}

#[then(regex = r#"^at temperature 0 every token of job "([^"]+)" is its top log-probability$"#)]
async fn greedy_is_top(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let want = w
        .requests
        .get(&id)
        .and_then(|r| r.get("logprobs"))
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    for e in t.tokens() {
        let lp = e
            .data
            .get("logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("token {} has no logprobs", e.raw_data))?;
        check!(
            lp.len() == want,
            "token {} has {} logprobs, asked for {want}",
            e.data["i"],
            lp.len()
        );
        check!(
            lp.first().and_then(|x| x.get("id")) == e.data.get("id"),
            "greedy token {} is not its top logprob {:?}",
            e.data["id"],
            lp.first()
        );
    }
    Ok(())
}

#[then(regex = r"^every transcript recorded so far in this run is conformant$")]
async fn run_conformant(_w: &mut TestWorld) -> StepResult {
    let v = VIOLATIONS.lock().unwrap();
    let n = CHECKED.load(std::sync::atomic::Ordering::SeqCst);
    check!(n > 0, "no transcript recorded");
    let lines: Vec<String> = v
        .iter()
        .map(|(s, j, b)| format!("{s} / {j}: {}", b.join("; ")))
        .collect();
    check!(
        lines.is_empty(),
        "{} of {n} transcripts break the event rules:\n{}",
        lines.len(),
        lines.join("\n")
    );
    Ok(())
}

#[then(regex = r#"^job "([^"]+)"'s text is exactly "(.*)"$"#)]
async fn exact_text(w: &mut TestWorld, id: String, text: String) -> StepResult {
    w.settle(&id).await?;
    let got = w.transcript(&id)?.text();
    check!(got == text, "job {id} streamed {got:?}, want {text:?}");
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" ended with stop_reason "([^"]+)" and stop_sequence "([^"]+)"$"#)]
async fn stop_reason(w: &mut TestWorld, id: String, reason: String, seq: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let end = t
        .first("end")
        .ok_or_else(|| anyhow!("job {id} has no end event: {}", kinds(t)))?;
    check!(
        end.data.get("stop_reason").and_then(Value::as_str) == Some(reason.as_str()),
        "end: {}",
        end.raw_data
    );
    check!(
        end.data.get("stop_sequence").and_then(Value::as_str) == Some(seq.as_str()),
        "end: {}",
        end.raw_data
    );
    Ok(())
}

/// Every `t` parses as a JSON string (a lone surrogate would not) without U+FFFD, except
/// the last token of a job cut by `max_tokens` mid-character, when a one-shot
/// `/detokenize` of the ids ends the same way.
#[then(
    regex = r#"^every token text of job "([^"]+)" is whole UTF-8, with U\+FFFD only for a character cut off by max_tokens$"#
)]
async fn whole_utf8(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let n = t.tokens().count();
    check!(n > 0, "no tokens");
    let cut = t
        .first("end")
        .and_then(|e| e.data.get("stop_reason"))
        .and_then(Value::as_str)
        == Some("max_tokens");
    let mut last_replacement = false;
    for (k, e) in t.tokens().enumerate() {
        let s = e.data.get("t").and_then(Value::as_str).ok_or_else(|| {
            anyhow!(
                "token data is not valid JSON with a string t: {}",
                e.raw_data
            )
        })?;
        if s.contains('\u{FFFD}') {
            check!(
                k + 1 == n && cut,
                "token {} carries U+FFFD: {}",
                e.data["i"],
                e.raw_data
            );
            last_replacement = true;
        }
    }
    if last_replacement {
        let ids = t.token_ids();
        let whole = w.client()?.detokenize(&ids).await?;
        check!(
            whole.ends_with('\u{FFFD}'),
            "the last token carries U+FFFD but a one-shot decode ends {whole:?}"
        );
    }
    Ok(())
}

#[then(regex = r#"^job "([^"]+)"'s first token arrived within (\d+) s$"#)]
async fn first_token_within(w: &mut TestWorld, id: String, secs: u64) -> StepResult {
    w.settle(&id).await?;
    let t = w.transcript(&id)?;
    let tok = t
        .tokens()
        .next()
        .ok_or_else(|| anyhow!("job {id} streamed no token"))?;
    check!(
        tok.at.as_secs_f64() <= secs as f64,
        "job {id}'s first token came after {:?}",
        tok.at
    );
    Ok(())
}

#[then(regex = r#"^job "([^"]+)" was still streaming afterwards$"#)]
async fn still_streaming(w: &mut TestWorld, id: String) -> StepResult {
    let job = w
        .live
        .get(&id)
        .ok_or_else(|| anyhow!("job {id} is not running"))?;
    let ev = job.events();
    check!(
        !job.is_finished() && !ev.iter().any(|e| e.kind == "end" || e.kind == "error"),
        "job {id} had ended: {:?}",
        ev.last().map(|e| &e.raw_data)
    );
    Ok(())
}

#[then(
    regex = r#"^(\d+) jobs were accepted and (\d+) refused with (\d+) "([^"]+)" and a Retry-After header$"#
)]
async fn accepted_refused(
    w: &mut TestWorld,
    accepted: usize,
    refused: usize,
    status: u16,
    code: super::Code,
) -> StepResult {
    check!(
        w.done.len() == accepted,
        "{} jobs streamed, want {accepted}",
        w.done.len()
    );
    check!(
        w.refused.len() == refused,
        "{} jobs refused, want {refused}",
        w.refused.len()
    );
    for (id, r) in &w.refused {
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

#[then(regex = r"^the refused job's error is retriable$")]
async fn refused_retriable(w: &mut TestWorld) -> StepResult {
    let (id, r) = w
        .refused
        .first()
        .ok_or_else(|| anyhow!("no job was refused"))?;
    check!(
        retriable_of(&r.json()?)?,
        "job {id}'s refusal is not retriable: {}",
        r.body
    );
    Ok(())
}

/// Orders the jobs by when they started producing (first token, else the terminal event),
/// then checks that none began before the previous one ended, and that this run order
/// never goes against acceptance order (`started_at`; equal times are a tie).
#[then(regex = r"^the accepted jobs ran one at a time in the order they were accepted$")]
async fn fifo(w: &mut TestWorld) -> StepResult {
    let started_at = |t: &Transcript| {
        t.first("started")
            .and_then(|e| e.data.get("started_at"))
            .and_then(Value::as_str)
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
    };
    let began = |t: &Transcript| t.tokens().next().or(t.terminal()).map(|e| t.arrival(e));
    let mut jobs: Vec<&Transcript> = w.done.values().collect();
    check!(
        jobs.len() >= 2,
        "{} jobs finished; need two to judge",
        jobs.len()
    );
    for t in &jobs {
        check!(
            started_at(t).is_some() && began(t).is_some(),
            "job {} has no started_at or no token/terminal event",
            t.job_id
        );
    }
    jobs.sort_by_key(|t| began(t).unwrap());
    for pair in jobs.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = a.arrival(
            a.terminal()
                .ok_or_else(|| anyhow!("job {} has no terminal event", a.job_id))?,
        );
        let b_first = began(b).unwrap();
        check!(
            b_first >= a_end,
            "job {} streamed {:?} before job {} ended: they ran alongside",
            b.job_id,
            a_end - b_first,
            a.job_id
        );
        check!(
            started_at(a).unwrap() <= started_at(b).unwrap(),
            "job {} ran before job {}, which was accepted earlier ({} < {})",
            a.job_id,
            b.job_id,
            started_at(b).unwrap(),
            started_at(a).unwrap()
        );
    }
    Ok(())
}

#[then(regex = r"^every accepted job ended with exactly one terminal event$")]
async fn one_terminal(w: &mut TestWorld) -> StepResult {
    for t in w.done.values() {
        let bad = events::check_order(&t.events);
        check!(bad.is_empty(), "job {}: {}", t.job_id, bad.join("; "));
    }
    Ok(())
}

// ---- plain replies ----

fn reply(w: &TestWorld) -> anyhow::Result<&crate::client::Reply> {
    w.reply
        .as_ref()
        .ok_or_else(|| anyhow!("no plain reply recorded (the request opened a stream?)"))
}

#[then(regex = r#"^the reply is (\d+) "([^"]+)" naming "([^"]+)"$"#)]
async fn reply_naming(
    w: &mut TestWorld,
    status: u16,
    code: super::Code,
    field: String,
) -> StepResult {
    reply_code(w, status, code).await?;
    let r = w.reply.as_ref().unwrap();
    let v = r.json()?;
    let msg = v.get("message").and_then(Value::as_str).unwrap_or("");
    check!(
        msg.contains(&field),
        "the message {msg:?} does not name {field}"
    );
    check!(
        v.get("retriable") == Some(&Value::Bool(false)),
        "an invalid request must have retriable false: {}",
        r.body
    );
    Ok(())
}

#[then(regex = r#"^the reply is (\d+) "([^"]+)"$"#)]
async fn reply_code(w: &mut TestWorld, status: u16, code: super::Code) -> StepResult {
    let r = reply(w)?;
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
    Ok(())
}

#[then(regex = r#"^the reply is 200 with content type "([^"]+)"$"#)]
async fn reply_stream(w: &mut TestWorld, ct: String) -> StepResult {
    let r = reply(w)?;
    check!(
        r.status == 200 && r.header("content-type").is_some_and(|v| v.starts_with(&ct)),
        "reply {} {:?}: {}",
        r.status,
        r.header("content-type"),
        r.body
    );
    Ok(())
}

#[then(regex = r"^the reply is not an event stream$")]
async fn reply_not_stream(w: &mut TestWorld) -> StepResult {
    let r = reply(w)?;
    check!(
        !r.header("content-type")
            .unwrap_or("")
            .starts_with("text/event-stream"),
        "an error reply came as an event stream"
    );
    Ok(())
}

#[then(regex = r"^the reply's error is retriable$")]
async fn reply_retriable(w: &mut TestWorld) -> StepResult {
    let r = reply(w)?;
    check!(retriable_of(&r.json()?)?, "not retriable: {}", r.body);
    Ok(())
}
