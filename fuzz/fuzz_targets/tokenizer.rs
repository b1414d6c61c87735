//! The reference tokenizer on any input: the first byte picks encoding (the
//! rest as text, with or without special tokens) or decoding (the rest as
//! token ids, valid or not, whole and through the streaming decoder, which
//! must never hold more than one incomplete character).
#![no_main]

use libfuzzer_sys::fuzz_target;
#[path = "common.rs"]
mod common;

// The tokenizer loads in libFuzzer's initialisation, outside the per-input
// timeout: an instrumented build takes seconds to read a vocabulary.
fuzz_target!(
    init: {
        common::reference_tokenizer();
    },
    |data: &[u8]| common::exercise_tokenizer(common::reference_tokenizer(), data)
);
