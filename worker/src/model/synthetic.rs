//! Small random-weight llama-family GGUF files for tests: every weight format
//! appears, shapes are small enough for the CPU reference, and the result is
//! a function of the seed alone. The tokenizer metadata is a bare token list
//! (no merges), so these files exercise backends, not tokenizers.

use std::cell::RefCell;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::gguf::{GgufWriter, MetaValue};
use crate::quant::{quantize, GgmlType};

/// `n` values drawn uniformly from `[-scale, scale)`.
pub fn random_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

/// A small random llama-family model with every weight format (see
/// [`synthetic_model`]).
pub fn synthetic_llama(arch: &str, seed: u64, context: u32) -> Vec<u8> {
    synthetic_model(arch, seed, context)
}

/// The architectures [`synthetic_model`] writes.
pub const SYNTHETIC_ARCHS: [&str; 7] = [
    "llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt2",
];

/// `qwen3moe`'s experts: how many, how many a token, each one's width.
const MOE: (usize, usize, usize) = (8, 3, 256);

/// A small random model of `arch` (one of [`SYNTHETIC_ARCHS`]) with every
/// weight format, written with `GgufWriter`, laid out as llama.cpp's
/// converter lays out that family: `qwen2` adds Q/K/V biases and a tied LM
/// head; `qwen3` has heads wider than `d / n_head`, per-head Q/K norms and a
/// tied LM head; `qwen3moe` is `qwen3` with 3 of 8 experts (an F32 router,
/// stacked expert matrices) in place of the feed-forward; `gemma3` has heads
/// wider than `d / n_head`, per-head Q/K norms, post-norms and an 8-position
/// window on its first layer; `phi3` fuses QKV
/// and gate/up and windows every layer at 16 positions; `gpt2` has learned
/// positions, LayerNorms and biases everywhere.
pub fn synthetic_model(arch: &str, seed: u64, context: u32) -> Vec<u8> {
    synthetic_model_with(arch, seed, context, false)
}

