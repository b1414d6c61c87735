//! Gemma 3 (`gemma3`): GGUF tensor names, shapes, and the forward pass,
//! following llama.cpp's `llama_model_gemma3` graph.
//!
//! Differences from the llama family: embeddings scaled by `sqrt(n_embd)`;
//! RMSNorm on each head of Q and K before RoPE; RMSNorm on the attention and
//! feed-forward outputs before their residual adds; a GELU-gated feed-forward
//! (GeGLU); heads wider than `n_embd / n_head` (`attention.key_length`); and
//! local layers, five of every six, that attend through a sliding window with
//! their own RoPE base, between global layers that see everything. The LM
//! head is tied to the embeddings unless the file has `output.weight`.

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{AttentionShape, GraphError, HeadNorms, Ops, Product, QkPrep, RopeParams};
use crate::model::parts::{self, check_layer_count, lm_head, Binder, FinalNorm, Pass, Upload};

/// One transformer block's weights.
pub struct Gemma3Layer<W> {
    pub attn_norm: W,
    pub wq: W,
    pub wk: W,
    pub wv: W,
    /// `[head_dim]`, applied to each Q head.
    pub q_norm: W,
    /// `[head_dim]`, applied to each K head.
    pub k_norm: W,
    pub wo: W,
    pub post_attn_norm: W,
    pub ffn_norm: W,
    pub ffn_gate: W,
    pub ffn_up: W,
    pub ffn_down: W,
    pub post_ffn_norm: W,
}

/// All weights of a Gemma 3 model.
pub struct Gemma3Weights<W> {
    pub token_embd: W,
    pub layers: Vec<Gemma3Layer<W>>,
    pub output_norm: W,
    /// `None` when the LM head is tied to `token_embd`.
    pub output: Option<W>,
}

/// Per-layer tensor names (without `blk.N.` and `.weight`).
const LAYER_TENSORS: [&str; 13] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_q_norm",
    "attn_k_norm",
    "attn_output",
    "post_attention_norm",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "post_ffw_norm",
];

impl<W> Gemma3Weights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        parts::tensor_names(
            cfg,
            file,
            &["token_embd.weight", "output_norm.weight"],
            &LAYER_TENSORS,
            &["weight"],
        )
    }

    /// Binds every tensor through `upload`, checking each one's shape first.
    pub fn load<E: From<GraphError>>(
        cfg: &ModelConfig,
        file: &GgufFile,
        upload: &mut Upload<'_, W, E>,
    ) -> Result<Self, E> {
        check_layer_count(cfg, file, LAYER_TENSORS.len() as u64)?;
        let mut b = Binder { file, upload };
        let (d, v, ff, hd) = (cfg.n_embd, cfg.vocab_size, cfg.n_ff, cfg.head_dim);
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let token_embd = b.get("token_embd.weight", v, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Gemma3Layer {
                attn_norm: b.get(&n("attn_norm"), 1, d)?,
                wq: b.get(&n("attn_q"), qd, d)?,
                wk: b.get(&n("attn_k"), kvd, d)?,
                wv: b.get(&n("attn_v"), kvd, d)?,
                q_norm: b.get(&n("attn_q_norm"), 1, hd)?,
                k_norm: b.get(&n("attn_k_norm"), 1, hd)?,
                wo: b.get(&n("attn_output"), d, qd)?,
                post_attn_norm: b.get(&n("post_attention_norm"), 1, d)?,
                ffn_norm: b.get(&n("ffn_norm"), 1, d)?,
                ffn_gate: b.get(&n("ffn_gate"), ff, d)?,
                ffn_up: b.get(&n("ffn_up"), ff, d)?,
                ffn_down: b.get(&n("ffn_down"), d, ff)?,
                post_ffn_norm: b.get(&n("post_ffw_norm"), 1, d)?,
            });
        }
        let output_norm = b.get("output_norm.weight", 1, d)?;
        let output = b.optional("output.weight", v, d)?;
        Ok(Gemma3Weights {
            token_embd,
            layers,
            output_norm,
            output,
        })
    }
}

/// The factor on `q . k`: `1 / sqrt(head_dim)`, except for the 27B model
/// (62 layers), which Google scales by `1 / sqrt(n_embd / n_head)`
/// (llama.cpp picks it by the layer count, and so do we).
fn attention_scale(cfg: &ModelConfig) -> f32 {
    let width = if cfg.n_layer == 62 {
        cfg.n_embd / cfg.n_head
    } else {
        cfg.head_dim
    };
    1.0 / (width as f32).sqrt()
}

