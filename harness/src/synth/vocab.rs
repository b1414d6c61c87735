//! A preset's vocabulary as `tokenizer.*` metadata: the reference model's BPE
//! vocabulary padded with unused tokens, or a closed cut of a SentencePiece
//! one (the phi3 presets). gpt-oss's o200k_harmony is `harmony`'s.

use std::path::Path;

use anyhow::{anyhow, bail, Result};

use super::presets::{Preset, Vocab};
use crate::gguf::{array_raw, kv, string_raw, Gguf, Kv, ARRAY, BOOL, F32, I32, STRING, U32};

/// The file whose tokenizer a preset takes: `reference` (the BPE reference
/// model) or `spm_reference`; gpt-oss's comes from tiktoken-rs, and the
/// reference is read but not used.
pub fn tokenizer_source<'a>(p: &Preset, reference: &'a Path, spm_reference: &'a Path) -> &'a Path {
    match p.vocab_source {
        Vocab::Reference | Vocab::Harmony => reference,
        Vocab::Spm => spm_reference,
    }
}

/// llama.cpp's `LLAMA_TOKEN_TYPE_UNUSED`: never produced by encoding, renders as nothing.
const TOKEN_TYPE_UNUSED: i32 = 5;

/// The reference's `tokenizer.*` entries, token lists padded to `vocab`.
pub fn tokenizer_kvs(reference: &Gguf, vocab: u64) -> Result<Vec<Kv>> {
    let have = reference
        .array_len("tokenizer.ggml.tokens")
        .ok_or_else(|| anyhow!("the reference has no tokenizer.ggml.tokens"))?;
    if have > vocab {
        bail!("the reference vocabulary ({have} tokens) is larger than the preset's ({vocab})");
    }
    let mut out = Vec::new();
    for k in reference
        .kvs
        .iter()
        .filter(|k| k.key.starts_with("tokenizer."))
    {
        let pad: Option<Box<dyn Fn(u64) -> Vec<u8>>> = match k.key.as_str() {
            "tokenizer.ggml.tokens" => Some(Box::new(|id| string_raw(&format!("[PAD{id}]")))),
            "tokenizer.ggml.token_type" => {
                Some(Box::new(|_| TOKEN_TYPE_UNUSED.to_le_bytes().to_vec()))
            }
            "tokenizer.ggml.scores" => Some(Box::new(|_| (-1000f32).to_le_bytes().to_vec())),
            _ => None,
        };
        let Some(pad) = pad.filter(|_| have < vocab) else {
            out.push(k.clone());
            continue;
        };
        let elem = u32::from_le_bytes(k.raw[..4].try_into()?);
        let n = u64::from_le_bytes(k.raw[4..12].try_into()?);
        let want_elem = match k.key.as_str() {
            "tokenizer.ggml.tokens" => STRING,
            "tokenizer.ggml.token_type" => I32,
            _ => F32,
        };
        if k.vtype != ARRAY || elem != want_elem || n != have {
            bail!(
                "{} in the reference is not an array of {have} values of type {want_elem}",
                k.key
            );
        }
        let mut raw = k.raw.clone();
        raw[4..12].copy_from_slice(&vocab.to_le_bytes());
        for id in have..vocab {
            raw.extend(pad(id));
        }
        out.push(kv(&k.key, ARRAY, raw));
    }
    Ok(out)
}

/// SentencePiece token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_NORMAL: i32 = 1;

/// The elements of array `key` of `g`, each as its raw bytes (a string's
/// without its length), checking the element type.
pub(super) fn array_elems(g: &Gguf, key: &str, elem: u32) -> Result<Vec<Vec<u8>>> {
    let k = g
        .kv(key)
        .ok_or_else(|| anyhow!("the SentencePiece reference has no {key}"))?;
    let bad = || anyhow!("{key} in the SentencePiece reference is not an array of type {elem}");
    if k.vtype != ARRAY || k.raw.len() < 12 || u32::from_le_bytes(k.raw[..4].try_into()?) != elem {
        return Err(bad());
    }
    let n = u64::from_le_bytes(k.raw[4..12].try_into()?);
    let mut at = 12usize;
    let mut out = Vec::with_capacity(usize::try_from(n)?);
    for _ in 0..n {
        let (start, len) = if elem == STRING {
            let len = k.raw.get(at..at + 8).ok_or_else(bad)?;
            (
                at + 8,
                usize::try_from(u64::from_le_bytes(len.try_into()?))?,
            )
        } else {
            (at, 4)
        };
        out.push(k.raw.get(start..start + len).ok_or_else(bad)?.to_vec());
        at = start + len;
    }
    Ok(out)
}

