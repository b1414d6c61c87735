//! gpt-oss's vocabulary for synthetic files: `o200k_harmony`, the o200k
//! ranks that tiktoken-rs ships (199,998 byte strings, rank = id) with the
//! harmony special tokens on ids 199,998 to 201,087, written as llama.cpp's
//! converter (`_set_vocab_gpt2`) writes it from the Hugging Face
//! `tokenizer.json` that transformers' `TikTokenConverter` made of the same
//! ranks:
//! - `tokenizer.ggml.tokens`: each rank's bytes in GPT-2's byte-level
//!   alphabet, then the special tokens' text; every id is defined (no padding);
//! - `tokenizer.ggml.token_type`: normal for ranks, control for the special
//!   tokens (all of them `special` in that `tokenizer.json`);
//! - `tokenizer.ggml.merges`: for each token of two or more bytes, in rank
//!   order, every split into two tokens whose parts are tokens, ordered by the
//!   parts' ranks (the converter's `extract_vocab_merges_from_model`): a BPE
//!   that applies them by priority merges exactly as tiktoken does;
//! - `tokenizer.ggml.pre` = `gpt-4o` (what llama.cpp's converter detects for
//!   gpt-oss), bos `<|startoftext|>`, eos `<|return|>`, padding
//!   `<|endoftext|>` as gpt-oss's `tokenizer_config.json` names them, and
//!   the harmony chat template of gpt-oss-120b (`gpt-oss.jinja`, the file
//!   llama.cpp keeps as `models/templates/openai-gpt-oss-120b.jinja`).

use std::collections::HashMap;

use anyhow::{anyhow, ensure, Result};

use crate::gguf::{array_raw, kv, string_raw, Kv, ARRAY, I32, STRING, U32};

/// Ids of the whole vocabulary.
pub const VOCAB: u64 = 201_088;
/// The o200k ranks: ids `0..RANKS` are byte strings.
pub const RANKS: u32 = 199_998;

/// gpt-oss's chat template (OpenAI's, Apache-2.0, from gpt-oss-120b).
pub const CHAT_TEMPLATE: &str = include_str!("gpt-oss.jinja");

/// llama.cpp's `llama_token_type`.
const TOKEN_TYPE_NORMAL: i32 = 1;
const TOKEN_TYPE_CONTROL: i32 = 3;

/// The named special tokens of `o200k_harmony`; every other id from
/// [`RANKS`] on is `<|reserved_<id>|>`.
const NAMED: &[(u32, &str)] = &[
    (199_998, "<|startoftext|>"),
    (199_999, "<|endoftext|>"),
    (200_002, "<|return|>"),
    (200_003, "<|constrain|>"),
    (200_005, "<|channel|>"),
    (200_006, "<|start|>"),
    (200_007, "<|end|>"),
    (200_008, "<|message|>"),
    (200_012, "<|call|>"),
];

/// The text of special token `id` (`RANKS..VOCAB`).
pub fn special_text(id: u32) -> String {
    NAMED
        .iter()
        .find(|(i, _)| *i == id)
        .map_or_else(|| format!("<|reserved_{id}|>"), |(_, t)| t.to_string())
}

/// The id of a named special token.
pub fn special_id(text: &str) -> Option<u32> {
    NAMED.iter().find(|(_, t)| *t == text).map(|(i, _)| *i)
}

/// GPT-2's byte-level alphabet: the printable bytes stand for themselves,
/// the others for the code points from 256 on, in byte order.
pub fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut out = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b)
        } else {
            next += 1;
            char::from_u32(next - 1)
        }
        .expect("below the surrogates");
    }
    out
}

/// Each rank's bytes, from tiktoken-rs's `o200k_harmony` (ids `0..RANKS`).
pub fn rank_bytes() -> Result<Vec<Vec<u8>>> {
    let bpe = tiktoken_rs::o200k_harmony().map_err(|e| anyhow!("o200k_harmony: {e}"))?;
    (0..RANKS)
        .map(|r| {
            bpe.decode_bytes(&[r])
                .map_err(|e| anyhow!("o200k rank {r}: {e:?}"))
        })
        .collect()
}

