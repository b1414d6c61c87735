//! The reference tokenizer on any input: the first byte picks encoding (the
//! rest as text, with or without special tokens) or decoding (the rest as
//! token ids, valid or not, whole and through the streaming decoder, which
//! must never hold more than one incomplete character).
#![no_main]

use libfuzzer_sys::fuzz_target;
use worker_orcd::tokenizer::StreamDecoder;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let tok = common::reference_tokenizer();
    if mode & 1 == 0 {
        let text = String::from_utf8_lossy(rest);
        if let Ok(ids) = tok.encode(&text, mode & 2 != 0, mode & 4 != 0) {
            assert!(
                ids.iter().all(|&id| (id as usize) < tok.vocab_size()),
                "an id past the vocabulary"
            );
        }
        return;
    }
    // Ids up to twice the vocabulary: half of them out of range.
    let span = 2 * tok.vocab_size() as u32;
    let ids: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % span)
        .collect();
    let _ = tok.decode(&ids);
    let mut stream = StreamDecoder::new();
    for &id in ids.iter().filter(|&&id| (id as usize) < tok.vocab_size()) {
        let _ = stream.push(tok, id);
        assert!(
            stream.pending_len() < 4,
            "more than one incomplete character held back"
        );
    }
    let _ = stream.finish();
});
