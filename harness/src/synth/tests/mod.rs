//! The synthetic models' tests, by concern: `shapes` (presets and tensors
//! against llama.cpp's loader), `keys` (metadata against llama.cpp's
//! converter), `vocabulary` (BPE padding, SentencePiece cuts, o200k_harmony)
//! and `files` (bytes, layout, reproducibility). Here: the stand-in
//! references and helpers they share.

mod files;
mod keys;
mod shapes;
mod vocabulary;

use super::vocab::array_elems;
use super::*;
use crate::gguf::{array_raw, kv, string_raw, ARRAY, BOOL, F32, I32, STRING, U32};

/// A stand-in reference: a few tokens, token types, merges and ids.
pub(crate) fn fake_reference() -> Gguf {
    let mut g = Gguf::parse(crate::gguf::tests::tiny()).unwrap();
    let strings = |v: &[&str]| {
        let mut raw = STRING.to_le_bytes().to_vec();
        raw.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            raw.extend(string_raw(s));
        }
        raw
    };
    let tokens = ["<|endoftext|>", "a", "b", "ab"];
    let mut types = I32.to_le_bytes().to_vec();
    types.extend_from_slice(&4u64.to_le_bytes());
    for t in [3i32, 1, 1, 1] {
        types.extend_from_slice(&t.to_le_bytes());
    }
    g.kvs.extend([
        kv("tokenizer.ggml.model", STRING, string_raw("gpt2")),
        kv("tokenizer.ggml.tokens", ARRAY, strings(&tokens)),
        kv("tokenizer.ggml.token_type", ARRAY, types),
        kv("tokenizer.ggml.merges", ARRAY, strings(&["a b"])),
        kv(
            "tokenizer.ggml.eos_token_id",
            U32,
            0u32.to_le_bytes().to_vec(),
        ),
    ]);
    Gguf::parse(g.write()).unwrap()
}

/// A stand-in SentencePiece reference: `<pad>`, `<eos>`, `<bos>` (control),
/// `<unk>`, the 256 byte tokens, then `normals` pieces `▁p<i>` of score -i.
pub(crate) fn fake_spm_reference(normals: usize) -> Gguf {
    let mut g = Gguf::parse(crate::gguf::tests::tiny()).unwrap();
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3i32, 3, 3, 2];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for i in 0..normals {
        tokens.push(format!("\u{2581}p{i}"));
        types.push(1);
    }
    let scores: Vec<f32> = (0..tokens.len())
        .map(|id| if types[id] == 1 { -(id as f32) } else { 0.0 })
        .collect();
    let id = |k: &str, v: u32| kv(k, U32, v.to_le_bytes().to_vec());
    g.kvs.extend([
        kv("tokenizer.ggml.model", STRING, string_raw("llama")),
        kv("tokenizer.ggml.pre", STRING, string_raw("default")),
        kv(
            "tokenizer.ggml.tokens",
            ARRAY,
            array_raw(
                STRING,
                tokens
                    .iter()
                    .map(|t| string_raw(t))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        kv(
            "tokenizer.ggml.scores",
            ARRAY,
            array_raw(
                F32,
                scores
                    .iter()
                    .map(|s| s.to_le_bytes().to_vec())
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        kv(
            "tokenizer.ggml.token_type",
            ARRAY,
            array_raw(
                I32,
                types
                    .iter()
                    .map(|t| t.to_le_bytes().to_vec())
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        id("tokenizer.ggml.bos_token_id", 2),
        id("tokenizer.ggml.eos_token_id", 1),
        id("tokenizer.ggml.unknown_token_id", 3),
        id("tokenizer.ggml.padding_token_id", 0),
        kv("tokenizer.ggml.add_space_prefix", BOOL, vec![0]),
    ]);
    Gguf::parse(g.write()).unwrap()
}

/// The stand-in reference a preset takes its tokenizer from.
fn reference_for(p: &Preset) -> Gguf {
    match p.vocab_source {
        Vocab::Reference | Vocab::Harmony => fake_reference(),
        Vocab::Spm => fake_spm_reference(100),
    }
}

fn options(name: &str, format: Format, seed: u64, threads: usize) -> Options {
    Options {
        preset: preset(name).unwrap(),
        format,
        seed,
        threads,
    }
}

fn written(o: &Options) -> Vec<u8> {
    let mut out = Vec::new();
    let w = write_to(o, &reference_for(o.preset), &mut out).unwrap();
    assert_eq!(w.bytes, out.len() as u64);
    out
}

fn ids_of(kvs: &[Kv], key: &str) -> u32 {
    let k = kvs.iter().find(|k| k.key == key).unwrap();
    u32::from_le_bytes(k.raw[..].try_into().unwrap())
}

fn token_list(kvs: &[Kv]) -> Vec<String> {
    let g = Gguf {
        kvs: kvs.to_vec(),
        ..Gguf::parse(crate::gguf::tests::tiny()).unwrap()
    };
    array_elems(&g, "tokenizer.ggml.tokens", STRING)
        .unwrap()
        .into_iter()
        .map(|b| String::from_utf8(b).unwrap())
        .collect()
}
