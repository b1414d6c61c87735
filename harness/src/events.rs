//! Checks of an `/execute` event stream against REQUIREMENTS.md:
//! framing (M0-W-1310), order and one terminal event (M0-W-1311) and payload
//! schemas with the `i` and `tokens_out` cross-checks (M0-W-1312).
//! Each check returns the list of violations found (empty when conformant).

use serde_json::Value;

use crate::client::{Event, Transcript};

pub const EVENT_KINDS: [&str; 5] = ["started", "token", "metrics", "end", "error"];
pub const ERROR_CODES: [&str; 11] = [
    "INVALID_REQUEST",
    "MODEL_LOAD_FAILED",
    "INSUFFICIENT_VRAM",
    "VRAM_OOM",
    "CUDA_ERROR",
    "INFERENCE_TIMEOUT",
    "CANCELLED",
    "INTERNAL",
    "QUEUE_FULL",
    "SHUTTING_DOWN",
    "INFERENCE_FAILED",
];
pub const STOP_REASONS: [&str; 3] = ["max_tokens", "eos", "stop_sequence"];

/// Checks the raw bytes frame by frame: each frame is one `event: <type>` line and
/// one `data: <json object>` line, frames end with a blank line; comment frames
/// (`:` keep-alives) are allowed.
pub fn check_framing(raw: &[u8]) -> Vec<String> {
    let mut bad = Vec::new();
    let text = match std::str::from_utf8(raw) {
        Ok(t) => t,
        Err(e) => return vec![format!("stream is not UTF-8: {e}")],
    };
    let text = text.replace("\r\n", "\n");
    if !text.is_empty() && !text.ends_with("\n\n") {
        bad.push("stream does not end with a complete frame (blank line)".to_owned());
    }
    for (n, frame) in text.split("\n\n").filter(|f| !f.is_empty()).enumerate() {
        let lines: Vec<&str> = frame.lines().collect();
        if lines.iter().all(|l| l.starts_with(':')) {
            continue;
        }
        let fields: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| !l.starts_with(':'))
            .collect();
        let events: Vec<&str> = fields.iter().filter_map(|l| field(l, "event")).collect();
        let datas: Vec<&str> = fields.iter().filter_map(|l| field(l, "data")).collect();
        if events.len() != 1 || datas.len() != 1 || fields.len() != 2 {
            bad.push(format!(
                "frame {n}: want one event line and one data line, got {fields:?}"
            ));
            continue;
        }
        if !EVENT_KINDS.contains(&events[0]) {
            bad.push(format!("frame {n}: unknown event type {:?}", events[0]));
        }
        match serde_json::from_str::<Value>(datas[0]) {
            Ok(Value::Object(_)) => {}
            Ok(other) => bad.push(format!("frame {n}: data is not a JSON object: {other}")),
            Err(e) => bad.push(format!("frame {n}: data is not JSON ({e}): {:?}", datas[0])),
        }
    }
    bad
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

/// `started (token|metrics)* (end|error)` and nothing after the terminal event.
pub fn check_order(events: &[Event]) -> Vec<String> {
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let mut bad = Vec::new();
    if kinds.first() != Some(&"started") {
        bad.push(format!("first event is not started: {kinds:?}"));
    }
    let terminals: Vec<usize> = kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == "end" || **k == "error")
        .map(|(i, _)| i)
        .collect();
    match terminals.as_slice() {
        [] => bad.push(format!("no terminal event: {kinds:?}")),
        [t] if *t + 1 != kinds.len() => {
            bad.push(format!("events after the terminal event: {kinds:?}"))
        }
        [_] => {}
        _ => bad.push(format!("{} terminal events: {kinds:?}", terminals.len())),
    }
    let middle_end = terminals.first().copied().unwrap_or(kinds.len());
    for k in kinds.iter().take(middle_end).skip(1) {
        if *k != "token" && *k != "metrics" {
            bad.push(format!(
                "unexpected {k} between started and the terminal event: {kinds:?}"
            ));
            break;
        }
    }
    bad
}

