//! The constraint over a byte vocabulary (a token per byte, then EOS,
//! `<|im_start|>`, `<|im_end|>`): masks, commits, refusals and the cache.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::engine::testing::{byte_tokenizer, EOS_ID, IM_END_ID, IM_START_ID};

fn compiler() -> Compiler {
    // Two ids past the tokenizer's vocabulary, as a model's padded output.
    Compiler::new(&byte_tokenizer(), 261).unwrap()
}

fn allowed(bits: &[u32], id: u32) -> bool {
    bits[id as usize / 32] & (1 << (id % 32)) != 0
}

fn allowed_ids(c: &mut Constraint) -> Vec<u32> {
    let bits = c.mask().unwrap().to_vec();
    (0..261).filter(|&id| allowed(&bits, id)).collect()
}

/// Commits `text` byte by byte, checking each byte was allowed first.
fn write(c: &mut Constraint, text: &str) {
    for b in text.bytes() {
        let bits = c.mask().unwrap().to_vec();
        assert!(
            allowed(&bits, b as u32),
            "{:?} refused in {text:?}",
            b as char
        );
        c.commit(b as u32).unwrap();
    }
}

#[test]
fn a_regex_allows_exactly_its_next_bytes_then_only_the_end() {
    let g = compiler().compile(&Spec::Regex("(yes|no)".into())).unwrap();
    let mut c = Constraint::new(&g);
    assert_eq!(allowed_ids(&mut c), vec![b'n' as u32, b'y' as u32]);
    write(&mut c, "ye");
    assert_eq!(allowed_ids(&mut c), vec![b's' as u32]);
    c.commit(b's' as u32).unwrap();
    // Complete: every end-of-generation token, nothing else (padding ids never).
    assert_eq!(allowed_ids(&mut c), vec![EOS_ID, IM_END_ID]);
}

#[test]
fn a_json_schema_is_written_compactly_as_json_dumps_writes_it() {
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": false
    });
    let g = compiler().compile(&Spec::JsonSchema(schema)).unwrap();
    let mut c = Constraint::new(&g);
    write(&mut c, r#"{"name": "a b", "n": 12}"#);
    assert!(allowed_ids(&mut c).contains(&EOS_ID));
    // Free whitespace is not allowed between tokens.
    let mut c = Constraint::new(&g);
    write(&mut c, "{");
    assert!(!allowed(c.mask().unwrap(), b' ' as u32));
    assert!(!allowed(c.mask().unwrap(), b'\n' as u32));
}

#[test]
fn a_token_outside_the_mask_fails_the_constraint_with_its_position() {
    let g = compiler().compile(&Spec::Regex("[0-9]+".into())).unwrap();
    let mut c = Constraint::new(&g);
    write(&mut c, "42");
    match c.commit(b'x' as u32) {
        Err(ConstraintError::Failed { index: 2, .. }) => {}
        other => panic!("expected a failure at token 2, got {other:?}"),
    }
}

#[test]
fn control_tokens_never_match_text_but_a_lark_grammar_may_name_them() {
    let g = compiler()
        .compile(&Spec::Regex("<\\|im_start\\|>".into()))
        .unwrap();
    let mut c = Constraint::new(&g);
    assert!(!allowed_ids(&mut c).contains(&IM_START_ID));
    let g = compiler()
        .compile(&Spec::Lark("start: <|im_start|> \"x\"".into()))
        .unwrap();
    let mut c = Constraint::new(&g);
    assert_eq!(allowed_ids(&mut c), vec![IM_START_ID]);
}

