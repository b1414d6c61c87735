//! The real tokenizers, each read once per fuzzing process: the reference
//! model's (gguf-bpe) from `WORKER_ORCD_REFERENCE_MODEL`, Gemma 3's
//! (gguf-spm) from `WORKER_ORCD_SPM_MODEL`, else the files `ci/fetch-model`
//! fetches.

use std::path::PathBuf;
use std::sync::OnceLock;

use worker_orcd::gguf::GgufFile;
use worker_orcd::tokenizer::{StreamDecoder, Tokenizer};

#[allow(dead_code)] // each target uses one of them
pub fn reference_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        load(
            "WORKER_ORCD_REFERENCE_MODEL",
            "smollm2-135m-instruct-q4_1.gguf",
        )
    })
}

#[allow(dead_code)]
pub fn spm_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| load("WORKER_ORCD_SPM_MODEL", "gemma-3-270m-q4_k_m.gguf"))
}

fn load(var: &str, file_name: &str) -> Tokenizer {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../.models")
            .join(file_name)
    });
    let file = GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run ci/fetch-model)", path.display()));
    Tokenizer::from_gguf(&file.metadata).expect("the tokenizer loads")
}

/// Encodes or decodes `data` (its first byte picks which, and the flags).
#[allow(dead_code)]
pub fn exercise_tokenizer(tok: &Tokenizer, data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
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
}
