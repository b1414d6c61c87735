//! The `hf-json` tokenizer: a small hand-written `tokenizer.json` for the
//! rules around the file, and the reference model's `tokenizer.json` as
//! transformers exports it (`testdata/golden/tokenizer.json`, made by
//! `make_tokenizer_json.py` there) against llama.cpp's golden vectors.

use std::path::{Path, PathBuf};

use super::super::*;
use crate::gguf::{MetaValue, Metadata};

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/golden")
        .join(name)
}

fn reference_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.models/smollm2-135m-instruct-q4_1.gguf")
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

// ---------------------------------------------------------------------------
// A hand-written tokenizer.json
// ---------------------------------------------------------------------------

/// A character-level BPE: `a`, `b`, `ab` (merged), `<`, `s`, `>`, `/`, two
/// special tokens, one plain added token, no decoder; its post-processor
/// puts `<s>` first.
const TINY: &str = r#"{
  "version": "1.0", "truncation": {"direction": "Right", "max_length": 7, "strategy": "LongestFirst", "stride": 0},
  "padding": null,
  "added_tokens": [
    {"id": 7, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 8, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 9, "content": "<u>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": false}
  ],
  "normalizer": null, "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]}}},
  "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
    "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
    "vocab": {"a": 0, "b": 1, "ab": 2, "<": 3, "s": 4, ">": 5, "/": 6},
    "merges": [["a", "b"]]}
}"#;

/// `TINY` in a fresh folder; the folder lives as long as the handle.
fn tiny_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(HF_TOKENIZER_FILE);
    std::fs::write(&path, TINY).unwrap();
    (dir, path)
}

/// GGUF metadata naming a tokenizer with `TINY`'s tokens, BOS 7, EOS 8.
fn tiny_gguf(tokens: &[&str]) -> Metadata {
    let mut md = Metadata::new();
    let strings =
        |v: &[&str]| MetaValue::Array(v.iter().map(|s| MetaValue::String(s.to_string())).collect());
    md.insert("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .unwrap();
    md.insert("tokenizer.ggml.tokens", strings(tokens)).unwrap();
    md.insert("tokenizer.ggml.merges", strings(&["a b"]))
        .unwrap();
    md.insert("tokenizer.ggml.bos_token_id", MetaValue::U32(7))
        .unwrap();
    md.insert("tokenizer.ggml.eos_token_id", MetaValue::U32(8))
        .unwrap();
    md.insert("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
        .unwrap();
    md
}

const TINY_TOKENS: [&str; 10] = ["a", "b", "ab", "<", "s", ">", "/", "<s>", "</s>", "<u>"];

#[test]
fn special_tokens_are_cut_out_only_with_parse_special() {
    let (_dir, path) = tiny_file();
    let t = Tokenizer::from_hf_json(&path, &Metadata::new()).unwrap();
    assert_eq!(t.kind(), TokenizerKind::HfJson);
    assert_eq!(t.vocab_size(), 10);
    assert_eq!(t.encode("<s>ab</s>", false, true).unwrap(), vec![7, 2, 8]);
    // Not parsed: their text, character by character.
    assert_eq!(
        t.encode("<s>ab</s>", false, false).unwrap(),
        vec![3, 4, 5, 2, 3, 6, 4, 5]
    );
    // A plain added token is always one token.
    for parse_special in [false, true] {
        assert_eq!(
            t.encode("a<u>b", false, parse_special).unwrap(),
            vec![0, 9, 1]
        );
    }
    // Never truncated to the file's max_length of 7, which is only reported.
    assert_eq!(t.encode(&"ab".repeat(20), false, false).unwrap().len(), 20);
    assert_eq!(t.model_max_context(), Some(7));
}

/// Without a GGUF tokenizer the post-processor's template names BOS, and the
/// special tokens are control tokens; end of generation from the texts.
#[test]
fn without_a_gguf_tokenizer_the_template_gives_bos() {
    let (_dir, path) = tiny_file();
    let t = Tokenizer::from_hf_json(&path, &Metadata::new()).unwrap();
    assert_eq!((t.bos_id(), t.eos_id(), t.add_bos()), (Some(7), None, true));
    assert_eq!(t.encode("ab", true, true).unwrap(), vec![7, 2]);
    assert!(t.is_control(7) && t.is_control(8) && !t.is_control(9) && !t.is_control(2));
    assert!(t.eog_ids().is_empty());
    assert_eq!(t.decode(&[7, 2, 9, 8]).unwrap(), "<s>ab<u></s>");
}

/// With one, the GGUF's ids and BOS rule win over the template.
#[test]
fn the_gguf_names_bos_and_eos_when_it_has_a_tokenizer() {
    let (_dir, path) = tiny_file();
    let t = Tokenizer::from_hf_json(&path, &tiny_gguf(&TINY_TOKENS)).unwrap();
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.add_bos()),
        (Some(7), Some(8), false)
    );
    assert_eq!(t.encode("ab", true, true).unwrap(), vec![2]);
    assert_eq!(t.eog_ids(), &[8]);
    assert_eq!(t.kind(), TokenizerKind::HfJson);
}

