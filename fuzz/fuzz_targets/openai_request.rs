//! Any body posted to a `/v1` route (the first byte picks which:
//! /v1/chat/completions, /v1/completions, /v1/responses, or Anthropic's
//! /v1/messages): JSON parsing, the mapping onto /execute's request, then
//! every validation rule, the chat template and the tokenization.
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_orcd::server::anthropic::request::map_messages;
use worker_orcd::server::anthropic::types::MessagesRequest;
use worker_orcd::server::openai::request::{map_chat, map_completion};
use worker_orcd::server::openai::responses::request::map_responses;
use worker_orcd::server::openai::tools::format::ToolFormat;
use worker_orcd::server::openai::responses::types::ResponsesRequest;
use worker_orcd::server::openai::types::{ChatCompletionRequest, CompletionRequest};
use worker_orcd::server::validation::ExecuteRequest;
use worker_orcd::server::validation::{validate_with_ids, Limits};

#[path = "common.rs"]
mod common;

const SERVED: &[&str] = &["smollm2", "smollm2-135m-instruct-q4_1.gguf"];

// The tokenizer loads in libFuzzer's initialisation, outside the per-input timeout.
fuzz_target!(
    init: {
        common::reference_tokenizer();
    },
    |data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let tok = common::reference_tokenizer();
    // (the /execute request and its prompt ids, when the route maps it)
    let mapped: Option<(ExecuteRequest, Option<Vec<u32>>)> = match which % 4 {
        0 => serde_json::from_slice::<ChatCompletionRequest>(body)
            .ok()
            .and_then(|req| map_chat(req, "fuzz", SERVED, ToolFormat::Hermes).ok())
            .map(|m| (m.execute, m.prompt_ids)),
        1 => serde_json::from_slice::<CompletionRequest>(body)
            .ok()
            .and_then(|req| map_completion(req, "fuzz", SERVED, |ids| tok.decode(ids).ok()).ok())
            .map(|m| (m.execute, m.prompt_ids)),
        2 => serde_json::from_slice::<ResponsesRequest>(body)
            .ok()
            .and_then(|req| map_responses(req, "fuzz", SERVED, ToolFormat::Hermes).ok())
            .map(|(m, _)| (m.execute, m.prompt_ids)),
        _ => serde_json::from_slice::<MessagesRequest>(body)
            .ok()
            .and_then(|req| map_messages(req, "fuzz", SERVED, ToolFormat::Hermes).ok())
            .map(|m| (m.execute, None)),
    };
    let Some((execute, prompt_ids)) = mapped else {
        return;
    };
    let limits = Limits::new(2048, tok.vocab_size(), 8192);
    if let Ok(valid) = validate_with_ids(execute, prompt_ids, &limits, tok, || 7) {
        assert!(
            valid.prompt_tokens.len() <= limits.max_tokens_in,
            "a prompt over the limit passed"
        );
        assert!(
            valid
                .prompt_tokens
                .iter()
                .all(|&id| (id as usize) < tok.vocab_size()),
            "an id past the vocabulary"
        );
    }
}
);
