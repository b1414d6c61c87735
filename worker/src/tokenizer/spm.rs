//! The `gguf-spm` tokenizer: a SentencePiece BPE vocabulary from a GGUF file
//! (`tokenizer.ggml.model = "llama"`: Llama 2, Gemma, Mistral v1...).
//!
//! The merging runs in the `tokenizers` crate as Hugging Face runs these
//! vocabularies: a `BPE` model whose merges are derived from the pieces'
//! scores (every split of a piece into two pieces, the pieces of higher score
//! first, as transformers' `SentencePieceExtractor` orders them), byte
//! fallback to `<0xNN>` tokens, and spaces written as `▁`. No pre-tokenizer:
//! SentencePiece merges across the whole text. What sits around it follows
//! llama.cpp's `llama-vocab.cpp` (SPM branch of `tokenize_impl`): special
//! tokens cut out first (`bpe::partition`), a space before a piece of text
//! that opens the input or follows a special token when the file says
//! `add_space_prefix`.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;

use super::TokenizerError;

/// SentencePiece's visible space.
pub(crate) const SPACE: char = '\u{2581}';

/// The `tokenizers` pipeline for a SentencePiece vocabulary (`texts` unique
/// and non-empty, `scores` one per token).
pub(crate) fn build(
    texts: &[String],
    scores: &[f32],
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    if scores.len() != texts.len() {
        return Err(TokenizerError::Build(format!(
            "{} scores for {} tokens",
            scores.len(),
            texts.len()
        )));
    }
    let vocab: Vocab = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let merges = merges_from_scores(texts, scores, &vocab)?;
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .build()
        .map_err(|e| TokenizerError::Build(format!("SentencePiece BPE model: {e}")))?;
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    let space = Replace::new(" ", SPACE.to_string())
        .map_err(|e| TokenizerError::Build(format!("space normalizer: {e}")))?;
    tokenizer.with_normalizer(Some(space));
    Ok(tokenizer)
}

/// Bytes hashed while deriving merges: every split of every piece costs the
/// piece's length, so a file of long pieces would take quadratic time.
/// Gemma 3's 262,144 pieces take 13 MB.
const MAX_MERGE_WORK: usize = 256 << 20;

/// Every way to join two pieces into a third, the result's score first
/// (ties: vocabulary order), then the left piece's id, then the right's.
fn merges_from_scores(
    texts: &[String],
    scores: &[f32],
    ids: &Vocab,
) -> Result<Vec<(String, String)>, TokenizerError> {
    let mut merges: Vec<(f32, u32, u32, u32)> = Vec::new();
    let mut work = 0usize;
    for (id, text) in texts.iter().enumerate() {
        work += text.len() * text.chars().count().saturating_sub(1);
        if work > MAX_MERGE_WORK {
            return Err(TokenizerError::Build(format!(
                "the SentencePiece pieces are too long to derive merges from \
                 (over {MAX_MERGE_WORK} bytes of splits by piece {id})"
            )));
        }
        for (at, _) in text.char_indices().skip(1) {
            let (l, r) = text.split_at(at);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[id], id as u32, li, ri));
            }
        }
    }
    // Stable: equal scores keep vocabulary order; within one piece, by the
    // parts' ids (as transformers orders them).
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    Ok(merges
        .into_iter()
        .map(|(_, _, l, r)| (texts[l as usize].clone(), texts[r as usize].clone()))
        .collect())
}

/// A normal token's bytes: its text with `▁` as a space.
pub(crate) fn piece_bytes(text: &str) -> Vec<u8> {
    text.replace(SPACE, " ").into_bytes()
}
