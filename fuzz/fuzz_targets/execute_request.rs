//! Any body posted to /execute: JSON parsing into the request type, then
//! every validation rule, the chat template and the tokenization.
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_orcd::server::validation::{validate, ExecuteRequest, Limits};

#[path = "common.rs"]
mod common;

// The tokenizer loads in libFuzzer's initialisation, outside the per-input timeout.
fuzz_target!(
    init: {
        common::reference_tokenizer();
    },
    |data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<ExecuteRequest>(data) else {
        return;
    };
    let tok = common::reference_tokenizer();
    let limits = Limits::new(2048, tok.vocab_size(), 8192);
    if let Ok(valid) = validate(req, &limits, tok, || 7) {
        assert!(
            valid.prompt_tokens.len() <= limits.max_tokens_in,
            "a prompt over the limit passed"
        );
    }
}
);
