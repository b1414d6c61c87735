//! Checks of finished jobs' streams: order, terminal events, errors, payloads,
//! framing, timing and text.

use anyhow::anyhow;
use cucumber::then;
use serde_json::Value;

use crate::check;
use crate::client::Transcript;
use crate::events;
use crate::steps::params::{After, Code, ErrorOf, Jobs, Retriable};
use crate::steps::StepResult;
use crate::world::{conformance, TestWorld};

fn kinds(t: &Transcript) -> String {
    t.events
        .iter()
        .map(|e| e.kind.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[then(expr = "job {string} streamed started, at least 1 token and end")]
async fn started_tokens_end(w: &mut TestWorld, id: String) -> StepResult {
    let t = w.settle(&id).await?;
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
    let first = w.stream.transcript(&ids[0])?.token_ids();
    check!(!first.is_empty(), "job {} produced no tokens", ids[0]);
    for id in &ids[1..] {
        let other = w.stream.transcript(id)?.token_ids();
        check!(
            other == first,
            "job {id} produced {other:?}, job {} produced {first:?}",
            ids[0]
        );
    }
    Ok(())
}

#[then(expr = "{jobs} produced the same token ids")]
async fn same_tokens(w: &mut TestWorld, jobs: Jobs) -> StepResult {
    for id in &jobs.0 {
        w.settle(id).await?;
    }
    same_ids(w, &jobs.0)
}

#[then(expr = "all {int} runs produced the same token ids")]
async fn all_runs_same(w: &mut TestWorld, n: usize) -> StepResult {
    let ids = w.stream.repeat_ids.clone();
    check!(ids.len() == n, "{} runs recorded, want {n}", ids.len());
    same_ids(w, &ids)
}

/// The job ended with an `error` event of that code; returns how many tokens came first.
fn ended_with_error(w: &TestWorld, id: &str, code: &str) -> anyhow::Result<usize> {
    let t = w.stream.transcript(id)?;
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

#[then(expr = "job {string} ended with error {code}{after}")]
async fn ended_with_error_code(
    w: &mut TestWorld,
    id: String,
    code: Code,
    after: After,
) -> StepResult {
    w.settle(&id).await?;
    let got = ended_with_error(w, &id, &code.0)?;
    match after {
        After::Any => {}
        After::Exactly(n) => {
            check!(
                got == n,
                "job {id} streamed {got} tokens before {code}, want {n}"
            );
        }
        After::AtLeast(n) => {
            check!(
                got >= n,
                "job {id} streamed {got} tokens before {code}, want at least {n}"
            );
        }
    }
    Ok(())
}

fn ended_with_end(w: &TestWorld, id: &str) -> StepResult {
    let t = w.stream.transcript(id)?;
    let bad = events::check_order(&t.events);
    check!(bad.is_empty(), "job {id}: {}", bad.join("; "));
    check!(
        t.events.last().is_some_and(|e| e.kind == "end"),
        "job {id} ended with {:?}",
        t.terminal().map(|e| &e.raw_data)
    );
    Ok(())
}

#[then(expr = "{jobs} ended with \"end\"")]
async fn ended_end(w: &mut TestWorld, jobs: Jobs) -> StepResult {
    for id in &jobs.0 {
        w.settle(id).await?;
    }
    for id in &jobs.0 {
        ended_with_end(w, id)?;
    }
    Ok(())
}

#[then(expr = "job {string} ended with \"end\" or error {code}")]
async fn end_or_error(w: &mut TestWorld, id: String, code: Code) -> StepResult {
    w.settle(&id).await?;
    if ended_with_end(w, &id).is_err() {
        ended_with_error(w, &id, &code.0)?;
    }
    Ok(())
}

/// The error body of a job's `error` event, of the first refused job, or of the plain reply.
async fn error_body(w: &mut TestWorld, of: &ErrorOf) -> anyhow::Result<(Value, String)> {
    match of {
        ErrorOf::Job(id) => {
            let e = w
                .settle(id)
                .await?
                .first("error")
                .ok_or_else(|| anyhow!("job {id} has no error event"))?;
            Ok((e.data.clone(), e.raw_data.clone()))
        }
        ErrorOf::Refused => {
            let (_, r) = w
                .stream
                .refused
                .first()
                .ok_or_else(|| anyhow!("no job was refused"))?;
            Ok((r.json()?, r.body.clone()))
        }
        ErrorOf::Reply => {
            let r = w.stream.reply()?;
            Ok((r.json()?, r.body.clone()))
        }
    }
}

#[then(expr = "{error_of} error is {retriable}")]
async fn error_retriable(w: &mut TestWorld, of: ErrorOf, want: Retriable) -> StepResult {
    let (v, raw) = error_body(w, &of).await?;
    let got = v
        .get("retriable")
        .and_then(Value::as_bool)
        .ok_or_else(|| anyhow!("error body has no boolean retriable: {v}"))?;
    check!(
        got == want.0,
        "the error {raw} has retriable {got}, want {}",
        want.0
    );
    Ok(())
}

#[then(expr = "{error_of} error has a string code, a string message and a boolean retriable")]
async fn error_typed(w: &mut TestWorld, of: ErrorOf) -> StepResult {
    let (v, raw) = error_body(w, &of).await?;
    let bad = events::check_error_body(&v);
    check!(bad.is_empty(), "{raw}: {}", bad.join("; "));
    Ok(())
}

#[then(expr = "{error_of} error message does not contain {string}")]
async fn error_message_clean(w: &mut TestWorld, of: ErrorOf, text: String) -> StepResult {
    let (_, raw) = error_body(w, &of).await?;
    check!(
        !raw.contains(&text),
        "the error event repeats prompt text: {raw}"
    );
    Ok(())
}

#[then(expr = "every job streamed a conformant transcript")]
async fn all_conformant(w: &mut TestWorld) -> StepResult {
    check!(
        !w.stream.done.is_empty(),
        "no job finished in this scenario"
    );
    let bad: Vec<String> = w
        .stream
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

#[then(expr = "every job streamed started, tokens, then one terminal event and nothing after")]
async fn all_ordered(w: &mut TestWorld) -> StepResult {
    check!(
        !w.stream.done.is_empty(),
        "no job finished in this scenario"
    );
    let mut bad = Vec::new();
    for t in w.stream.done.values() {
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

#[then(expr = "job {string} has conformant SSE framing")]
async fn framing(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.stream.transcript(&id)?;
    let bad = events::check_framing(&t.raw);
    check!(bad.is_empty(), "{}", bad.join("\n"));
    check!(
        t.content_type.starts_with("text/event-stream"),
        "content type {}",
        t.content_type
    );
    Ok(())
}

#[then(expr = "job {string}'s tokens arrived spread over its decode time")]
async fn spread(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.stream.transcript(&id)?;
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

#[then(expr = "at temperature 0 every token of job {string} is its top log-probability")]
async fn greedy_is_top(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.stream.transcript(&id)?;
    let want = w
        .stream
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

#[then(expr = "every transcript recorded so far in this run is conformant")]
async fn run_conformant(_w: &mut TestWorld) -> StepResult {
    let (n, lines) = conformance::report();
    check!(n > 0, "no transcript recorded");
    check!(
        lines.is_empty(),
        "{} of {n} transcripts break the event rules:\n{}",
        lines.len(),
        lines.join("\n")
    );
    Ok(())
}

#[then(expr = "job {string}'s text is exactly {string}")]
async fn exact_text(w: &mut TestWorld, id: String, text: String) -> StepResult {
    w.settle(&id).await?;
    let got = w.stream.transcript(&id)?.text();
    check!(got == text, "job {id} streamed {got:?}, want {text:?}");
    Ok(())
}

#[then(expr = "job {string} ended with stop_reason {string} and stop_sequence {string}")]
async fn stop_reason(w: &mut TestWorld, id: String, reason: String, seq: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.stream.transcript(&id)?;
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
    expr = "every token text of job {string} is whole UTF-8, with U+FFFD only for a character cut off by max_tokens"
)]
async fn whole_utf8(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let t = w.stream.transcript(&id)?;
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

#[then(expr = "job {string}'s first token arrived within {int} s")]
async fn first_token_within(w: &mut TestWorld, id: String, secs: u64) -> StepResult {
    w.settle(&id).await?;
    let t = w.stream.transcript(&id)?;
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

#[then(expr = "job {string} was still streaming afterwards")]
async fn still_streaming(w: &mut TestWorld, id: String) -> StepResult {
    let job = w
        .stream
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

/// Orders the jobs by when they started producing (first token, else the terminal event),
/// then checks that none began before the previous one ended, and that this run order
/// never goes against acceptance order (`started_at`; equal times are a tie).
#[then(expr = "the accepted jobs ran one at a time in the order they were accepted")]
async fn fifo(w: &mut TestWorld) -> StepResult {
    let started_at = |t: &Transcript| {
        t.first("started")
            .and_then(|e| e.data.get("started_at"))
            .and_then(Value::as_str)
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
    };
    let began = |t: &Transcript| t.tokens().next().or(t.terminal()).map(|e| t.arrival(e));
    let mut jobs: Vec<&Transcript> = w.stream.done.values().collect();
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

#[then(expr = "every accepted job ended with exactly one terminal event")]
async fn one_terminal(w: &mut TestWorld) -> StepResult {
    for t in w.stream.done.values() {
        let bad = events::check_order(&t.events);
        check!(bad.is_empty(), "job {}: {}", t.job_id, bad.join("; "));
    }
    Ok(())
}