/// The gemma3 graph for one pass (see [`crate::model::forward`]).
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &Gemma3Weights<O::Weight>,
    cache: &mut O::Cache,
    mut pass: Pass<'_>,
) -> Result<(), O::Error> {
    let (tokens, start_pos, n) = (pass.tokens, pass.start_pos, pass.tokens.len());
    let (d, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);

    let mut x = ops.buf(n, d)?;
    ops.embed(&w.token_embd, tokens, &mut x)?;
    pass.rec.record(ops, "inp_embd", &x)?;
    ops.scale(&mut x, (d as f32).sqrt())?;
    pass.rec.record(ops, "inp_scaled", &x)?;

    let mut h = ops.buf(n, d)?;
    let mut q = ops.buf(n, qd)?;
    let mut k = ops.buf(n, kvd)?;
    let mut v = ops.buf(n, kvd)?;
    let mut attn = ops.buf(n, qd)?;
    let mut proj = ops.buf(n, d)?;
    let mut normed = ops.buf(n, d)?;
    let mut gate = ops.buf(n, ff)?;
    let mut up = ops.buf(n, ff)?;
    let mut act = ops.buf(n, ff)?;
    let scale = attention_scale(cfg);

    if let Some(first) = w.layers.first() {
        ops.rms_norm(&x, &first.attn_norm, cfg.norm_eps, &mut h)?;
    }
    for (il, l) in w.layers.iter().enumerate() {
        ops.matmuls(
            &h,
            &mut [
                Product {
                    w: &l.wq,
                    bias: None,
                    out: &mut q,
                },
                Product {
                    w: &l.wk,
                    bias: None,
                    out: &mut k,
                },
                Product {
                    w: &l.wv,
                    bias: None,
                    out: &mut v,
                },
            ],
        )?;
        let window = cfg.window(il);
        let rope = |n_head| RopeParams {
            n_head,
            head_dim: cfg.head_dim,
            n_rot: cfg.n_rot,
            start_pos,
            freq_base: cfg.rope_base(il),
            // Local layers keep their trained positions (llama.cpp's
            // `rope_freq_scale_train_swa`, 1); global ones take the file's scaling.
            freq_scale: if window.is_some() {
                1.0
            } else {
                cfg.rope_freq_scale
            },
            style: cfg.rope_style(),
            freq_factors: None,
            mscale: cfg.rope_attn_factor,
        };
        let shape = AttentionShape {
            layer: il,
            start_pos,
            n_tokens: n,
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            window,
            scale,
        };
        let prep = QkPrep {
            norms: Some(HeadNorms {
                q: &l.q_norm,
                k: &l.k_norm,
                eps: cfg.norm_eps,
            }),
            rope: Some((rope(cfg.n_head), rope(cfg.n_head_kv))),
        };
        ops.attend(&mut q, &mut k, &v, prep, cache, shape, &mut attn)?;
        ops.matmul(&attn, &l.wo, None, &mut proj)?;
        let eps = cfg.norm_eps;
        ops.norm_add_rms_norm(&mut x, &proj, &l.post_attn_norm, &l.ffn_norm, eps, &mut h)?;

        ops.matmuls(
            &h,
            &mut [
                Product {
                    w: &l.ffn_gate,
                    bias: None,
                    out: &mut gate,
                },
                Product {
                    w: &l.ffn_up,
                    bias: None,
                    out: &mut up,
                },
            ],
        )?;
        ops.geglu(&gate, &up, &mut act)?;
        ops.matmul(&act, &l.ffn_down, None, &mut proj)?;
        match w.layers.get(il + 1) {
            Some(next) => ops.norm_add_rms_norm(
                &mut x,
                &proj,
                &l.post_ffn_norm,
                &next.attn_norm,
                eps,
                &mut h,
            )?,
            None => {
                ops.rms_norm(&proj, &l.post_ffn_norm, eps, &mut normed)?;
                ops.add_assign(&mut x, &normed)?
            }
        }
        pass.rec.record(ops, &format!("l_out-{il}"), &x)?;
    }

    let head = w.output.as_ref().unwrap_or(&w.token_embd);
    lm_head(ops, cfg, x, FinalNorm::Rms(&w.output_norm), head, pass)
}
