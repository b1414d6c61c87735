//! llama.cpp's golden vectors for SmolLM2-135M-Instruct (`testdata/golden/`),
//! checked against the real GGUF file.

use std::path::PathBuf;

use super::super::*;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata/golden")
}

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.models/smollm2-135m-instruct-q4_1.gguf")
}

fn read_json(name: &str) -> serde_json::Value {
    let path = golden_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The tokenizer of the model file at `path`, or `None` (with a note) when
/// the file is absent: CI fetches the real models before the tests, and each
/// golden module's `*_present_in_ci` test makes sure a CI run never skips
/// silently.
pub(super) fn tokenizer_of(path: &std::path::Path) -> Option<Tokenizer> {
    if !path.exists() {
        eprintln!("note: {} not present; skipping", path.display());
        return None;
    }
    let file =
        crate::gguf::GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(
        Tokenizer::from_gguf(&file.metadata)
            .unwrap_or_else(|e| panic!("{}: the tokenizer builds: {e}", path.display())),
    )
}

/// Under CI (`CI` set) the model file at `path` must be there.
pub(super) fn assert_present_in_ci(path: &std::path::Path) {
    if std::env::var_os("CI").is_some() {
        assert!(
            path.exists(),
            "CI is set but {} is missing (its golden tokenizer tests would skip)",
            path.display()
        );
    }
}

fn reference_tokenizer() -> Option<Tokenizer> {
    tokenizer_of(&model_path())
}

#[test]
fn reference_model_present_in_ci() {
    assert_present_in_ci(&model_path());
}

#[test]
fn golden_tokenize() {
    let Some(t) = reference_tokenizer() else {
        return;
    };
    let cases = read_json("tokenize.json");
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 66);
    assert_all_match("golden tokenize", &t, cases);
}

