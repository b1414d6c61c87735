//! Every metadata entry of a synthetic file: the preset's hyperparameters
//! under llama.cpp's keys (for phi3, gpt2 and gpt-oss exactly the keys its
//! converter writes), `general.*`, and the vocabulary.

use anyhow::{anyhow, Result};

use super::blocks::Format;
use super::harmony;
use super::presets::{Arch, Options, Preset, RopeScaling, Vocab};
use super::tensors::ALIGNMENT;
use super::vocab::{spm_tokenizer_kvs, tokenizer_kvs};
use crate::gguf::{kv, string_raw, Gguf, Kv, F32, STRING, U32, U64};

/// `general.name`: `synthetic-<preset>`, but `phi 3` for `phi3`. llama.cpp
/// (llama-vocab.cpp) sets Phi-3's special-token attributes when the lowercased
/// name holds `phi3` or `phi-3`, looking up `</s>` and `<|endoftext|>` by text:
/// a vocabulary without them (Gemma's) then fails to load. llama.cpp's
/// converter names Phi-3-mini `Phi 3 Mini 4k Instruct`, which it does not
/// match either.
pub fn general_name(p: &Preset) -> String {
    format!("synthetic-{}", p.name).replace("phi3", "phi 3")
}

/// `general.file_type`: the format's, but `MOSTLY_MXFP4_MOE` (38) for the
/// gpt-oss presets, whose experts are MXFP4 in every format (what llama.cpp's
/// converter records for an MXFP4 model, and llama-quantize for experts in
/// MXFP4 and the rest in Q8_0).
fn file_type(o: &Options) -> u32 {
    match o.preset.arch {
        Arch::GptOss => Format::Mxfp4.file_type(),
        _ => o.format.file_type(),
    }
}

