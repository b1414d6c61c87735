//! gpt-oss (`gpt-oss`): GGUF tensor names, shapes, and the forward pass,
//! following llama.cpp's `llama_model_openai_moe` graph.
//!
//! Pre-norm blocks: Q, K, V and the output projection with biases, NEOX
//! RoPE with YaRN (`config::Yarn`, a factor table), attention with a
//! learned sink per head and a 128-position window on every other layer
//! (the first included), the residual, `post_attention_norm`, then a
//! mixture of experts (a biased router, then `Ops::moe`: the best `used` of
//! `count` experts weighted by a softmax over their logits, clamped SwiGLU
//! experts with biases, their matrices in MXFP4) and the residual.

use crate::gguf::GgufFile;
use crate::model::config::{ModelConfig, MoeConfig};
use crate::model::ops::{GraphError, MoeWeights, Ops, Product};
use crate::model::parts::{self, check_layer_count, lm_head, Binder, FinalNorm, Pass, Upload};

/// One transformer block's weights.
pub struct GptOssLayer<W> {
    pub attn_norm: W,
    pub wq: W,
    pub bq: W,
    pub wk: W,
    pub bk: W,
    pub wv: W,
    pub bv: W,
    pub wo: W,
    pub bo: W,
    /// `[n_head]`: each head's sink logit.
    pub sinks: W,
    pub post_attention_norm: W,
    /// `[experts, n_embd]` and `[experts]`.
    pub router: W,
    pub router_bias: W,
    /// `[experts * n_ff, n_embd]`, biases `[experts, n_ff]`.
    pub gate: W,
    pub gate_bias: W,
    pub up: W,
    pub up_bias: W,
    /// `[experts * n_embd, n_ff]`, bias `[experts, n_embd]`.
    pub down: W,
    pub down_bias: W,
}

/// All weights of a gpt-oss model.
pub struct GptOssWeights<W> {
    pub token_embd: W,
    pub layers: Vec<GptOssLayer<W>>,
    pub output_norm: W,
    pub output: W,
    /// YaRN's frequency factors (`config::Yarn::freq_factors`), if any.
    pub rope_factors: Option<Vec<f32>>,
}

/// Tensors of one layer (`.weight` and, for most, `.bias`).
const LAYER_WEIGHTS: [&str; 11] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_sinks",
    "post_attention_norm",
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
];
const LAYER_BIASES: [&str; 8] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
];

fn moe_config(cfg: &ModelConfig) -> Result<MoeConfig, GraphError> {
    cfg.moe
        .ok_or_else(|| GraphError::Unsupported("gpt-oss without expert keys".into()))
}

impl<W> GptOssWeights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, _file: &GgufFile) -> Vec<String> {
        let mut names: Vec<String> = ["token_embd.weight", "output_norm.weight", "output.weight"]
            .map(String::from)
            .to_vec();
        for i in 0..cfg.n_layer {
            names.extend(LAYER_WEIGHTS.iter().map(|n| format!("blk.{i}.{n}.weight")));
            names.extend(LAYER_BIASES.iter().map(|n| format!("blk.{i}.{n}.bias")));
        }
        names
    }

    /// Binds every tensor through `upload`, checking each one's shape first.
    pub fn load<E: From<GraphError>>(
        cfg: &ModelConfig,
        file: &GgufFile,
        upload: &mut Upload<'_, W, E>,
    ) -> Result<Self, E> {
        let moe = moe_config(cfg)?;
        check_layer_count(cfg, file, (LAYER_WEIGHTS.len() + LAYER_BIASES.len()) as u64)?;
        let mut b = Binder { file, upload };
        let (d, v, qd, kvd) = (cfg.n_embd, cfg.vocab_size, cfg.q_dim(), cfg.kv_dim());
        let (x, ff) = (moe.count, moe.n_ff);
        let token_embd = b.get("token_embd.weight", v, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let w = |s: &str| format!("blk.{i}.{s}.weight");
            let bias = |s: &str| format!("blk.{i}.{s}.bias");
            layers.push(GptOssLayer {
                attn_norm: b.get(&w("attn_norm"), 1, d)?,
                wq: b.get(&w("attn_q"), qd, d)?,
                bq: b.get(&bias("attn_q"), 1, qd)?,
                wk: b.get(&w("attn_k"), kvd, d)?,
                bk: b.get(&bias("attn_k"), 1, kvd)?,
                wv: b.get(&w("attn_v"), kvd, d)?,
                bv: b.get(&bias("attn_v"), 1, kvd)?,
                wo: b.get(&w("attn_output"), d, qd)?,
                bo: b.get(&bias("attn_output"), 1, d)?,
                sinks: b.get(&w("attn_sinks"), 1, cfg.n_head)?,
                post_attention_norm: b.get(&w("post_attention_norm"), 1, d)?,
                router: b.get(&w("ffn_gate_inp"), x, d)?,
                router_bias: b.get(&bias("ffn_gate_inp"), 1, x)?,
                gate: b.experts(&w("ffn_gate_exps"), x, ff, d)?,
                gate_bias: b.get(&bias("ffn_gate_exps"), x, ff)?,
                up: b.experts(&w("ffn_up_exps"), x, ff, d)?,
                up_bias: b.get(&bias("ffn_up_exps"), x, ff)?,
                down: b.experts(&w("ffn_down_exps"), x, d, ff)?,
                down_bias: b.get(&bias("ffn_down_exps"), x, d)?,
            });
        }
        let output_norm = b.get("output_norm.weight", 1, d)?;
        let output = b.get("output.weight", v, d)?;
        Ok(GptOssWeights {
            token_embd,
            layers,
            output_norm,
            output,
            rope_factors: parts::rope_factors(cfg, file)?,
        })
    }
}

