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

/// The built-in `gemma` template (the file has none) renders each golden chat
/// prompt as Hugging Face does, and the prompt encodes to llama.cpp's ids
/// with one BOS: the `<bos>` the template writes gives way to the one the
/// vocabulary adds, as in llama.cpp's `common_chat_templates_apply`.
#[test]
fn gemma3_golden_chat_prompts_encode_with_one_bos() {
    let Some(mut t) = gemma3_tokenizer() else {
        return;
    };
    t.set_chat_template(builtin_template("gemma").unwrap())
        .unwrap();
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/golden-gemma3/greedy.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for case in golden["cases"].as_array().unwrap() {
        let message = case["user_message"].as_str().unwrap();
        let rendered = t
            .chat_template()
            .unwrap()
            .render(&[ChatMessage::new("user", message)], true)
            .unwrap();
        assert_eq!(rendered, case["prompt"].as_str().unwrap(), "{message:?}");
        let ids = t
            .encode(t.without_added_specials(&rendered), true, true)
            .unwrap();
        let want: Vec<u32> = case["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want, "{message:?}");
    }
}