/// Which ids of a SentencePiece vocabulary (its pieces, token types and
/// scores) to keep for a `vocab`-token one, in their original relative order
/// (the caller renumbers them). A smaller vocabulary is kept whole (and padded
/// by the caller).
///
/// The cut is closed, as every real SentencePiece BPE vocabulary is: every
/// kept piece of two or more characters splits into two kept pieces, down to
/// single characters, so a tokenizer whose merges are derived from the
/// pieces (Hugging Face's, the worker's `gguf-spm`) reaches every piece that
/// llama.cpp's character-level merging reaches. Kept, in this order:
/// 1. every non-normal token (control, byte, user-defined, unknown, unused)
///    and the special ids (an error when they alone exceed `vocab`);
/// 2. every normal single-character piece (one Unicode scalar, `▁` included),
///    or the highest-scored of them when they do not all fit;
/// 3. the highest-scored remaining normal pieces that split, at some
///    character boundary, into two kept normal pieces; a piece that does not
///    is skipped and the next one tried.
///
/// Step 3 takes candidates in descending score order, so a piece's parts
/// are decided before it. In Gemma 3's vocabulary (the phi3 presets'
/// reference) the merged pieces' scores fall strictly with their ids
/// (494..236742), and every merged piece splits into single characters or
/// merged pieces of higher score; the single characters come last (ids
/// 236743 on, the lowest scores of all), as SentencePiece's BPE trainer
/// writes them, which is why step 2 keeps them whatever their score.
pub fn spm_selection(
    tokens: &[Vec<u8>],
    types: &[i32],
    scores: &[f32],
    specials: &[u64],
    vocab: u64,
) -> Result<Vec<usize>> {
    let n = usize::try_from(vocab)?;
    if types.len() <= n {
        return Ok((0..types.len()).collect());
    }
    let mut keep: Vec<bool> = types.iter().map(|&t| t != TOKEN_TYPE_NORMAL).collect();
    for &id in specials {
        if let Some(k) = keep.get_mut(id as usize) {
            *k = true;
        }
    }
    let mut kept = keep.iter().filter(|&&k| k).count();
    if kept > n {
        bail!("the SentencePiece reference has {kept} control, byte and special tokens, more than the preset's {n}");
    }
    let piece = |id: usize| std::str::from_utf8(&tokens[id]).ok();
    let by_score = |ids: &mut Vec<usize>| {
        ids.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    };
    let normal = |id: usize| types[id] == TOKEN_TYPE_NORMAL;
    // The kept normal pieces, by text: what a longer piece may be built from.
    let mut pieces: std::collections::HashSet<&str> = (0..types.len())
        .filter(|&id| keep[id] && normal(id))
        .filter_map(piece)
        .collect();
    let single = |id: usize| piece(id).is_some_and(|s| s.chars().count() == 1);
    let mut singles: Vec<usize> = (0..types.len())
        .filter(|&id| !keep[id] && normal(id) && single(id))
        .collect();
    by_score(&mut singles);
    for &id in singles.iter().take(n - kept) {
        keep[id] = true;
        pieces.insert(piece(id).unwrap());
        kept += 1;
    }
    let mut rest: Vec<usize> = (0..types.len())
        .filter(|&id| !keep[id] && normal(id) && !single(id))
        .collect();
    by_score(&mut rest);
    for id in rest {
        if kept == n {
            break;
        }
        let Some(s) = piece(id) else { continue };
        let reachable = s
            .char_indices()
            .skip(1)
            .any(|(at, _)| pieces.contains(&s[..at]) && pieces.contains(&s[at..]));
        if reachable {
            keep[id] = true;
            pieces.insert(s);
            kept += 1;
        }
    }
    Ok((0..types.len()).filter(|&id| keep[id]).collect())
}