/// Payload schemas of every event plus the `i` and `tokens_out` cross-checks.
pub fn check_payloads(t: &Transcript) -> Vec<String> {
    let mut bad = Vec::new();
    let mut next_i = 0i64;
    for (n, e) in t.events.iter().enumerate() {
        let at = format!("event {n} ({})", e.kind);
        let d = &e.data;
        if !d.is_object() {
            bad.push(format!("{at}: data is not a JSON object: {:?}", e.raw_data));
            continue;
        }
        match e.kind.as_str() {
            "started" => {
                want_str(d, "job_id", &at, &mut bad);
                if d.get("job_id")
                    .and_then(Value::as_str)
                    .is_some_and(|j| j != t.job_id)
                {
                    bad.push(format!(
                        "{at}: job_id {} is not the request's {}",
                        d["job_id"], t.job_id
                    ));
                }
                want_str(d, "model", &at, &mut bad);
                match d.get("started_at").and_then(Value::as_str) {
                    Some(s) if chrono::DateTime::parse_from_rfc3339(s).is_ok() => {}
                    other => bad.push(format!("{at}: started_at is not RFC 3339: {other:?}")),
                }
                want_u64(d, "seed", &at, &mut bad);
            }
            "token" => {
                want_str(d, "t", &at, &mut bad);
                want_u64(d, "id", &at, &mut bad);
                match d.get("i").and_then(Value::as_i64) {
                    Some(i) if i == next_i => {}
                    other => bad.push(format!("{at}: i is {other:?}, want {next_i}")),
                }
                next_i += 1;
                if let Some(lp) = d.get("logprobs") {
                    bad.extend(check_logprobs(lp).into_iter().map(|m| format!("{at}: {m}")));
                }
            }
            "metrics" => {}
            "end" => {
                for k in ["tokens_out", "decode_time_ms", "first_token_ms"] {
                    want_number(d, k, &at, &mut bad);
                }
                match d.get("stop_reason").and_then(Value::as_str) {
                    Some(r) if STOP_REASONS.contains(&r) => {
                        if r == "stop_sequence" {
                            want_str(d, "stop_sequence", &at, &mut bad);
                        }
                    }
                    other => bad.push(format!(
                        "{at}: stop_reason {other:?} not in {STOP_REASONS:?}"
                    )),
                }
                let count = t.tokens().count() as u64;
                if let Some(n) = d.get("tokens_out").and_then(Value::as_u64) {
                    if n != count {
                        bad.push(format!("{at}: tokens_out {n} but {count} token events"));
                    }
                }
            }
            "error" => bad.extend(
                check_error_body(d)
                    .into_iter()
                    .map(|m| format!("{at}: {m}")),
            ),
            other => bad.push(format!("{at}: unknown event type {other}")),
        }
    }
    bad
}

/// `{code, message, retriable}` with a known code; the same body as HTTP errors.
pub fn check_error_body(d: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    match d.get("code").and_then(Value::as_str) {
        Some(c) if ERROR_CODES.contains(&c) => {}
        other => bad.push(format!("code {other:?} is not a known error code")),
    }
    if !d.get("message").is_some_and(Value::is_string) {
        bad.push(format!("message is not a string: {:?}", d.get("message")));
    }
    if !d.get("retriable").is_some_and(Value::is_boolean) {
        bad.push(format!(
            "retriable is not a boolean: {:?}",
            d.get("retriable")
        ));
    }
    bad
}

/// A list of `{id, t, logprob}` sorted by logprob (descending), natural-log probabilities.
pub fn check_logprobs(lp: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(list) = lp.as_array() else {
        return vec![format!("logprobs is not a list: {lp}")];
    };
    let mut prev = f64::INFINITY;
    let mut mass = 0.0;
    for (k, item) in list.iter().enumerate() {
        let (id, t, p) = (
            item.get("id").and_then(Value::as_u64),
            item.get("t").and_then(Value::as_str),
            item.get("logprob").and_then(Value::as_f64),
        );
        let (Some(_), Some(_), Some(p)) = (id, t, p) else {
            bad.push(format!("logprobs[{k}] lacks id/t/logprob: {item}"));
            continue;
        };
        if p > 1e-6 {
            bad.push(format!("logprobs[{k}] = {p} > 0 (not a log-probability)"));
        }
        if p > prev + 1e-9 {
            bad.push(format!("logprobs not sorted: [{k}] = {p} after {prev}"));
        }
        prev = p;
        mass += p.exp();
    }
    if mass > 1.0 + 1e-3 {
        bad.push(format!(
            "probabilities of the listed tokens sum to {mass} > 1"
        ));
    }
    bad
}

fn want_str(d: &Value, k: &str, at: &str, bad: &mut Vec<String>) {
    if !d.get(k).is_some_and(Value::is_string) {
        bad.push(format!("{at}: {k} is not a string: {:?}", d.get(k)));
    }
}