/// The gpt-oss graph for one pass (see [`crate::model::forward`]).
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &GptOssWeights<O::Weight>,
    cache: &mut O::Cache,
    mut pass: Pass<'_>,
) -> Result<(), O::Error> {
    let moe = moe_config(cfg)?;
    let (tokens, start_pos, n) = (pass.tokens, pass.start_pos, pass.tokens.len());
    let (d, qd, kvd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());

    let mut x = ops.buf(n, d)?;
    ops.embed(&w.token_embd, tokens, &mut x)?;
    pass.rec.record(ops, "inp_embd", &x)?;

    let mut h = ops.buf(n, d)?;
    let mut q = ops.buf(n, qd)?;
    let mut k = ops.buf(n, kvd)?;
    let mut v = ops.buf(n, kvd)?;
    let mut attn = ops.buf(n, qd)?;
    let mut proj = ops.buf(n, d)?;
    let mut router = ops.buf(n, moe.count)?;
    let rope = |n_head| parts::rope_params(cfg, n_head, start_pos, w.rope_factors.as_deref());

    if let Some(first) = w.layers.first() {
        ops.rms_norm(&x, &first.attn_norm, cfg.norm_eps, &mut h)?;
    }
    for (il, l) in w.layers.iter().enumerate() {
        ops.matmuls(
            &h,
            &mut [
                Product {
                    w: &l.wq,
                    bias: Some(&l.bq),
                    out: &mut q,
                },
                Product {
                    w: &l.wk,
                    bias: Some(&l.bk),
                    out: &mut k,
                },
                Product {
                    w: &l.wv,
                    bias: Some(&l.bv),
                    out: &mut v,
                },
            ],
        )?;
        ops.rope_qk(&mut q, &mut k, rope(cfg.n_head), rope(cfg.n_head_kv))?;
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        ops.attention_sinks(&q, &k, &v, cache, shape, &l.sinks, &mut attn)?;
        ops.matmul(&attn, &l.wo, Some(&l.bo), &mut proj)?;
        ops.add_rms_norm(&mut x, &proj, &l.post_attention_norm, cfg.norm_eps, &mut h)?;

        ops.matmul(&h, &l.router, Some(&l.router_bias), &mut router)?;
        pass.rec
            .record(ops, &format!("ffn_moe_logits-{il}"), &router)?;
        let experts = MoeWeights {
            gate: &l.gate,
            gate_bias: &l.gate_bias,
            up: &l.up,
            up_bias: &l.up_bias,
            down: &l.down,
            down_bias: &l.down_bias,
            experts: moe.count,
            used: moe.used,
        };
        ops.moe(&h, &router, experts, &mut proj)?;
        match w.layers.get(il + 1) {
            Some(next) => ops.add_rms_norm(&mut x, &proj, &next.attn_norm, cfg.norm_eps, &mut h)?,
            None => ops.add_assign(&mut x, &proj)?,
        }
        pass.rec.record(ops, &format!("l_out-{il}"), &x)?;
    }

    lm_head(ops, cfg, x, FinalNorm::Rms(&w.output_norm), &w.output, pass)
}
