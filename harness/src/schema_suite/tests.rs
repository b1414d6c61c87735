use std::time::Duration;

use serde_json::{json, Value};

use super::ask::{body, judge, Outcome, Sampling, Verdict};
use super::corpus::{self, Entry, Filter};
use super::report::Report;
use crate::client::Reply;

fn entry(name: &str, schema: Value) -> Entry {
    Entry {
        category: "hand".into(),
        name: name.into(),
        validator: corpus::validator(&schema).unwrap(),
        schema,
    }
}

fn person() -> Entry {
    entry(
        "person.v1",
        json!({
            "title": "Person",
            "type": "object",
            "properties": {
                "email": {"type": "string", "format": "email"},
                "age": {"type": "integer", "minimum": 0}
            },
            "required": ["email"],
            "additionalProperties": false
        }),
    )
}

fn reply(status: u16, body: Value) -> Reply {
    Reply {
        status,
        headers: vec![],
        body: body.to_string(),
        elapsed: Duration::from_millis(10),
    }
}

fn answer(content: &str, finish: &str) -> Reply {
    reply(
        200,
        json!({
            "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": finish}],
            "usage": {"completion_tokens": 7}
        }),
    )
}

#[test]
fn complete_outputs_are_checked_against_the_schema_formats_included() {
    let e = person();
    let verdict = |content: &str| judge(&e, &answer(content, "stop")).0;
    assert_eq!(verdict(r#"{"email": "a@b.org", "age": 3}"#), Verdict::Valid);
    let Verdict::Invalid(errors) = verdict(r#"{"email": "not an address", "age": -1}"#) else {
        panic!("a bad email and a negative age pass");
    };
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(matches!(
        verdict(r#"{"email": "a@b.org", "x": 1}"#),
        Verdict::Invalid(_)
    ));
    let Verdict::Invalid(errors) = verdict(r#"{"email": "#) else {
        panic!("cut JSON passes");
    };
    assert!(errors[0].starts_with("not JSON"), "{errors:?}");
}

#[test]
fn cut_off_refused_and_failed_answers_are_told_apart() {
    let e = person();
    let (v, output, tokens) = judge(&e, &answer(r#"{"email": "#, "length"));
    assert_eq!(
        (v, output.as_str(), tokens),
        (Verdict::Truncated, r#"{"email": "#, 7)
    );
    let refusal = json!({"error": {"message": "response_format: cannot be enforced: Unimplemented keys: [\"not\"]"}});
    assert_eq!(
        judge(&e, &reply(400, refusal)).0,
        Verdict::Refused(
            "response_format: cannot be enforced: Unimplemented keys: [\"not\"]".into()
        )
    );
    assert!(matches!(
        judge(&e, &reply(503, json!({}))).0,
        Verdict::Error(_)
    ));
    assert!(matches!(
        judge(&e, &answer("{}", "tool_calls")).0,
        Verdict::Error(_)
    ));
}

#[test]
fn the_request_is_strict_seeded_and_names_the_schema() {
    let e = person();
    let s = Sampling {
        model: "smol".into(),
        temperature: 1.0,
        max_tokens: 64,
        timeout: Duration::from_secs(1),
    };
    let b = body(&e, 5, &s);
    let format = &b["response_format"]["json_schema"];
    assert_eq!(b["response_format"]["type"], "json_schema");
    assert_eq!(
        (&format["strict"], &format["name"]),
        (&json!(true), &json!("person_v1"))
    );
    assert_eq!(format["schema"], e.schema);
    assert_eq!(
        (&b["seed"], &b["temperature"], &b["max_tokens"]),
        (&json!(5), &json!(1.0), &json!(64))
    );
    let prompt = b["messages"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("\"Person\""), "{prompt}");
}

fn outcome(schema: &str, seed: u64, verdict: Verdict) -> Outcome {
    Outcome {
        schema: schema.into(),
        seed,
        verdict,
        output: String::new(),
        tokens: 10,
        seconds: 0.5,
    }
}

#[test]
fn the_report_counts_per_category_and_lists_each_refused_schema_once() {
    let refused = || Verdict::Refused("not supported".into());
    let outcomes = vec![
        outcome("a/x", 2, Verdict::Valid),
        outcome("a/x", 1, Verdict::Truncated),
        outcome("a/y", 1, refused()),
        outcome("a/y", 2, refused()),
        outcome("b/z", 1, Verdict::Valid),
    ];
    let r = Report::new(json!({}), outcomes, 2.0);
    let a = &r.categories["a"];
    assert_eq!(
        (a.schemas, a.requests, a.valid, a.truncated, a.refused),
        (2, 4, 1, 1, 2)
    );
    assert_eq!(
        (r.total.schemas, r.total.requests, r.total.valid),
        (3, 5, 2)
    );
    assert_eq!(r.refused.len(), 1);
    assert_eq!(r.truncated[0].schema, "a/x");
    assert!(!r.failed());
    assert!(r.table().contains("total"));
    assert!(r.markdown().contains("- `a/y`: not supported"));
}

#[test]
fn an_invalid_output_an_error_or_nothing_checked_fails_the_run() {
    let run = |v: Verdict| {
        Report::new(
            json!({}),
            vec![outcome("a/x", 1, Verdict::Valid), outcome("a/y", 1, v)],
            1.0,
        )
    };
    assert!(run(Verdict::Invalid(vec!["no".into()])).failed());
    assert!(run(Verdict::Error("HTTP 500".into())).failed());
    let refused_only = vec![outcome("a/y", 1, Verdict::Refused("no".into()))];
    assert!(Report::new(json!({}), refused_only, 1.0).failed());
}

fn committed() -> std::path::PathBuf {
    crate::suite::find_workspace(None).join("testdata/schemas")
}

#[test]
fn the_committed_corpus_has_over_a_hundred_schemas_the_validator_compiles() {
    let all = corpus::load(&committed(), &Filter::default()).unwrap();
    assert!(all.len() >= 100, "{} schemas", all.len());
    let categories: std::collections::BTreeSet<_> =
        all.iter().map(|e| e.category.as_str()).collect();
    assert!(categories.len() >= 9, "{categories:?}");
}

#[test]
fn the_filter_takes_named_schemas_and_the_first_of_each_category() {
    let only = Filter {
        only: vec!["handwritten/order".into()],
        per_category: None,
    };
    let picked = corpus::load(&committed(), &only).unwrap();
    assert_eq!(
        picked.iter().map(Entry::id).collect::<Vec<_>>(),
        ["handwritten/order-numeric"]
    );
    let firsts = corpus::load(
        &committed(),
        &Filter {
            only: vec![],
            per_category: Some(1),
        },
    )
    .unwrap();
    let categories: std::collections::BTreeSet<_> =
        firsts.iter().map(|e| e.category.as_str()).collect();
    assert_eq!(categories.len(), firsts.len());
    let none = Filter {
        only: vec!["no such schema".into()],
        per_category: None,
    };
    assert!(corpus::load(&committed(), &none).is_err());
}

/// The strings the worker's format narrowing (worker/src/constraint/formats.rs)
/// keeps out are the ones this validator refuses, and llguidance's own
/// patterns let in.
#[test]
fn the_validator_holds_formats_to_their_rfcs() {
    let cases = [
        ("date", "2024-02-29", true),
        ("date", "2023-02-29", false),
        ("time", "23:59:60Z", true),
        ("time", "10:20:60Z", false),
        ("hostname", "ab--cd.example", false),
        ("email", &format!("{}@b.org", "x".repeat(65)), false),
        ("email", &format!("a@{}.org", "b".repeat(64)), false),
        ("email", "a@ab--c.org", false),
    ];
    for (format, value, valid) in cases {
        let v = corpus::validator(&json!({"format": format})).unwrap();
        assert_eq!(v.is_valid(&json!(value)), valid, "{format} {value:?}");
    }
}
