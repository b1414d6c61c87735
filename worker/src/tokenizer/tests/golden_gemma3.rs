//! llama.cpp's tokenization of Gemma 3 270M (`testdata/golden-gemma3/`, made by
//! `make_tokenize.py` there from llama-server at 0c1e57098) against the real
//! GGUF file: the `gguf-spm` tokenizer (issue #13).

use std::path::PathBuf;

use super::super::*;

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.models/gemma-3-270m-q4_k_m.gguf")
}

/// Gemma 3's tokenizer, or `None` (with a note) when the file is absent; CI
/// fetches it (`ci/fetch-model gemma3`), and `gemma3_present_in_ci` makes
/// sure a CI run never skips silently.
fn gemma3_tokenizer() -> Option<Tokenizer> {
    let path = model_path();
    if !path.exists() {
        eprintln!("note: {} not present; skipping", path.display());
        return None;
    }
    let file =
        crate::gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t = Tokenizer::from_gguf(&file.metadata).expect("Gemma 3's tokenizer builds");
    assert_eq!(t.kind(), TokenizerKind::GgufSpm);
    Some(t)
}

#[test]
fn gemma3_present_in_ci() {
    if std::env::var_os("CI").is_some() {
        assert!(
            model_path().exists(),
            "CI is set but {} is missing (the gguf-spm golden tests would skip)",
            model_path().display()
        );
    }
}

#[test]
fn gemma3_golden_tokenize() {
    let Some(t) = gemma3_tokenizer() else {
        return;
    };
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/golden-gemma3/tokenize.json");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 117);
    super::golden::assert_all_match("gemma3 golden tokenize", &t, cases);
}
