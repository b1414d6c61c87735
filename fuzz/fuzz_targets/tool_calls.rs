//! Any model output through the tool-call parser (issue 43), in every
//! format: the first byte picks the format (Hermes/Qwen2.5 `<tool_call>`,
//! Llama 3.1 JSON, harmony) and whether parallel calls are kept; the rest
//! is the output, cut into tokens at each 0xFF byte (never in UTF-8). A
//! harmony token's first byte picks its channel (none, as structure tokens
//! and headers have, or analysis, commentary, final).
//!
//! What parse.rs promises is checked: the answer fed token by token gives
//! the content and calls the whole answer gives (so the stream never shows
//! what the whole answer keeps out of its content); one call at most
//! without parallel calls; each call has a fresh `call_` id and a name;
//! arguments that are JSON are in its one canonical spelling.
#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use worker_orcd::server::openai::tools::format::ToolFormat;
use worker_orcd::server::openai::tools::parse::{CallParser, Released, ToolReply};

const CHANNELS: [Option<&str>; 4] = [None, Some("analysis"), Some("commentary"), Some("final")];

/// Tokens and their channels (for harmony; none for the other formats).
fn tokens(harmony: bool, output: &[u8]) -> Vec<(String, Option<&'static str>)> {
    output
        .split(|&b| b == 0xFF)
        .map(|piece| match piece.split_first() {
            Some((&c, text)) if harmony => (
                String::from_utf8_lossy(text).into_owned(),
                CHANNELS[c as usize % 4],
            ),
            _ => (String::from_utf8_lossy(piece).into_owned(), None),
        })
        .collect()
}

/// Every token pushed, then the finish: all that was released.
fn parse<'a>(
    reply: &ToolReply,
    tokens: impl Iterator<Item = (&'a str, Option<&'a str>)>,
) -> Released {
    let mut parser = CallParser::new(reply.clone());
    let mut all = Released::default();
    for (text, channel) in tokens {
        all.extend(parser.push(text, channel));
    }
    all.extend(parser.finish());
    all
}

fn names_args(r: &Released) -> Vec<(&str, &str)> {
    r.calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect()
}

fn check_calls(reply: &ToolReply, r: &Released) {
    assert!(
        reply.parallel || r.calls.len() <= 1,
        "{} calls kept without parallel calls",
        r.calls.len()
    );
    let mut ids = HashSet::new();
    for call in &r.calls {
        assert!(!call.name.is_empty(), "a call without a name");
        assert!(
            call.id.len() == 29
                && call.id.starts_with("call_")
                && call.id[5..].bytes().all(|b| b.is_ascii_hexdigit()),
            "bad call id {:?}",
            call.id
        );
        assert!(ids.insert(call.id.as_str()), "call id {} twice", call.id);
        if let Ok(v) = serde_json::from_str::<Value>(&call.arguments) {
            assert_eq!(v.to_string(), call.arguments, "arguments not canonical");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, output)) = data.split_first() else {
        return;
    };
    let format = match mode % 3 {
        0 => ToolFormat::Hermes,
        1 => ToolFormat::Llama3Json,
        _ => ToolFormat::Harmony,
    };
    let reply = ToolReply {
        format,
        parallel: mode & 4 != 0,
        names: vec!["get_weather".into(), "now".into(), "f".into()],
    };
    let harmony = format == ToolFormat::Harmony;
    let tokens = tokens(harmony, output);
    let streamed = parse(&reply, tokens.iter().map(|(t, c)| (t.as_str(), *c)));
    check_calls(&reply, &streamed);
    if harmony {
        // Its tokens carry structure: there is no whole answer to compare.
        return;
    }
    let text: String = tokens.iter().map(|(t, _)| t.as_str()).collect();
    let whole = parse(&reply, std::iter::once((text.as_str(), None)));
    assert_eq!(
        streamed.content, whole.content,
        "content depends on the tokens"
    );
    assert_eq!(
        names_args(&streamed),
        names_args(&whole),
        "calls depend on the tokens"
    );
});
