//! Any body posted to /v1/chat/completions or /v1/completions (the first
//! byte picks which): JSON parsing, the mapping onto /execute's request,
//! then every validation rule, the chat template and the tokenization.
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_orcd::server::openai::request::{map_chat, map_completion};
use worker_orcd::server::openai::types::{ChatCompletionRequest, CompletionRequest};
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
    let mapped = if which & 1 == 0 {
        let Ok(req) = serde_json::from_slice::<ChatCompletionRequest>(body) else {
            return;
        };
        map_chat(req, "fuzz", SERVED)
    } else {
        let Ok(req) = serde_json::from_slice::<CompletionRequest>(body) else {
            return;
        };
        map_completion(req, "fuzz", SERVED, |ids| tok.decode(ids).ok())
    };
    let Ok(mapped) = mapped else {
        return;
    };
    let limits = Limits {
        max_tokens_in: 2048,
        max_tokens_out: 2048,
        vocab_size: tok.vocab_size(),
        context_length: 8192,
    };
    if let Ok(valid) = validate_with_ids(mapped.execute, mapped.prompt_ids, &limits, tok, || 7) {
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