fn want_u64(d: &Value, k: &str, at: &str, bad: &mut Vec<String>) {
    if d.get(k).and_then(Value::as_u64).is_none() {
        bad.push(format!(
            "{at}: {k} is not an unsigned integer: {:?}",
            d.get(k)
        ));
    }
}

fn want_number(d: &Value, k: &str, at: &str, bad: &mut Vec<String>) {
    if !d.get(k).is_some_and(Value::is_number) {
        bad.push(format!("{at}: {k} is not a number: {:?}", d.get(k)));
    }
}

/// Every violation of framing, order and payloads in one transcript.
pub fn check_all(t: &Transcript) -> Vec<String> {
    let mut bad = check_framing(&t.raw);
    bad.extend(check_order(&t.events));
    bad.extend(check_payloads(t));
    if !t.closed {
        bad.push(format!(
            "stream did not close cleanly: {:?}",
            t.transport_error
        ));
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn ev(kind: &str, data: Value) -> Event {
        Event {
            kind: kind.into(),
            raw_data: data.to_string(),
            data,
            at: Duration::ZERO,
        }
    }

    fn transcript(events: Vec<Event>) -> Transcript {
        let mut raw = String::new();
        for e in &events {
            raw.push_str(&format!("event: {}\ndata: {}\n\n", e.kind, e.raw_data));
        }
        Transcript {
            job_id: "j".into(),
            status: 200,
            content_type: "text/event-stream".into(),
            sent_at: String::new(),
            sent: std::time::Instant::now(),
            events,
            raw: raw.into_bytes(),
            closed: true,
            transport_error: None,
        }
    }

    fn good() -> Transcript {
        transcript(vec![
            ev(
                "started",
                json!({"job_id": "j", "model": "m", "started_at": "2025-01-01T00:00:00Z", "seed": 7}),
            ),
            ev(
                "token",
                json!({"t": "a", "i": 0, "id": 5, "logprobs": [{"id": 5, "t": "a", "logprob": -0.1}, {"id": 6, "t": "b", "logprob": -3.0}]}),
            ),
            ev("token", json!({"t": "b", "i": 1, "id": 6})),
            ev(
                "end",
                json!({"tokens_out": 2, "decode_time_ms": 3, "first_token_ms": 1, "stop_reason": "max_tokens"}),
            ),
        ])
    }

    #[test]
    fn a_conformant_stream_has_no_violations() {
        assert_eq!(check_all(&good()), Vec::<String>::new());
    }

    #[test]
    fn framing_flags_two_data_lines_and_a_missing_blank_line() {
        let bad = check_framing(b"event: token\ndata: {}\ndata: {}\n\nevent: end\ndata: {}\n");
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(check_framing(b": keep-alive\n\nevent: end\ndata: {\"a\":1}\n\n").is_empty());
    }

    #[test]
    fn order_flags_events_after_the_terminal_one_and_two_terminals() {
        let mut t = good();
        t.events.push(ev("token", json!({})));
        assert!(check_order(&t.events)
            .iter()
            .any(|m| m.contains("after the terminal")));
        let two = vec![
            ev("started", json!({})),
            ev("end", json!({})),
            ev("error", json!({})),
        ];
        assert!(check_order(&two).iter().any(|m| m.contains("2 terminal")));
        let none = vec![ev("started", json!({})), ev("token", json!({}))];
        assert!(check_order(&none).iter().any(|m| m.contains("no terminal")));
    }

    #[test]
    fn payloads_cross_check_i_and_tokens_out() {
        let mut t = good();
        t.events[2].data["i"] = json!(5);
        t.events[3].data["tokens_out"] = json!(3);
        let bad = check_payloads(&t);
        assert!(bad.iter().any(|m| m.contains("i is Some(5)")), "{bad:?}");
        assert!(bad.iter().any(|m| m.contains("tokens_out 3")), "{bad:?}");
    }

    #[test]
    fn logprobs_must_be_sorted_log_probabilities() {
        assert!(check_logprobs(
            &json!([{"id": 1, "t": "x", "logprob": -2.0}, {"id": 2, "t": "y", "logprob": -1.0}])
        )[0]
        .contains("not sorted"));
        assert!(check_logprobs(&json!([{"id": 1, "t": "x", "logprob": 0.5}]))[0].contains("> 0"));
    }

    #[test]
    fn error_bodies_need_a_known_code_and_typed_fields() {
        assert!(check_error_body(
            &json!({"code": "CANCELLED", "message": "m", "retriable": false})
        )
        .is_empty());
        assert_eq!(
            check_error_body(&json!({"code": "NOPE", "message": 1, "retriable": "no"})).len(),
            3
        );
    }
}
