//! Gemma 3's SentencePiece tokenizer (gguf-spm) on any input, as the
//! `tokenizer` target drives the reference one.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

// Gemma's 262,144-piece vocabulary loads in libFuzzer's initialisation,
// outside the per-input timeout (an instrumented build took over 10 s).
fuzz_target!(
    init: {
        common::spm_tokenizer();
    },
    |data: &[u8]| common::exercise_tokenizer(common::spm_tokenizer(), data)
);
