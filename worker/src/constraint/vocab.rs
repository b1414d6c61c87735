//! The model's vocabulary as llguidance sees it: each token's bytes in a
//! token trie, control tokens marked so that no grammar matches them as text.

use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::tokenizer::Tokenizer;

/// The token environment for `n_vocab` logits (the model's output width,
/// which may exceed the tokenizer's vocabulary: ids past it have no bytes and
/// are never allowed). Grammar literals are tokenized greedily over the trie
/// (`ApproximateTokEnv`); the worker never forces tokens from them, so only
/// the masks matter, and those do not depend on how a literal is tokenized.
pub fn token_env(tokenizer: &Tokenizer, n_vocab: usize) -> TokEnv {
    let words: Vec<Vec<u8>> = (0..n_vocab as u32).map(|id| word(tokenizer, id)).collect();
    let eos = end_token(tokenizer);
    let info = TokRxInfo {
        tok_bos: tokenizer.bos_id(),
        ..TokRxInfo::new(n_vocab as u32, eos)
    };
    Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)))
}

/// The end-of-generation token llguidance allows where a grammar is complete
/// ([`crate::constraint::Constraint::mask`] widens it to every one).
pub fn end_token(tokenizer: &Tokenizer) -> u32 {
    tokenizer
        .eos_id()
        .filter(|&id| tokenizer.is_eog(id))
        .or_else(|| tokenizer.eog_ids().first().copied())
        .or(tokenizer.eos_id())
        .unwrap_or(0)
}

/// A token's bytes; a control token's text behind llguidance's marker byte
/// (0xFF never occurs in UTF-8), so that it matches only where a grammar
/// names it as a special token.
fn word(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let Some(bytes) = tokenizer.token_bytes(id) else {
        return Vec::new();
    };
    if tokenizer.is_control(id) {
        let mut marked = Vec::with_capacity(bytes.len() + 1);
        marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
        marked.extend_from_slice(bytes);
        marked
    } else {
        bytes.to_vec()
    }
}
