//! Every grammar compiles with llguidance, admits a call in the model's
//! format token by token over a vocabulary of single bytes (and the harmony
//! structure tokens), and refuses a call to another function or with
//! arguments outside the schema.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie, TokenId};
use llguidance::{Matcher, ParserFactory};
use serde_json::json;

use super::*;
use crate::server::openai::tools::spec::check;

/// The special tokens of the test vocabulary (llguidance marks a special
/// token's bytes with a leading 0xFF).
const SPECIAL: [&str; 7] = [
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|call|>",
    "<|end|>",
    "<|start|>",
    "<|endoftext|>",
];

fn env() -> TokEnv {
    let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for s in SPECIAL {
        words.push([&[0xFF], s.as_bytes()].concat());
    }
    let info = TokRxInfo {
        vocab_size: words.len() as u32,
        tok_eos: words.len() as u32 - 1,
        tok_bos: None,
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)))
}

/// `text` as the test vocabulary's tokens: the special tokens by name, every other byte alone.
fn tokens(text: &str) -> Vec<TokenId> {
    let mut out = Vec::new();
    let mut rest = text;
    'outer: while !rest.is_empty() {
        for (i, s) in SPECIAL.iter().enumerate() {
            if let Some(after) = rest.strip_prefix(s) {
                out.push(256 + i as TokenId);
                rest = after;
                continue 'outer;
            }
        }
        out.push(rest.as_bytes()[0] as TokenId);
        rest = &rest[1..];
    }
    out
}

fn matcher(grammar: &str) -> Matcher {
    let mut factory = ParserFactory::new_simple(&env()).unwrap();
    factory.quiet();
    let parser = factory.create_parser(TopLevelGrammar::from_lark(grammar.to_string()));
    let m = Matcher::new(parser);
    assert!(!m.is_error(), "{grammar}\n{:?}", m.get_error());
    m
}

/// Whether the grammar admits `text` whole (every token, then the end).
fn admits(grammar: &str, text: &str) -> bool {
    let mut m = matcher(grammar);
    for t in tokens(text) {
        if m.consume_token(t).is_err() || m.is_error() {
            return false;
        }
    }
    m.is_accepting().unwrap_or(false)
}

fn spec(choice: serde_json::Value, parallel: bool) -> ToolSpec {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now"}}
    ]);
    check(Some(&tools), Some(&choice), Some(parallel))
        .unwrap()
        .unwrap()
}

const NAMED: &str = r#"{"type": "function", "function": {"name": "get_weather"}}"#;

#[test]
fn auto_and_none_have_no_grammar() {
    for choice in ["auto", "none"] {
        assert_eq!(
            for_choice(&spec(json!(choice), true), ToolFormat::Hermes),
            None
        );
    }
}

#[test]
fn hermes_grammars_admit_exactly_the_allowed_calls() {
    let weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
    let now = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let named = serde_json::from_str(NAMED).unwrap();
    let g = for_choice(&spec(named, true), ToolFormat::Hermes).unwrap();
    assert!(admits(&g, weather), "{g}");
    assert!(!admits(&g, now), "another function");
    assert!(
        !admits(&g, &weather.replace("\"Paris\"", "3")),
        "arguments outside the schema"
    );
    assert!(!admits(
        &g,
        &weather.replace("{\"city\"", "{\"town\": \"x\", \"city\"")
    ));
    assert!(!admits(&g, "Sure! <tool_call>"), "text instead of a call");

    let g = for_choice(&spec(json!("required"), true), ToolFormat::Hermes).unwrap();
    assert!(admits(&g, weather) && admits(&g, now));
    assert!(admits(&g, &format!("{weather}\n{now}")), "parallel calls");
    assert!(!admits(&g, &weather.replace("get_weather", "get_time")));
    let g = for_choice(&spec(json!("required"), false), ToolFormat::Hermes).unwrap();
    assert!(admits(&g, now) && !admits(&g, &format!("{weather}\n{now}")));
}

#[test]
fn llama31_grammar_admits_its_json() {
    let g = for_choice(&spec(json!("required"), true), ToolFormat::Llama3Json).unwrap();
    assert!(
        admits(
            &g,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"
        ),
        "{g}"
    );
    assert!(admits(
        &g,
        "{\"name\": \"now\", \"parameters\": {\"any\": [1, 2]}}"
    ));
    assert!(!admits(
        &g,
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
    ));
}

#[test]
fn harmony_grammar_admits_a_commentary_call_after_reasoning() {
    let named = serde_json::from_str(NAMED).unwrap();
    let g = for_choice(&spec(named, true), ToolFormat::Harmony).unwrap();
    let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}<|call|>";
    assert!(admits(&g, call), "{g}");
    let reasoned =
        format!("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant{call}");
    assert!(admits(&g, &reasoned), "{g}");
    assert!(!admits(&g, &call.replace("get_weather", "now")));
    assert!(!admits(&g, "<|channel|>final<|message|>Hi<|end|>"));
}