#[test]
fn gguf_ids_naming_other_tokens_are_an_error() {
    let (_dir, path) = tiny_file();
    let mut other = TINY_TOKENS;
    other[8] = "<|end|>";
    match Tokenizer::from_hf_json(&path, &tiny_gguf(&other)) {
        Err(TokenizerError::Build(m)) => {
            assert!(
                m.contains("EOS id 8") && m.contains("<|end|>") && m.contains("</s>"),
                "{m}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_or_broken_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(HF_TOKENIZER_FILE);
    for contents in [None, Some("{\"version\": \"1.0\"}")] {
        if let Some(c) = contents {
            std::fs::write(&path, c).unwrap();
        }
        match Tokenizer::from_hf_json(&path, &Metadata::new()) {
            Err(e @ TokenizerError::Read { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{e}")
            }
            other => panic!("{contents:?}: {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// The reference model's tokenizer.json, exported by transformers
// ---------------------------------------------------------------------------

/// The exported file with the reference model's GGUF metadata when the
/// model is here, else with none (the goldens never add BOS, so they encode
/// the same either way).
fn exported() -> Tokenizer {
    let md = if reference_model().exists() {
        crate::gguf::GgufFile::open(&reference_model())
            .unwrap()
            .metadata
    } else {
        eprintln!("note: reference model absent; hf-json without its GGUF metadata");
        Metadata::new()
    };
    Tokenizer::from_hf_json(&golden(HF_TOKENIZER_FILE), &md).expect("the export loads")
}

/// M0-W-1361: all 66 llama.cpp vectors encode to its ids and decode back.
#[test]
fn m0_w_1361_exported_tokenizer_json_encodes_the_goldens() {
    let t = exported();
    let cases = read_json(&golden("tokenize.json"));
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 66);
    super::golden::assert_all_match("hf-json golden tokenize", &t, cases);
}

/// M0-W-1361: the exposed facts are the files' (GGUF ids, exported vocabulary).
#[test]
fn m0_w_1361_exported_tokenizer_json_exposes_the_files_ids() {
    let t = exported();
    assert_eq!(t.kind(), TokenizerKind::HfJson);
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.model_max_context(), None);
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
    assert_eq!(t.token_bytes(198), Some(&b"\n"[..]));
    if reference_model().exists() {
        assert_eq!(t.eos_id(), Some(2));
        assert!(
            !t.add_bos(),
            "the GGUF adds no BOS; the file's template would"
        );
        assert_eq!(t.eog_ids(), &[0, 2]);
        assert!(t.chat_template().is_some());
    }
}

/// The generated text of greedy.json streams to the same text as a whole
/// decode, and the chat prompts encode to llama.cpp's ids.
#[test]
fn exported_tokenizer_json_streams_and_encodes_chat_prompts() {
    let t = exported();
    let greedy = read_json(&golden("greedy.json"));
    for c in greedy["cases"].as_array().unwrap() {
        assert_eq!(
            t.encode(c["prompt"].as_str().unwrap(), false, true)
                .unwrap(),
            ids(&c["prompt_token_ids"])
        );
        let generated = ids(&c["generated_token_ids"]);
        let whole = t.decode(&generated).unwrap();
        let mut s = StreamDecoder::new();
        let mut streamed: String = generated.iter().map(|&id| s.push(&t, id)).collect();
        streamed.push_str(&s.finish());
        assert_eq!(streamed, whole);
        if c["detokenized_generated_ids_matches_text"].as_bool() == Some(true) {
            assert_eq!(whole, c["generated_text"].as_str().unwrap());
        }
    }
    // A character split over byte tokens is held back until it is whole.
    let emoji = t.encode("🦙", false, false).unwrap();
    assert!(emoji.len() > 1, "{emoji:?}");
    let mut s = StreamDecoder::new();
    let out: Vec<String> = emoji.iter().map(|&id| s.push(&t, id)).collect();
    assert_eq!(out.concat(), "🦙");
    assert_eq!(out.last().unwrap(), "🦙");
}

/// Where the export parts from llama.cpp, as testdata/golden/README.md says:
/// of the 452 `smollm` vectors of llama_cpp_vectors.json, 372 match, 69 differ
/// only by a token 0 for each byte the vocabulary lacks, 11 by the
/// pre-tokenizer (digits not split apart first).
#[test]
fn exported_tokenizer_json_differs_from_llama_cpp_where_the_readme_says() {
    let t = exported();
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../testdata/llama_cpp_vectors.json")).unwrap();
    let (mut same, mut unk_only, mut other) = (0, 0, 0);
    for c in doc["cases"].as_array().unwrap() {
        if c["pre"] != "smollm" {
            continue;
        }
        let want = ids(&c["ids"]);
        let got = t
            .encode(
                c["text"].as_str().unwrap(),
                false,
                c["parse_special"].as_bool().unwrap(),
            )
            .unwrap();
        if got == want {
            same += 1;
        } else if got
            .iter()
            .copied()
            .filter(|&id| id != 0)
            .eq(want.iter().copied())
        {
            unk_only += 1;
        } else {
            other += 1;
        }
    }
    assert_eq!((same, unk_only, other), (372, 69, 11));
}
