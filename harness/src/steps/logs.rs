//! The worker's JSON log: narration events, their fields, and what must not be there.

use anyhow::anyhow;
use cucumber::then;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{quoted_list, StepResult};
use crate::check;
use crate::process::LogLine;
use crate::world::TestWorld;

fn first_index(log: &[LogLine], event: &str) -> Option<usize> {
    log.iter().position(|l| l.event() == Some(event))
}

#[then(regex = r"^the log events appear in order: (.+)$")]
async fn in_order(w: &mut TestWorld, list: String) -> StepResult {
    let log = w.worker()?.log();
    let mut last = None;
    for name in quoted_list(&list) {
        let i = first_index(&log, &name).ok_or_else(|| anyhow!("no {name} record in the log"))?;
        if let Some((prev, j)) = &last {
            check!(i > *j, "{name} (line {i}) came before {prev} (line {j})");
        }
        last = Some((name, i));
    }
    Ok(())
}

#[then(regex = r#"^the "ready" record carries the worker id$"#)]
async fn ready_worker_id(w: &mut TestWorld) -> StepResult {
    let worker = w.worker()?;
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

#[then(regex = r#"^the worker logged an? "([^"]+)" record$"#)]
async fn logged(w: &mut TestWorld, event: String) -> StepResult {
    check!(
        !w.worker()?.events(&event).is_empty(),
        "no {event} record in the log"
    );
    Ok(())
}

#[then(regex = r#"^the worker logged no "([^"]+)" record$"#)]
async fn logged_none(w: &mut TestWorld, event: String) -> StepResult {
    let ev = w.worker()?.events(&event);
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
    regex = r#"^the worker logged an "error" record with code "([^"]+)" and fields (.+) and the model path$"#
)]
async fn error_record(w: &mut TestWorld, code: String, fields: String) -> StepResult {
    let worker = w.worker()?;
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
    for f in quoted_list(&fields) {
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

#[then(regex = r"^the log has events (.+)$")]
async fn has_events(w: &mut TestWorld, list: String) -> StepResult {
    let log = w.worker()?.log();
    let missing: Vec<String> = quoted_list(&list)
        .into_iter()
        .filter(|e| first_index(&log, e).is_none())
        .collect();
    check!(
        missing.is_empty(),
        "events missing from the log: {missing:?}"
    );
    Ok(())
}

#[then(regex = r"^every narration record carries (.+)$")]
async fn narration_fields(w: &mut TestWorld, list: String) -> StepResult {
    let fields = quoted_list(&list);
    let log = w.worker()?.log();
    let narr: Vec<&LogLine> = log.iter().filter(|l| l.event().is_some()).collect();
    check!(!narr.is_empty(), "no narration records");
    let mut bad = Vec::new();
    for l in narr {
        for f in &fields {
            if l.field(f).is_none() {
                bad.push(format!("{} lacks {f}", l.event().unwrap()));
            }
        }
    }
    bad.dedup();
    check!(bad.is_empty(), "{}", bad.join("; "));
    Ok(())
}

#[then(regex = r#"^the (.+) records of job "([^"]+)" carry its job_id$"#)]
async fn job_records(w: &mut TestWorld, list: String, id: String) -> StepResult {
    let log = w.worker()?.log();
    for e in quoted_list(&list) {
        let hit = log.iter().any(|l| {
            l.event() == Some(e.as_str())
                && l.field("job_id").and_then(Value::as_str) == Some(id.as_str())
        });
        check!(hit, "no {e} record with job_id {id}");
    }
    Ok(())
}

#[then(
    regex = r#"^the "execute_end" record of job "([^"]+)" has tokens_in, and tokens_out, decode_time_ms and first_token_ms equal to its end event$"#
)]
async fn execute_end_fields(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let end = w
        .transcript(&id)?
        .first("end")
        .ok_or_else(|| anyhow!("job {id} has no end event"))?
        .data
        .clone();
    let log = w.worker()?.log();
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

#[then(regex = r#"^the "model_load_complete" record has a numeric "([^"]+)"$"#)]
async fn load_complete_numeric(w: &mut TestWorld, field: String) -> StepResult {
    let recs = w.worker()?.events("model_load_complete");
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

#[then(regex = r#"^the worker's log does not contain "([^"]+)" or "([^"]+)"$"#)]
async fn log_lacks(w: &mut TestWorld, a: String, b: String) -> StepResult {
    let log = w.worker()?.log_text();
    for s in [a, b] {
        check!(!log.contains(&s), "the log contains {s:?}");
    }
    Ok(())
}

#[then(regex = r#"^the worker's log does not contain job "([^"]+)"'s generated text$"#)]
async fn log_lacks_output(w: &mut TestWorld, id: String) -> StepResult {
    w.settle(&id).await?;
    let text = w.transcript(&id)?.text();
    let text = text.trim();
    check!(
        text.chars().count() >= 8,
        "the job generated too little text ({text:?}) to search for"
    );
    let log = w.worker()?.log_text();
    check!(
        !log.contains(text),
        "the log contains the generated text {text:?}"
    );
    Ok(())
}

#[then(regex = r#"^the worker's log contains the SHA-256 of job "([^"]+)"'s prompt$"#)]
async fn log_has_hash(w: &mut TestWorld, id: String) -> StepResult {
    let prompt = w
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
    let log = w.worker()?.log_text().to_lowercase();
    check!(
        log.contains(&hex),
        "the log lacks the prompt's SHA-256 {hex}"
    );
    Ok(())
}

#[then(
    regex = r#"^the log has "model_load_progress" percent (.+) in order between "([^"]+)" and "([^"]+)"$"#
)]
async fn progress(w: &mut TestWorld, list: String, start: String, end: String) -> StepResult {
    let want: Vec<f64> = list
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("bad percent list {list}: {e}"))?;
    let log = w.worker()?.log();
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