/// The merges, as pairs of ranks: for each token (rank order) of two or
/// more bytes, every split into two tokens, by the parts' ranks.
pub fn merges(ranks: &[Vec<u8>]) -> Vec<(u32, u32)> {
    let id: HashMap<&[u8], u32> = ranks
        .iter()
        .enumerate()
        .map(|(r, b)| (b.as_slice(), r as u32))
        .collect();
    let mut out = Vec::new();
    for token in ranks.iter().filter(|t| t.len() > 1) {
        let mut splits: Vec<(u32, u32)> = (1..token.len())
            .filter_map(|i| Some((*id.get(&token[..i])?, *id.get(&token[i..])?)))
            .collect();
        splits.sort_unstable();
        out.extend(splits);
    }
    out
}

/// The ranks in GPT-2's byte-level alphabet (rank order) and the merges
/// as pairs of those texts: what the GGUF and `tokenizer.json` both carry.
struct ByteLevel {
    ranks: Vec<String>,
    merges: Vec<[String; 2]>,
}

fn byte_level() -> Result<ByteLevel> {
    let ranks = rank_bytes()?;
    let chars = byte_chars();
    let text = |b: &[u8]| -> String { b.iter().map(|&x| chars[x as usize]).collect() };
    let merges = merges(&ranks);
    ensure!(
        merges.len() >= ranks.iter().filter(|t| t.len() > 1).count(),
        "an o200k token of two or more bytes has no split into two tokens"
    );
    Ok(ByteLevel {
        merges: merges
            .iter()
            .map(|&(a, b)| [text(&ranks[a as usize]), text(&ranks[b as usize])])
            .collect(),
        ranks: ranks.iter().map(|b| text(b)).collect(),
    })
}

/// The `tokenizer.*` entries, in the converter's order.
pub fn tokenizer_kvs() -> Result<Vec<Kv>> {
    let ByteLevel { ranks, merges } = byte_level()?;
    let tokens = ranks
        .into_iter()
        .chain((RANKS..VOCAB as u32).map(special_text));
    let types = (0..VOCAB as u32).map(|id| {
        let t = if id < RANKS {
            TOKEN_TYPE_NORMAL
        } else {
            TOKEN_TYPE_CONTROL
        };
        t.to_le_bytes().to_vec()
    });
    let merge_text = merges.iter().map(|[a, b]| format!("{a} {b}"));
    let u32_kv = |key: &str, v: u32| kv(key, U32, v.to_le_bytes().to_vec());
    let id = |t: &str| special_id(t).expect("a named special token");
    Ok(vec![
        kv("tokenizer.ggml.model", STRING, string_raw("gpt2")),
        kv("tokenizer.ggml.pre", STRING, string_raw("gpt-4o")),
        kv(
            "tokenizer.ggml.tokens",
            ARRAY,
            array_raw(
                STRING,
                tokens
                    .map(|t| string_raw(&t))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        kv("tokenizer.ggml.token_type", ARRAY, array_raw(I32, types)),
        kv(
            "tokenizer.ggml.merges",
            ARRAY,
            array_raw(
                STRING,
                merge_text
                    .map(|m| string_raw(&m))
                    .collect::<Vec<_>>()
                    .into_iter(),
            ),
        ),
        u32_kv("tokenizer.ggml.bos_token_id", id("<|startoftext|>")),
        u32_kv("tokenizer.ggml.eos_token_id", id("<|return|>")),
        u32_kv("tokenizer.ggml.padding_token_id", id("<|endoftext|>")),
        kv("tokenizer.chat_template", STRING, string_raw(CHAT_TEMPLATE)),
    ])
}

/// The same vocabulary as the Hugging Face `tokenizer.json` that
/// transformers' `TikTokenConverter` writes for gpt-oss (the file llama.cpp's
/// converter read): a byte-level BPE of the ranks and merges above, tiktoken's
/// o200k pattern split before the byte-level step, every special token an
/// added token marked special. No post-processor: the worker adds BOS/EOS
/// itself from the GGUF (the `hf-json` kind's rule).
pub fn tokenizer_json() -> Result<serde_json::Value> {
    let ByteLevel { ranks, merges } = byte_level()?;
    let n_ranks = ranks.len();
    let vocab: serde_json::Map<String, serde_json::Value> = ranks
        .into_iter()
        .enumerate()
        .map(|(r, t)| (t, serde_json::Value::from(r)))
        .collect();
    ensure!(
        vocab.len() == n_ranks,
        "two o200k ranks share one byte string"
    );
    let added: Vec<serde_json::Value> = (RANKS..VOCAB as u32)
        .map(|id| {
            serde_json::json!({"id": id, "content": special_text(id), "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    Ok(serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tiktoken_rs::O200K_BASE_PAT_STR},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges}
    }))
}
