//! Any spec a request can carry, compiled over the reference model's
//! vocabulary, then followed a few tokens (issue 43): the first byte picks
//! the kind (a JSON Schema, a regular expression, a Lark grammar, or an
//! OpenAI `tools` request whose `tool_choice` grammar is compiled, in the
//! format the byte's next bits pick); the next [`STEPS`] pairs of bytes
//! choose, step by step, which of the allowed tokens is committed; the rest
//! is the spec. Refusals are fine; a panic, a token the mask allowed but
//! the grammar then refuses, or an input over libFuzzer's `-timeout` (the
//! compile and mask bounds not holding) is a finding.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use worker_orcd::constraint::{Compiler, Constraint, Spec};
use worker_orcd::server::openai::tools::format::ToolFormat;
use worker_orcd::server::openai::tools::{grammar, spec};

#[path = "common.rs"]
mod common;

/// Tokens followed per compiled spec.
const STEPS: usize = 8;

/// Logits past the tokenizer's vocabulary, as a model's padded output has:
/// those ids have no bytes and must never be allowed.
const PADDING: usize = 3;

/// The reference vocabulary, not a toy one: its multi-byte tokens that
/// straddle lexemes are where the token-level code of the compiler and the
/// matcher does its work. (Its first 2,048 tokens ran only 10% faster:
/// compiling, not the vocabulary's width, takes the time.)
fn compiler() -> &'static Compiler {
    static COMPILER: OnceLock<Compiler> = OnceLock::new();
    COMPILER.get_or_init(|| {
        let tok = common::reference_tokenizer();
        Compiler::new(tok, tok.vocab_size() + PADDING).expect("the compiler builds")
    })
}

/// The spec `kind` names in `text`, when `text` is one.
fn spec_of(kind: u8, text: &[u8]) -> Option<Spec> {
    match kind % 4 {
        0 => Some(Spec::JsonSchema(serde_json::from_slice(text).ok()?)),
        1 => Some(Spec::Regex(std::str::from_utf8(text).ok()?.to_string())),
        2 => Some(Spec::Lark(std::str::from_utf8(text).ok()?.to_string())),
        _ => {
            let req: Value = serde_json::from_slice(text).ok()?;
            let tools = spec::check(
                req.get("tools"),
                req.get("tool_choice"),
                req.get("parallel_tool_calls").and_then(Value::as_bool),
            )
            .ok()??;
            let format = match (kind >> 2) % 3 {
                0 => ToolFormat::Hermes,
                1 => ToolFormat::Llama3Json,
                _ => ToolFormat::Harmony,
            };
            grammar::for_choice(&tools, format).map(Spec::Lark)
        }
    }
}

/// The `n`-th allowed id of `bits` (wrapping), if any is allowed.
fn nth_allowed(bits: &[u32], n: usize) -> Option<u32> {
    let count: usize = bits.iter().map(|w| w.count_ones() as usize).sum();
    let mut n = n % count.max(1);
    for (i, &w) in bits.iter().enumerate() {
        let ones = w.count_ones() as usize;
        if n < ones {
            let mut w = w;
            for _ in 0..n {
                w &= w - 1;
            }
            return Some(32 * i as u32 + w.trailing_zeros());
        }
        n -= ones;
    }
    None
}

/// Follows up to [`STEPS`] tokens, each chosen by a pair of `choices`.
fn follow(constraint: &mut Constraint, choices: &[u8]) {
    let tok = common::reference_tokenizer();
    for pair in choices.chunks_exact(2) {
        let Ok(bits) = constraint.mask() else {
            return;
        };
        let Some(id) = nth_allowed(bits, u16::from_le_bytes([pair[0], pair[1]]) as usize) else {
            panic!("mask() gave no allowed token without an error");
        };
        assert!((id as usize) < tok.vocab_size(), "padding id {id} allowed");
        if tok.is_eog(id) {
            return;
        }
        if let Err(e) = constraint.commit(id) {
            panic!("token {id} was allowed, then refused: {e}");
        }
    }
}

// The tokenizer and the compiler's token trie are built in libFuzzer's
// initialisation, outside the per-input timeout.
fuzz_target!(
    init: {
        compiler();
    },
    |data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let (choices, text) = rest.split_at(rest.len().min(2 * STEPS));
    let Some(spec) = spec_of(kind, text) else {
        return;
    };
    if let Ok(grammar) = compiler().compile(&spec) {
        follow(&mut Constraint::new(&grammar), choices);
    }
}
);