/// A Phi-3 file's `tokenizer.*` entries (as `convert_hf_to_gguf.py`'s
/// `Phi3MiniModel.set_vocab` writes them: model `llama`, pre `default`,
/// tokens, scores, types, the special ids, `add_bos_token` true and
/// `add_eos_token` false, no `add_space_prefix`, so llama.cpp's SentencePiece
/// default, true, applies) over the pieces of `reference`, cut to `vocab`
/// tokens by `spm_selection` or padded with unused `[PAD<id>]` tokens as the
/// converter pads Phi-3's 32011 to 32064.
pub fn spm_tokenizer_kvs(reference: &Gguf, vocab: u64) -> Result<Vec<Kv>> {
    if reference.string("tokenizer.ggml.model").as_deref() != Some("llama") {
        bail!("the SentencePiece reference's tokenizer.ggml.model is not \"llama\"");
    }
    let tokens = array_elems(reference, "tokenizer.ggml.tokens", STRING)?;
    let to_f32 = |b: Vec<u8>| f32::from_le_bytes(b.try_into().unwrap());
    let to_i32 = |b: Vec<u8>| i32::from_le_bytes(b.try_into().unwrap());
    let scores: Vec<f32> = array_elems(reference, "tokenizer.ggml.scores", F32)?
        .into_iter()
        .map(to_f32)
        .collect();
    let types: Vec<i32> = array_elems(reference, "tokenizer.ggml.token_type", I32)?
        .into_iter()
        .map(to_i32)
        .collect();
    if scores.len() != tokens.len() || types.len() != tokens.len() {
        bail!("the SentencePiece reference's tokens, scores and types differ in length");
    }
    const IDS: [&str; 4] = [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
    ];
    let specials: Vec<(&str, u64)> = IDS
        .iter()
        .filter_map(|&k| Some((k, reference.u64_value(k)?)))
        .collect();
    let ids: Vec<u64> = specials.iter().map(|s| s.1).collect();
    let keep = spm_selection(&tokens, &types, &scores, &ids, vocab)?;
    let pad = usize::try_from(vocab)? - keep.len();
    let new_id = |old: u64| keep.iter().position(|&k| k as u64 == old);

    let mut out = vec![
        kv("tokenizer.ggml.model", STRING, string_raw("llama")),
        kv("tokenizer.ggml.pre", STRING, string_raw("default")),
    ];
    let n = keep.len();
    let token_items = keep
        .iter()
        .map(|&id| {
            let mut r = (tokens[id].len() as u64).to_le_bytes().to_vec();
            r.extend_from_slice(&tokens[id]);
            r
        })
        .chain((n..n + pad).map(|id| string_raw(&format!("[PAD{id}]"))));
    let token_items: Vec<Vec<u8>> = token_items.collect();
    out.push(kv(
        "tokenizer.ggml.tokens",
        ARRAY,
        array_raw(STRING, token_items.into_iter()),
    ));
    let score_items: Vec<Vec<u8>> = keep
        .iter()
        .map(|&id| scores[id])
        .chain(std::iter::repeat_n(-10_000.0f32, pad))
        .map(|s| s.to_le_bytes().to_vec())
        .collect();
    out.push(kv(
        "tokenizer.ggml.scores",
        ARRAY,
        array_raw(F32, score_items.into_iter()),
    ));
    let type_items: Vec<Vec<u8>> = keep
        .iter()
        .map(|&id| types[id])
        .chain(std::iter::repeat_n(TOKEN_TYPE_UNUSED, pad))
        .map(|t| t.to_le_bytes().to_vec())
        .collect();
    out.push(kv(
        "tokenizer.ggml.token_type",
        ARRAY,
        array_raw(I32, type_items.into_iter()),
    ));
    for (key, old) in specials {
        let id = new_id(old).ok_or_else(|| anyhow!("{key} {old} was not kept"))?;
        out.push(kv(key, U32, u32::try_from(id)?.to_le_bytes().to_vec()));
    }
    out.push(kv("tokenizer.ggml.add_bos_token", BOOL, vec![1]));
    out.push(kv("tokenizer.ggml.add_eos_token", BOOL, vec![0]));
    Ok(out)
}
