//! llama.cpp's tokenization of gpt-oss's vocabulary (`o200k_harmony`, as
//! `harness synth-model` writes it for its gpt-oss presets) against the
//! worker's `gguf-bpe` tokenizer on the same metadata:
//! `testdata/golden-synth/gpt-oss-tokenize.json`, made by `make_goldens.py`
//! there from llama-server at 0c1e57098 (M0-W-1821, issue #14).

use std::path::PathBuf;

use super::super::*;
use crate::gguf::GgufFile;

/// The tokenizer of a gpt-oss file: its `tokenizer.*` metadata alone, a
/// GGUF header without tensors.
fn gpt_oss_tokenizer() -> Tokenizer {
    let kvs = harness::synth::harmony::tokenizer_kvs().unwrap();
    let file = GgufFile::from_bytes(harness::synth::header(&kvs, &[], &[])).unwrap();
    let t = Tokenizer::from_gguf(&file.metadata).unwrap();
    assert_eq!(t.kind(), TokenizerKind::GgufBpe);
    t
}

#[test]
fn gpt_oss_golden_tokenize() {
    let t = gpt_oss_tokenizer();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/golden-synth/gpt-oss-tokenize.json");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 25, "{} vectors", cases.len());
    super::golden::assert_all_match("gpt-oss golden tokenize", &t, cases);
}
