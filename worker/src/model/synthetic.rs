//! Small random-weight llama-family GGUF files for tests: every weight format
//! appears, shapes are small enough for the CPU reference, and the result is
//! a function of the seed alone. The tokenizer metadata is a bare token list
//! (no merges), so these files exercise backends, not tokenizers.

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

/// A small random llama-family model with every weight format, written with
/// `GgufWriter`. `qwen2` adds Q/K/V biases, NEOX RoPE and a tied LM head.
pub fn synthetic_llama(arch: &str, seed: u64, context: u32) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (d, n_layer, n_head, n_kv, ff, vocab) =
        (256usize, 2usize, 4usize, 2usize, 512usize, 384usize);
    let hd = d / n_head;
    let mut w = GgufWriter::new();
    let s = |v: &str| MetaValue::String(v.to_string());
    w.metadata("general.architecture", s(arch));
    w.metadata("general.name", s("synthetic"));
    w.metadata(&format!("{arch}.context_length"), MetaValue::U32(context));
    w.metadata(
        &format!("{arch}.embedding_length"),
        MetaValue::U32(d as u32),
    );
    w.metadata(
        &format!("{arch}.block_count"),
        MetaValue::U32(n_layer as u32),
    );
    w.metadata(
        &format!("{arch}.attention.head_count"),
        MetaValue::U32(n_head as u32),
    );
    w.metadata(
        &format!("{arch}.attention.head_count_kv"),
        MetaValue::U32(n_kv as u32),
    );
    w.metadata(
        &format!("{arch}.feed_forward_length"),
        MetaValue::U32(ff as u32),
    );
    w.metadata(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(1e-5),
    );
    w.metadata(&format!("{arch}.rope.freq_base"), MetaValue::F32(10000.0));
    w.metadata(&format!("{arch}.vocab_size"), MetaValue::U32(vocab as u32));
    let tokens: Vec<MetaValue> = (0..vocab)
        .map(|i| MetaValue::String(format!("t{i}")))
        .collect();
    w.metadata("tokenizer.ggml.tokens", MetaValue::Array(tokens));

    let mut types = GgmlType::ALL.iter().copied().cycle();
    let mut matrix =
        |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, rng: &mut ChaCha8Rng| {
            let ty = types.next().unwrap();
            let v = random_vec(rng, rows * cols, 1.5 / (cols as f32).sqrt());
            w.tensor(
                name,
                &[cols as u64, rows as u64],
                ty,
                quantize(ty, &v).unwrap(),
            );
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
    let emb_ty = if arch == "qwen2" {
        GgmlType::Q8_0
    } else {
        GgmlType::Q6K
    };
    w.tensor(
        "token_embd.weight",
        &[d as u64, vocab as u64],
        emb_ty,
        quantize(emb_ty, &emb).unwrap(),
    );
    for i in 0..n_layer {
        let n = |x: &str| format!("blk.{i}.{x}");
        vector(&mut w, &n("attn_norm.weight"), d, 1.0, &mut rng);
        matrix(&mut w, &n("attn_q.weight"), n_head * hd, d, &mut rng);
        matrix(&mut w, &n("attn_k.weight"), n_kv * hd, d, &mut rng);
        matrix(&mut w, &n("attn_v.weight"), n_kv * hd, d, &mut rng);
        if arch == "qwen2" {
            vector(&mut w, &n("attn_q.bias"), n_head * hd, 0.0, &mut rng);
            vector(&mut w, &n("attn_k.bias"), n_kv * hd, 0.0, &mut rng);
            vector(&mut w, &n("attn_v.bias"), n_kv * hd, 0.0, &mut rng);
        }
        matrix(&mut w, &n("attn_output.weight"), d, n_head * hd, &mut rng);
        vector(&mut w, &n("ffn_norm.weight"), d, 1.0, &mut rng);
        matrix(&mut w, &n("ffn_gate.weight"), ff, d, &mut rng);
        matrix(&mut w, &n("ffn_up.weight"), ff, d, &mut rng);
        matrix(&mut w, &n("ffn_down.weight"), d, ff, &mut rng);
    }
    vector(&mut w, "output_norm.weight", d, 1.0, &mut rng);
    if arch != "qwen2" {
        matrix(&mut w, "output.weight", vocab, d, &mut rng);
    }
    w.to_bytes()
}
