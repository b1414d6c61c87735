//! Gemma 3's SentencePiece tokenizer (gguf-spm) on any input, as the
//! `tokenizer` target drives the reference one.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| common::exercise_tokenizer(common::spm_tokenizer(), data));