/// Encodes each golden vector (`text`, `ids`, `add_bos`, `parse_special`)
/// and fails listing every mismatch; a match must also decode back to its
/// text (special tokens as their text, BOS left out).
pub(super) fn assert_all_match(label: &str, t: &Tokenizer, cases: &[serde_json::Value]) {
    let failures = mismatches(t, cases);
    eprintln!(
        "{label}: {}/{} match",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn mismatches(t: &Tokenizer, cases: &[serde_json::Value]) -> Vec<String> {
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let add_bos = c["add_bos"].as_bool().unwrap();
        let parse_special = c["parse_special"].as_bool().unwrap();
        let want: Vec<u32> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = t.encode(text, add_bos, parse_special).unwrap();
        if got != want {
            failures.push(format!(
                "{} (add_bos={add_bos}, parse_special={parse_special}):\n  want {want:?}\n  got  {got:?}",
                c["name"]
            ));
            continue;
        }
        // The BOS `encode` added, where the vocabulary adds one (gpt-oss's does not).
        let skip = usize::from(add_bos && t.add_bos());
        assert_eq!(t.decode(&got[skip..]).unwrap(), text, "{}", c["name"]);
    }
    failures
}

#[test]
fn golden_chat_prompts() {
    let Some(t) = reference_tokenizer() else {
        return;
    };
    let tmpl = t.chat_template().expect("SmolLM2's template compiles");
    let greedy = read_json("greedy.json");
    let cases = greedy["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for c in cases {
        let user = c["user_message"].as_str().unwrap();
        let prompt = c["prompt"].as_str().unwrap();
        let want: Vec<u32> = c["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let rendered = tmpl
            .render(&[ChatMessage::new("user", user)], true)
            .unwrap();
        assert_eq!(rendered, prompt, "template rendering for {user:?}");
        assert_eq!(
            t.encode(prompt, true, true).unwrap(),
            want,
            "prompt ids for {user:?}"
        );
    }
    // The alternative renderings llama-server produced (one drops the leading
    // <|im_start|>, one has no system prompt) tokenize as llama.cpp tokenized them.
    for a in greedy["alternative_renderings"].as_array().unwrap() {
        let prompt = a["prompt"].as_str().unwrap();
        let want: Vec<u32> = a["prompt_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            t.encode(prompt, true, true).unwrap(),
            want,
            "{}",
            a["template_rendering"]
        );
    }
}

#[test]
fn golden_generated_text_streams() {
    let Some(t) = reference_tokenizer() else {
        return;
    };
    let greedy = read_json("greedy.json");
    for c in greedy["cases"]
        .as_array()
        .unwrap()
        .iter()
        .chain(greedy["alternative_renderings"].as_array().unwrap())
    {
        let ids: Vec<u32> = c["generated_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let whole = t.decode(&ids).unwrap();
        let mut s = StreamDecoder::new();
        let mut streamed: String = ids.iter().map(|&id| s.push(&t, id)).collect();
        streamed.push_str(&s.finish());
        assert_eq!(streamed, whole);
        if c["detokenized_generated_ids_matches_text"].as_bool() == Some(true) {
            assert_eq!(whole, c["generated_text"].as_str().unwrap());
        }
    }
}

#[test]
fn smollm2_eog_and_specials() {
    let Some(t) = reference_tokenizer() else {
        return;
    };
    assert_eq!(t.kind(), TokenizerKind::GgufBpe);
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.eog_ids(), &[0, 2]);
    assert_eq!(t.bos_id(), Some(1));
    assert_eq!(t.eos_id(), Some(2));
    assert!(!t.add_bos());
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
    assert_eq!(t.token_bytes(198), Some(&b"\n"[..]));
}

#[test]
fn smollm2_vocab_spec_from_metadata() {
    let path = model_path();
    if !path.exists() {
        eprintln!(
            "note: reference model {} not present; skipping",
            path.display()
        );
        return;
    }
    let file = crate::gguf::GgufFile::open(&path).unwrap();
    let spec = VocabSpec::from_metadata(&file.metadata).unwrap();
    let meta = read_json("metadata.json");
    let summary = &meta["summary"];
    assert_eq!(spec.model, "gpt2");
    assert_eq!(spec.pre.as_deref(), Some("smollm"));
    assert_eq!(spec.tokens.len(), 49152);
    assert_eq!(spec.token_types.len(), 49152);
    assert_eq!(
        spec.merges.len(),
        summary["merges_count"].as_u64().unwrap() as usize
    );
    assert_eq!(spec.merges[0], "Ġ t");
    assert_eq!(
        (spec.bos_id, spec.eos_id, spec.unk_id, spec.pad_id),
        (Some(1), Some(2), Some(0), Some(2))
    );
    assert_eq!((spec.eot_id, spec.eom_id), (None, None));
    assert!(!spec.add_bos && !spec.add_eos);
    assert!(spec.scores.is_none());
    assert_eq!(
        spec.chat_template.as_deref(),
        summary["chat_template"].as_str()
    );
    // Token types: ids 0..=16 are control, the rest normal (metadata.json lists the non-normal ones).
    let non_normal = meta["non_normal_tokens(token_type!=1)"].as_array().unwrap();
    let listed: Vec<(usize, &str, i64)> = non_normal
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap() as usize,
                t["text"].as_str().unwrap(),
                t["type"].as_i64().unwrap(),
            )
        })
        .collect();
    for (id, text, ty) in &listed {
        assert_eq!(spec.tokens[*id], *text);
        assert_eq!(spec.token_types[*id] as i64, *ty);
    }
    assert_eq!(
        spec.token_types
            .iter()
            .filter(|&&t| t != token_type::NORMAL)
            .count(),
        listed.len()
    );
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// More vectors from llama.cpp (see the file's `source`): random mixes of
/// scripts, whitespace, digits, punctuation, emoji and special-token texts, with
/// SmolLM2's vocabulary under seven pre-tokenizers (`smollm`, `gpt-2`, `llama-bpe`,
/// `qwen2`, `default`, `falcon`, `bloom`).
#[test]
fn llama_cpp_vectors_all_pre_tokenizers() {
    let path = model_path();
    if !path.exists() {
        eprintln!(
            "note: reference model {} not present; skipping",
            path.display()
        );
        return;
    }
    let file = crate::gguf::GgufFile::open(&path).unwrap();
    let base = VocabSpec::from_metadata(&file.metadata).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../testdata/llama_cpp_vectors.json")).unwrap();
    let mut by_pre: std::collections::BTreeMap<String, (Tokenizer, usize)> = Default::default();
    let mut failures = Vec::new();
    for c in doc["cases"].as_array().unwrap() {
        let pre = c["pre"].as_str().unwrap();
        let (t, count) = by_pre.entry(pre.to_string()).or_insert_with(|| {
            let mut spec = base.clone();
            spec.pre = Some(pre.to_string());
            (Tokenizer::from_spec(spec).unwrap(), 0)
        });
        *count += 1;
        let text = c["text"].as_str().unwrap();
        let parse_special = c["parse_special"].as_bool().unwrap();
        let want = ids_of(&c["ids"]);
        let got = t.encode(text, true, parse_special).unwrap();
        if got != want {
            failures.push(format!(
                "pre={pre} parse_special={parse_special} {text:?}\n  want {want:?}\n  got  {got:?}"
            ));
        }
    }
    let counts: Vec<(&String, usize)> = by_pre.iter().map(|(k, (_, n))| (k, *n)).collect();
    eprintln!(
        "llama.cpp vectors per pre-tokenizer: {counts:?}; {} mismatches",
        failures.len()
    );
    assert_eq!(by_pre.len(), 7);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Long runs, as llama.cpp tokenizes them (run-length encoded ids).
#[test]
fn long_inputs_match_llama_cpp() {
    let Some(t) = reference_tokenizer() else {
        return;
    };
    let rle = |runs: &[(u32, usize)]| -> Vec<u32> {
        runs.iter()
            .flat_map(|&(id, n)| std::iter::repeat_n(id, n))
            .collect()
    };
    let cases: Vec<(String, Vec<u32>)> = vec![
        ("a".repeat(10_000), rle(&[(46880, 2500)])),
        ("1".repeat(5_000), rle(&[(33, 5000)])),
        (
            format!("{}a b", " ".repeat(200_000)),
            rle(&[
                (40686, 3124),
                (12427, 1),
                (1703, 1),
                (22754, 1),
                (253, 1),
                (278, 1),
            ]),
        ),
        (
            format!("{}a", " ".repeat(3_000)),
            rle(&[(40686, 46), (12427, 1), (47167, 1), (253, 1)]),
        ),
    ];
    for (text, want) in cases {
        for parse_special in [true, false] {
            let got = t.encode(&text, true, parse_special).unwrap();
            assert!(
                got == want,
                "{} chars: got {} ids, want {}",
                text.len(),
                got.len(),
                want.len()
            );
        }
    }
}