/// [`synthetic_model`], and with `rope_factors` the frequency factors of
/// its family: Llama 3.1's `rope_freqs` for `llama`; for `phi3`, LongRoPE's
/// long and short tables, `rope.scaling.attn_factor` 1.1 and half the
/// context as the original one (so the long table applies). The other
/// tensors are the same as without them.
pub fn synthetic_model_with(arch: &str, seed: u64, context: u32, rope_factors: bool) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (d, n_layer, n_head, ff, vocab) = (256usize, 2usize, 4usize, 512usize, 384usize);
    let n_kv = if arch == "gpt2" { n_head } else { 2 };
    let qwen3 = matches!(arch, "qwen3" | "qwen3moe");
    let hd = if arch == "gemma3" || qwen3 {
        128
    } else {
        d / n_head
    };
    let (qd, kvd) = (n_head * hd, n_kv * hd);
    let mut w = GgufWriter::new();
    let s = |v: &str| MetaValue::String(v.to_string());
    let u = |v: usize| MetaValue::U32(v as u32);
    w.metadata("general.architecture", s(arch));
    w.metadata("general.name", s("synthetic"));
    let key = |k: &str| format!("{arch}.{k}");
    w.metadata(&key("context_length"), MetaValue::U32(context));
    w.metadata(&key("embedding_length"), u(d));
    w.metadata(&key("block_count"), u(n_layer));
    w.metadata(&key("attention.head_count"), u(n_head));
    w.metadata(&key("attention.head_count_kv"), u(n_kv));
    w.metadata(&key("feed_forward_length"), u(ff));
    w.metadata(&key("vocab_size"), u(vocab));
    let eps_key = match arch {
        "gpt2" => "attention.layer_norm_epsilon",
        _ => "attention.layer_norm_rms_epsilon",
    };
    w.metadata(&key(eps_key), MetaValue::F32(1e-5));
    match arch {
        "gemma3" => {
            w.metadata(&key("attention.key_length"), u(hd));
            w.metadata(&key("attention.value_length"), u(hd));
            w.metadata(&key("attention.sliding_window"), u(8));
            w.metadata(&key("attention.sliding_window_pattern"), u(2));
            w.metadata(&key("rope.freq_base"), MetaValue::F32(1_000_000.0));
        }
        "qwen3" | "qwen3moe" => {
            w.metadata(&key("attention.key_length"), u(hd));
            w.metadata(&key("attention.value_length"), u(hd));
            w.metadata(&key("rope.freq_base"), MetaValue::F32(1_000_000.0));
            if arch == "qwen3moe" {
                let (count, used, eff) = MOE;
                w.metadata(&key("expert_count"), u(count));
                w.metadata(&key("expert_used_count"), u(used));
                w.metadata(&key("expert_feed_forward_length"), u(eff));
            }
        }
        "phi3" => {
            w.metadata(&key("attention.sliding_window"), u(16));
            w.metadata(&key("rope.dimension_count"), u(hd / 2));
            w.metadata(&key("rope.freq_base"), MetaValue::F32(10000.0));
        }
        "gpt2" => {}
        _ => {
            w.metadata(&key("rope.freq_base"), MetaValue::F32(10000.0));
        }
    }
    let tokens: Vec<MetaValue> = (0..vocab)
        .map(|i| MetaValue::String(format!("t{i}")))
        .collect();
    w.metadata("tokenizer.ggml.tokens", MetaValue::Array(tokens));

    // Each matrix takes the next format, whether 2-D or a stack of experts.
    let types = RefCell::new(GgmlType::ALL.iter().copied().cycle());
    let stacked = |w: &mut GgufWriter, name: &str, dims: &[u64], rng: &mut ChaCha8Rng| {
        let ty = types.borrow_mut().next().unwrap();
        let len = dims.iter().product::<u64>() as usize;
        let v = random_vec(rng, len, 1.5 / (dims[0] as f32).sqrt());
        w.tensor(name, dims, ty, quantize(ty, &v).unwrap());
    };
    let matrix =
        |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, rng: &mut ChaCha8Rng| {
            stacked(w, name, &[cols as u64, rows as u64], rng)
        };
    let vector = |w: &mut GgufWriter, name: &str, len: usize, base: f32, rng: &mut ChaCha8Rng| {
        let v: Vec<f32> = (0..len)
            .map(|_| base + rng.random_range(-0.2f32..0.2))
            .collect();
        w.tensor(
            name,
            &[len as u64],
            GgmlType::F32,
            quantize(GgmlType::F32, &v).unwrap(),
        );
    };
    // The embedding table: every row with a distinct random pattern.
    let emb: Vec<f32> = random_vec(&mut rng, vocab * d, 1.0);
    let emb_ty = match arch {
        "qwen2" | "qwen3" | "qwen3moe" | "gemma3" => GgmlType::Q8_0,
        _ => GgmlType::Q6K,
    };
    w.tensor(
        "token_embd.weight",
        &[d as u64, vocab as u64],
        emb_ty,
        quantize(emb_ty, &emb).unwrap(),
    );
    if arch == "gpt2" {
        let pos = random_vec(&mut rng, context as usize * d, 0.5);
        let f16 = GgmlType::F16;
        w.tensor(
            "position_embd.weight",
            &[d as u64, context as u64],
            f16,
            quantize(f16, &pos).unwrap(),
        );
    }
    for i in 0..n_layer {
        let n = |x: &str| format!("blk.{i}.{x}");
        match arch {
            "gpt2" => {
                for (name, rows, cols) in [
                    ("attn_qkv", qd + 2 * kvd, d),
                    ("attn_output", d, qd),
                    ("ffn_up", ff, d),
                    ("ffn_down", d, ff),
                ] {
                    matrix(&mut w, &n(&format!("{name}.weight")), rows, cols, &mut rng);
                    vector(&mut w, &n(&format!("{name}.bias")), rows, 0.0, &mut rng);
                }
                for norm in ["attn_norm", "ffn_norm"] {
                    vector(&mut w, &n(&format!("{norm}.weight")), d, 1.0, &mut rng);
                    vector(&mut w, &n(&format!("{norm}.bias")), d, 0.0, &mut rng);
                }
                continue;
            }
            "phi3" => {
                vector(&mut w, &n("attn_norm.weight"), d, 1.0, &mut rng);
                matrix(&mut w, &n("attn_qkv.weight"), qd + 2 * kvd, d, &mut rng);
                matrix(&mut w, &n("attn_output.weight"), d, qd, &mut rng);
                vector(&mut w, &n("ffn_norm.weight"), d, 1.0, &mut rng);
                matrix(&mut w, &n("ffn_up.weight"), 2 * ff, d, &mut rng);
                matrix(&mut w, &n("ffn_down.weight"), d, ff, &mut rng);
                continue;
            }
            _ => {}
        }
        vector(&mut w, &n("attn_norm.weight"), d, 1.0, &mut rng);
        matrix(&mut w, &n("attn_q.weight"), qd, d, &mut rng);
        matrix(&mut w, &n("attn_k.weight"), kvd, d, &mut rng);
        matrix(&mut w, &n("attn_v.weight"), kvd, d, &mut rng);
        if arch == "qwen2" {
            vector(&mut w, &n("attn_q.bias"), qd, 0.0, &mut rng);
            vector(&mut w, &n("attn_k.bias"), kvd, 0.0, &mut rng);
            vector(&mut w, &n("attn_v.bias"), kvd, 0.0, &mut rng);
        }
        if arch == "gemma3" || qwen3 {
            vector(&mut w, &n("attn_q_norm.weight"), hd, 1.0, &mut rng);
            vector(&mut w, &n("attn_k_norm.weight"), hd, 1.0, &mut rng);
        }
        if arch == "gemma3" {
            vector(&mut w, &n("post_attention_norm.weight"), d, 1.0, &mut rng);
            vector(&mut w, &n("post_ffw_norm.weight"), d, 1.0, &mut rng);
        }
        matrix(&mut w, &n("attn_output.weight"), d, qd, &mut rng);
        vector(&mut w, &n("ffn_norm.weight"), d, 1.0, &mut rng);
        if arch == "qwen3moe" {
            let (count, _, eff) = MOE;
            let router = random_vec(&mut rng, count * d, 1.0 / (d as f32).sqrt());
            let f32_ty = GgmlType::F32;
            let dims = [d as u64, count as u64];
            w.tensor(
                &n("ffn_gate_inp.weight"),
                &dims,
                f32_ty,
                quantize(f32_ty, &router).unwrap(),
            );
            // Each stacked as llama.cpp writes them: `[cols, rows, experts]`.
            for (name, rows, cols) in [("gate", eff, d), ("up", eff, d), ("down", d, eff)] {
                let dims = [cols as u64, rows as u64, count as u64];
                stacked(
                    &mut w,
                    &n(&format!("ffn_{name}_exps.weight")),
                    &dims,
                    &mut rng,
                );
            }
            continue;
        }
        matrix(&mut w, &n("ffn_gate.weight"), ff, d, &mut rng);
        matrix(&mut w, &n("ffn_up.weight"), ff, d, &mut rng);
        matrix(&mut w, &n("ffn_down.weight"), d, ff, &mut rng);
    }
    if arch == "gpt2" {
        vector(&mut w, "output_norm.weight", d, 1.0, &mut rng);
        vector(&mut w, "output_norm.bias", d, 0.0, &mut rng);
    } else {
        vector(&mut w, "output_norm.weight", d, 1.0, &mut rng);
    }
    if matches!(arch, "llama" | "phi3") {
        matrix(&mut w, "output.weight", vocab, d, &mut rng);
    }
    if rope_factors {
        // Factors of n_rot / 2 values, rising (phi3 rotates half its heads).
        let half = if arch == "phi3" { hd / 4 } else { hd / 2 };
        let table = |top: f32| -> Vec<u8> {
            let v: Vec<f32> = (0..half)
                .map(|i| 1.0 + (top - 1.0) * i as f32 / (half - 1) as f32)
                .collect();
            quantize(GgmlType::F32, &v).unwrap()
        };
        let f32_ty = GgmlType::F32;
        match arch {
            "llama" => {
                w.tensor("rope_freqs.weight", &[half as u64], f32_ty, table(8.0));
            }
            "phi3" => {
                w.tensor(
                    "rope_factors_long.weight",
                    &[half as u64],
                    f32_ty,
                    table(40.0),
                );
                w.tensor(
                    "rope_factors_short.weight",
                    &[half as u64],
                    f32_ty,
                    table(2.5),
                );
                w.metadata(&key("rope.scaling.attn_factor"), MetaValue::F32(1.1));
                w.metadata(
                    &key("rope.scaling.original_context_length"),
                    MetaValue::U32(context / 2),
                );
            }
            _ => {}
        }
    }
    w.to_bytes()
}
