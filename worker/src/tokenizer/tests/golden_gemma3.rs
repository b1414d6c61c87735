//! llama.cpp's tokenization of Gemma 3 270M (`testdata/golden-gemma3/`, made by
//! `make_tokenize.py` there from llama-server at 0c1e57098) against the real
//! GGUF file: the `gguf-spm` tokenizer (issue #13).

use std::path::PathBuf;

use super::super::*;

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.models/gemma-3-270m-q4_k_m.gguf")
}

/// Gemma 3's tokenizer (CI fetches the file: `ci/fetch-model gemma3`).
fn gemma3_tokenizer() -> Option<Tokenizer> {
    let t = super::golden::tokenizer_of(&model_path())?;
    assert_eq!(t.kind(), TokenizerKind::GgufSpm);
    Some(t)
}

#[test]
fn gemma3_present_in_ci() {
    super::golden::assert_present_in_ci(&model_path());
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