#[test]
fn specs_that_cannot_be_compiled_are_refused_with_the_reason() {
    let c = compiler();
    // A keyword that would change what validates but is not enforced is named.
    let unenforced = Spec::JsonSchema(json!({"type": "array", "uniqueItems": true}));
    match c.compile(&unenforced) {
        Err(ConstraintError::Invalid(m)) => assert!(m.contains("uniqueItems"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // An unknown keyword is an annotation, as JSON Schema says.
    let annotated = Spec::JsonSchema(json!({"type": "object", "x-frobnicate": 1}));
    assert!(c.compile(&annotated).is_ok());
    for spec in [
        Spec::JsonSchema(json!({"type": "strnig"})),
        Spec::Regex("(unclosed".into()),
        Spec::Lark("start: undefined_rule".into()),
    ] {
        assert!(
            matches!(c.compile(&spec), Err(ConstraintError::Invalid(_))),
            "{spec:?} accepted"
        );
    }
    let huge = Spec::Regex("a".repeat(MAX_SPEC_BYTES + 1));
    assert_eq!(
        c.compile(&huge).unwrap_err(),
        ConstraintError::TooLarge {
            bytes: MAX_SPEC_BYTES + 1
        }
    );
}

#[test]
fn the_same_spec_compiles_once_and_each_job_starts_from_the_beginning() {
    let c = compiler();
    let spec = Spec::JsonSchema(json!({"enum": ["red", "green"]}));
    let a = c.compile(&spec).unwrap();
    let b = c.compile(&spec).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let mut first = Constraint::new(&a);
    write(&mut first, "\"re");
    // A second job is not moved by the first one's tokens.
    let mut second = Constraint::new(&a);
    assert_eq!(allowed_ids(&mut second), vec![b'"' as u32]);
}

#[test]
fn a_user_may_ask_for_free_whitespace_through_llguidance_options() {
    let schema = json!({"type": "array", "items": {"type": "integer"},
                        "x-guidance": {"whitespace_flexible": true}});
    let g = compiler().compile(&Spec::JsonSchema(schema)).unwrap();
    let mut c = Constraint::new(&g);
    write(&mut c, "[ 1,\n 2 ]");
}

/// A regex whose automaton has 2^40 states: llguidance's fuel bounds each
/// step's work, so every mask comes back (allowed tokens, or the bound's
/// error that ends the job) instead of stalling the engine.
#[test]
fn a_pathological_regex_costs_bounded_work_per_token() {
    let c = compiler();
    let spec = Spec::Regex("(a|b)*a(a|b){40}c".into());
    let Ok(g) = c.compile(&spec) else {
        return; // refused outright: bounded too
    };
    let mut job = Constraint::new(&g);
    for i in 0..80u32 {
        match job.mask() {
            Ok(bits) => {
                let next = if i % 3 == 0 { b'b' } else { b'a' } as u32;
                assert!(allowed(bits, next), "step {i}");
                job.commit(next).unwrap();
            }
            Err(ConstraintError::Failed { .. }) => return,
            Err(e) => panic!("{e}"),
        }
    }
}

/// Whether the grammar of `schema` lets `text` be written whole and ended.
fn accepts(schema: serde_json::Value, text: &str) -> bool {
    let g = compiler().compile(&Spec::JsonSchema(schema)).unwrap();
    let mut c = Constraint::new(&g);
    for b in text.bytes() {
        if !allowed(c.mask().unwrap(), b as u32) {
            return false;
        }
        c.commit(b as u32).unwrap();
    }
    allowed_ids(&mut c).contains(&EOS_ID)
}

/// What the `jsonschema` validator refuses and llguidance's own patterns let
/// in (harness/src/schema_suite's tests hold the validator to the same
/// strings) is never written; what it takes still is.
#[test]
fn formats_allow_only_strings_a_validator_accepts() {
    let long_host = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(63)
    );
    let long_local = format!("{}@b.org", "x".repeat(65));
    let long_label = format!("a@{}.org", "b".repeat(64));
    // Per format: strings the validator takes, then strings it refuses.
    let cases: [(&str, Vec<&str>, Vec<&str>); 5] = [
        (
            "date",
            vec!["2024-02-29", "2000-02-29", "2023-02-28", "2023-12-31"],
            vec!["2023-02-29", "1900-02-29"],
        ),
        ("time", vec!["10:20:30Z"], vec!["10:20:60Z"]),
        (
            "date-time",
            vec!["2024-02-29T23:59:59+01:00"],
            vec!["2023-02-29T10:00:00Z", "2024-01-01T10:20:60Z"],
        ),
        (
            "hostname",
            vec!["a-b.example"],
            vec!["ab--cd.example", &long_host],
        ),
        (
            "email",
            vec!["first.last@mail-host.example.org"],
            vec![&long_local, "a@ab--c.org", &long_label],
        ),
    ];
    for (format, valid, invalid) in cases {
        let schema = json!({"type": "string", "format": format});
        for (value, ok) in valid
            .iter()
            .map(|v| (v, true))
            .chain(invalid.iter().map(|v| (v, false)))
        {
            let written = accepts(schema.clone(), &format!("\"{value}\""));
            assert_eq!(written, ok, "{format} {value:?}");
        }
    }
}

/// A JSON Schema's numbers stay finite as doubles (`numbers.rs`): at most
/// two exponent digits and 200 integer digits; a regex says its own text.
#[test]
fn json_numbers_stay_within_a_double() {
    let digits = |ids: &[u32]| {
        ids.iter()
            .any(|&id| (b'0' as u32..=b'9' as u32).contains(&id))
    };
    let schema = json!({"type": "array", "items": {"type": "number"}});
    let g = compiler().compile(&Spec::JsonSchema(schema)).unwrap();
    let mut c = Constraint::new(&g);
    write(&mut c, "[1e9");
    assert!(digits(&allowed_ids(&mut c)), "a second exponent digit");
    write(&mut c, "9");
    let ids = allowed_ids(&mut c);
    assert!(!digits(&ids), "a third exponent digit: {ids:?}");
    assert!(ids.contains(&(b',' as u32)) && ids.contains(&(b']' as u32)));
    write(&mut c, &format!(", -{}", "9".repeat(200)));
    assert!(!digits(&allowed_ids(&mut c)), "a 201st integer digit");
    write(&mut c, ".5, 3]");
    let g = compiler()
        .compile(&Spec::Regex("1e[0-9]{3}".into()))
        .unwrap();
    write(&mut Constraint::new(&g), "1e999");
}
