//! What the worker printed: its output (for start-up failures) and its JSON log's
//! narration events, their fields, and what must not be there.

use anyhow::anyhow;
use cucumber::then;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::check;
use crate::process::{exit_code, LogLine};
use crate::steps::params::{Names, Numbers};
use crate::steps::StepResult;
use crate::world::{tail, TestWorld};

fn first_index(log: &[LogLine], event: &str) -> Option<usize> {
    log.iter().position(|l| l.event() == Some(event))
}

#[then(expr = "the worker's output names the flag {string}")]
async fn names_flag(w: &mut TestWorld, flag: String) -> StepResult {
    let out = w.process.output()?;
    let variants = [flag.to_lowercase(), flag.to_lowercase().replace('-', "_")];
    check!(
        variants.iter().any(|v| out.contains(v.as_str())),
        "the output does not name {flag}:\n{}",
        tail(&out, 20)
    );
    Ok(())
}

/// Case-insensitively, all the names in one line (one record names the thing and its value).
#[then(expr = "the worker's output mentions {names}")]
pub async fn mentions(w: &mut TestWorld, names: Names) -> StepResult {
    let out = w.process.output()?;
    let names: Vec<String> = names.0.iter().map(|n| n.to_lowercase()).collect();
    let hit = out
        .lines()
        .any(|l| names.iter().all(|n| l.contains(n.as_str())));
    check!(
        hit,
        "no output line mentions {}:\n{}",
        names.join(" and "),
        tail(&out, 20)
    );
    Ok(())
}

#[then(expr = "the worker did not panic")]
pub async fn no_panic(w: &mut TestWorld) -> StepResult {
    let out = w.process.worker()?.log_text();
    check!(
        !out.contains("panicked at"),
        "the worker panicked:\n{}",
        tail(&out, 20)
    );
    if let Some(st) = w.process.worker()?.try_exit()? {
        check!(exit_code(st) != 101, "exit code 101 is Rust's panic code");
    }
    Ok(())
}

#[then(expr = "the log events appear in order: {names}")]
async fn in_order(w: &mut TestWorld, names: Names) -> StepResult {
    let log = w.process.worker()?.log();
    let mut last = None;
    for name in names.0 {
        let i = first_index(&log, &name).ok_or_else(|| anyhow!("no {name} record in the log"))?;
        if let Some((prev, j)) = &last {
            check!(i > *j, "{name} (line {i}) came before {prev} (line {j})");
        }
        last = Some((name, i));
    }
    Ok(())
}

#[then(expr = "the \"ready\" record carries the worker id")]
async fn ready_worker_id(w: &mut TestWorld) -> StepResult {
    let worker = w.process.worker()?;
    let id = worker
        .launch
        .get("--worker-id")
        .unwrap_or_default()
        .to_owned();
    let ready = worker.events("ready");
    let r = ready.first().ok_or_else(|| anyhow!("no ready record"))?;
    check!(
        r.field("worker_id").and_then(Value::as_str) == Some(id.as_str()),
        "ready record {} lacks worker_id {id}",
        r.text
    );
    Ok(())
}

#[then(expr = "the worker logged a(n) {string} record")]
async fn logged(w: &mut TestWorld, event: String) -> StepResult {
    check!(
        !w.process.worker()?.events(&event).is_empty(),
        "no {event} record in the log"
    );
    Ok(())
}

#[then(expr = "the worker logged no {string} record")]
async fn logged_none(w: &mut TestWorld, event: String) -> StepResult {
    let ev = w.process.worker()?.events(&event);
    check!(
        ev.is_empty(),
        "{} {event} record(s), the first: {}",
        ev.len(),
        ev[0].text
    );
    Ok(())
}

/// `fields "a", "*need*" and "b" and the model path`: `*x*` matches any field name containing x.
#[then(
    expr = "the worker logged an \"error\" record with code {string} and fields {names} and the model path"
)]
async fn error_record(w: &mut TestWorld, code: String, fields: Names) -> StepResult {
    let worker = w.process.worker()?;
    let model = worker
        .model_path()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let errors = worker.events("error");
    let rec = errors
        .iter()
        .find(|l| l.field("code").and_then(Value::as_str) == Some(code.as_str()))
        .ok_or_else(|| {
            anyhow!(
                "no error record with code {code}; error records: {:?}",
                errors.iter().map(|l| &l.text).collect::<Vec<_>>()
            )
        })?;
    let level = rec.field("level").and_then(Value::as_str).unwrap_or("");
    check!(
        level.eq_ignore_ascii_case("error"),
        "the {code} record's level is {level:?}, want ERROR"
    );
    let flat = flatten(rec.json.as_ref().unwrap());
    for f in fields.0 {
        let pat = f.trim_matches('*');
        let hit = if f.starts_with('*') {
            flat.iter().any(|(k, _)| k.contains(pat))
        } else {
            flat.iter().any(|(k, _)| k == pat)
        };
        check!(hit, "the {code} record has no field {f}: {}", rec.text);
    }
    check!(
        flat.iter().any(|(_, v)| v.as_str() == Some(model.as_str())),
        "the {code} record does not name the model path {model}: {}",
        rec.text
    );
    let n = errors
        .iter()
        .filter(|l| l.field("code").and_then(Value::as_str) == Some(code.as_str()))
        .count();
    check!(n == 1, "{n} {code} error records; want one");
    Ok(())
}

/// Every (key, value) of a record, nested objects included.
fn flatten(v: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Some(m) = v.as_object() {
        for (k, x) in m {
            if x.is_object() {
                out.extend(flatten(x));
            } else if let Some(a) = x.as_array().filter(|a| a.iter().all(Value::is_object)) {
                a.iter().for_each(|o| out.extend(flatten(o)));
            } else {
                out.push((k.clone(), x.clone()));
            }
        }
    }
    out
}