/// Every metadata entry of the file. `reference` is the tokenizer's source:
/// the BPE reference, or the SentencePiece one for `Vocab::Spm` presets.
pub fn metadata(o: &Options, reference: &Gguf) -> Result<Vec<Kv>> {
    let p = o.preset;
    let a = p.arch.name();
    let u32_kv = |k: &str, v: u64| -> Result<Kv> {
        Ok(kv(
            &format!("{a}.{k}"),
            U32,
            u32::try_from(v)?.to_le_bytes().to_vec(),
        ))
    };
    let f32_kv = |k: &str, v: f32| kv(&format!("{a}.{k}"), F32, v.to_le_bytes().to_vec());
    let mut kvs = vec![
        kv("general.architecture", STRING, string_raw(a)),
        kv("general.name", STRING, string_raw(&general_name(p))),
        kv(
            "general.file_type",
            U32,
            file_type(o).to_le_bytes().to_vec(),
        ),
        kv(
            "general.alignment",
            U32,
            (ALIGNMENT as u32).to_le_bytes().to_vec(),
        ),
        kv(
            "general.quantization_version",
            U32,
            2u32.to_le_bytes().to_vec(),
        ),
    ];
    let context = u64::from(p.context);
    let orig_context = match p.rope_scaling {
        RopeScaling::LongRope { orig } => u64::from(orig),
        _ => context,
    };
    let head_dim = p.head_dim();
    let string_kv = |k: &str, v: &str| kv(&format!("{a}.{k}"), STRING, string_raw(v));
    match p.arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
            kvs.extend([
                u32_kv("context_length", context)?,
                u32_kv("embedding_length", p.n_embd)?,
                u32_kv("block_count", p.n_layer)?,
                u32_kv("feed_forward_length", p.n_ff)?,
                u32_kv("attention.head_count", p.n_head)?,
                u32_kv("attention.head_count_kv", p.n_head_kv)?,
                f32_kv("rope.freq_base", p.rope_base),
                u32_kv("rope.dimension_count", head_dim)?,
                f32_kv("attention.layer_norm_rms_epsilon", p.norm_eps),
                u32_kv("vocab_size", p.vocab)?,
            ]);
            // Where config.json has head_dim (Qwen3, Mistral Nemo), the
            // converter writes it.
            if p.head_dim != 0 {
                kvs.extend([
                    u32_kv("attention.key_length", head_dim)?,
                    u32_kv("attention.value_length", head_dim)?,
                ]);
            }
            // Qwen2MoeModel.set_gguf_parameters: the experts' count, how many
            // a token, and their width (moe_intermediate_size).
            if let Some(moe) = p.moe {
                kvs.extend([
                    u32_kv("expert_count", moe.experts)?,
                    u32_kv("expert_used_count", moe.used)?,
                    u32_kv("expert_feed_forward_length", moe.n_ff)?,
                ]);
            }
        }
        // Phi3MiniModel.set_gguf_parameters, in its order (no vocab_size).
        Arch::Phi3 => kvs.extend([
            u32_kv("context_length", context)?,
            u32_kv("rope.scaling.original_context_length", orig_context)?,
            u32_kv("embedding_length", p.n_embd)?,
            u32_kv("feed_forward_length", p.n_ff)?,
            u32_kv("block_count", p.n_layer)?,
            u32_kv("attention.head_count", p.n_head)?,
            u32_kv("attention.head_count_kv", p.n_head_kv)?,
            f32_kv("attention.layer_norm_rms_epsilon", p.norm_eps),
            u32_kv("rope.dimension_count", head_dim)?,
            f32_kv("rope.freq_base", p.rope_base),
            u32_kv("attention.sliding_window", u64::from(p.sliding_window))?,
        ]),
        // GPT2Model.set_gguf_parameters, in its order: no head_count_kv (llama.cpp
        // takes head_count), no RoPE, no vocab_size.
        Arch::Gpt2 => kvs.extend([
            u32_kv("block_count", p.n_layer)?,
            u32_kv("context_length", context)?,
            u32_kv("embedding_length", p.n_embd)?,
            u32_kv("feed_forward_length", p.n_ff)?,
            u32_kv("attention.head_count", p.n_head)?,
            f32_kv("attention.layer_norm_epsilon", p.norm_eps),
        ]),
        // TextModel.set_gguf_parameters in its order, then GptOssModel's
        // sliding window and expert width (no rope.dimension_count: llama.cpp
        // takes key_length).
        Arch::GptOss => {
            let moe = p
                .moe
                .ok_or_else(|| anyhow!("{}: gpt-oss without experts", p.name))?;
            kvs.extend([
                u32_kv("block_count", p.n_layer)?,
                u32_kv("context_length", context)?,
                u32_kv("embedding_length", p.n_embd)?,
                u32_kv("feed_forward_length", p.n_ff)?,
                u32_kv("attention.head_count", p.n_head)?,
                u32_kv("attention.head_count_kv", p.n_head_kv)?,
            ]);
            if let RopeScaling::Yarn {
                factor,
                orig,
                beta_fast,
                beta_slow,
            } = p.rope_scaling
            {
                kvs.extend([
                    string_kv("rope.scaling.type", "yarn"),
                    f32_kv("rope.scaling.factor", factor),
                    u32_kv("rope.scaling.original_context_length", u64::from(orig))?,
                    f32_kv("rope.scaling.yarn_beta_fast", beta_fast),
                    f32_kv("rope.scaling.yarn_beta_slow", beta_slow),
                ]);
            }
            kvs.extend([
                f32_kv("rope.freq_base", p.rope_base),
                f32_kv("attention.layer_norm_rms_epsilon", p.norm_eps),
                u32_kv("expert_count", moe.experts)?,
                u32_kv("expert_used_count", moe.used)?,
                u32_kv("attention.key_length", head_dim)?,
                u32_kv("attention.value_length", head_dim)?,
                u32_kv("attention.sliding_window", u64::from(p.sliding_window))?,
                u32_kv("expert_feed_forward_length", moe.n_ff)?,
            ]);
        }
    }
    // Phi3MiniModel.generate_extra_tensors adds LongRoPE's magnitude factor.
    if let RopeScaling::LongRope { orig } = p.rope_scaling {
        let scale = context as f64 / f64::from(orig);
        let attn_factor = (1.0 + scale.ln() / f64::from(orig).ln()).sqrt() as f32;
        kvs.push(f32_kv("rope.scaling.attn_factor", attn_factor));
    }
    kvs.push(kv(
        "general.synthetic_seed",
        U64,
        o.seed.to_le_bytes().to_vec(),
    ));
    kvs.extend(match p.vocab_source {
        Vocab::Reference => tokenizer_kvs(reference, p.vocab)?,
        Vocab::Spm => spm_tokenizer_kvs(reference, p.vocab)?,
        Vocab::Harmony => harmony::tokenizer_kvs()?,
    });
    Ok(kvs)
}