#[then(expr = "the log has events {names}")]
async fn has_events(w: &mut TestWorld, names: Names) -> StepResult {
    let log = w.process.worker()?.log();
    let missing: Vec<String> = names
        .0
        .into_iter()
        .filter(|e| first_index(&log, e).is_none())
        .collect();
    check!(
        missing.is_empty(),
        "events missing from the log: {missing:?}"
    );
    Ok(())
}

#[then(expr = "every narration record carries {names}")]
async fn narration_fields(w: &mut TestWorld, fields: Names) -> StepResult {
    let log = w.process.worker()?.log();
    let narr: Vec<&LogLine> = log.iter().filter(|l| l.event().is_some()).collect();
    check!(!narr.is_empty(), "no narration records");
    let mut bad = Vec::new();
    for l in narr {
        for f in &fields.0 {
            if l.field(f).is_none() {
                bad.push(format!("{} lacks {f}", l.event().unwrap()));
            }
        }
    }
    bad.dedup();
    check!(bad.is_empty(), "{}", bad.join("; "));
    Ok(())
}

#[then(expr = "the {names} records of job {string} carry its job_id")]
async fn job_records(w: &mut TestWorld, events: Names, id: String) -> StepResult {
    let log = w.process.worker()?.log();
    for e in events.0 {
        let hit = log.iter().any(|l| {
            l.event() == Some(e.as_str())
                && l.field("job_id").and_then(Value::as_str) == Some(id.as_str())
        });
        check!(hit, "no {e} record with job_id {id}");
    }
    Ok(())
}

#[then(
    expr = "the \"execute_end\" record of job {string} has tokens_in, and tokens_out, decode_time_ms and first_token_ms equal to its end event"
)]
async fn execute_end_fields(w: &mut TestWorld, id: String) -> StepResult {
    let end = w
        .settle(&id)
        .await?
        .first("end")
        .ok_or_else(|| anyhow!("job {id} has no end event"))?
        .data
        .clone();
    let log = w.process.worker()?.log();
    let rec = log
        .iter()
        .find(|l| {
            l.event() == Some("execute_end")
                && l.field("job_id").and_then(Value::as_str) == Some(id.as_str())
        })
        .ok_or_else(|| anyhow!("no execute_end record for {id}"))?;
    check!(
        rec.number("tokens_in").is_some_and(|n| n > 0.0),
        "execute_end has no positive tokens_in: {}",
        rec.text
    );
    for k in ["tokens_out", "decode_time_ms", "first_token_ms"] {
        let (a, b) = (rec.number(k), end.get(k).and_then(Value::as_f64));
        check!(
            a.is_some() && a == b,
            "execute_end {k} = {a:?}, end event {k} = {b:?}"
        );
    }
    Ok(())
}

#[then(expr = "the \"model_load_complete\" record has a numeric {string}")]
async fn load_complete_numeric(w: &mut TestWorld, field: String) -> StepResult {
    let recs = w.process.worker()?.events("model_load_complete");
    let r = recs
        .first()
        .ok_or_else(|| anyhow!("no model_load_complete record"))?;
    check!(
        r.number(&field).is_some(),
        "model_load_complete has no numeric {field}: {}",
        r.text
    );
    Ok(())
}

#[then(expr = "the worker's log does not contain {names}")]
async fn log_lacks(w: &mut TestWorld, texts: Names) -> StepResult {
    let log = w.process.worker()?.log_text();
    for s in texts.0 {
        check!(!log.contains(&s), "the log contains {s:?}");
    }
    Ok(())
}

#[then(expr = "the worker's log does not contain job {string}'s generated text")]
async fn log_lacks_output(w: &mut TestWorld, id: String) -> StepResult {
    let text = w.settle(&id).await?.text();
    let text = text.trim();
    check!(
        text.chars().count() >= 8,
        "the job generated too little text ({text:?}) to search for"
    );
    let log = w.process.worker()?.log_text();
    check!(
        !log.contains(text),
        "the log contains the generated text {text:?}"
    );
    Ok(())
}

#[then(expr = "the worker's log contains the SHA-256 of job {string}'s prompt")]
async fn log_has_hash(w: &mut TestWorld, id: String) -> StepResult {
    let prompt = w
        .stream
        .requests
        .get(&id)
        .and_then(|r| r.get("prompt"))
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("job {id} had no prompt"))?
        .to_owned();
    let hex: String = Sha256::digest(prompt.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let log = w.process.worker()?.log_text().to_lowercase();
    check!(
        log.contains(&hex),
        "the log lacks the prompt's SHA-256 {hex}"
    );
    Ok(())
}

#[then(
    expr = "the log has \"model_load_progress\" percent {numbers} in order between {string} and {string}"
)]
async fn progress(w: &mut TestWorld, want: Numbers, start: String, end: String) -> StepResult {
    let want = want.0;
    let log = w.process.worker()?.log();
    let (s, e) = (
        first_index(&log, &start).ok_or_else(|| anyhow!("no {start}"))?,
        first_index(&log, &end).ok_or_else(|| anyhow!("no {end}"))?,
    );
    let all: Vec<(usize, Option<f64>)> = log
        .iter()
        .enumerate()
        .filter(|(_, l)| l.event() == Some("model_load_progress"))
        .map(|(i, l)| (i, l.number("percent")))
        .collect();
    check!(
        all.iter().all(|(i, _)| *i > s && *i < e),
        "progress records outside {start}..{end}: {all:?}"
    );
    let got: Vec<f64> = all.iter().filter_map(|(_, p)| *p).collect();
    check!(
        got == want,
        "progress percents {got:?}, want {want:?} (each once, in order)"
    );
    Ok(())
}
