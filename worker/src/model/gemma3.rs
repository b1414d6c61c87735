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
use crate::model::ops::{AttentionShape, GraphError, HeadNorms, Ops, QkPrep};
use crate::model::parts::{
    self, Binder, GatedFfn, Glu, GluBufs, LayerTensors, Pass, Qkv, Stream, Trunk, GATED_FFN, QKV,
};

/// One transformer block's weights.
pub struct Gemma3Layer<W> {
    pub attn_norm: W,
    pub qkv: Qkv<W>,
    /// `[head_dim]`, applied to each Q head.
    pub q_norm: W,
    /// `[head_dim]`, applied to each K head.
    pub k_norm: W,
    pub wo: W,
    pub post_attn_norm: W,
    pub ffn_norm: W,
    pub ffn: GatedFfn<W>,
    pub post_ffn_norm: W,
}

/// All weights of a Gemma 3 model.
pub struct Gemma3Weights<W> {
    pub trunk: Trunk<W, Gemma3Layer<W>>,
}

/// Per-layer tensors: the llama block's, with the per-head norms and a
/// norm after each block.
const LAYER: [LayerTensors; 5] = [
    LayerTensors::weights(&["attn_norm"]),
    LayerTensors::weights(&QKV),
    LayerTensors::weights(&[
        "attn_q_norm",
        "attn_k_norm",
        "attn_output",
        "post_attention_norm",
        "ffn_norm",
    ]),
    LayerTensors::weights(&GATED_FFN),
    LayerTensors::weights(&["post_ffw_norm"]),
];

impl<W> Gemma3Weights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        parts::tensor_names(cfg, file, &[], &LAYER)
    }

    /// Binds every tensor, checking each one's shape first.
    pub fn load<E: From<GraphError>>(b: &mut Binder<'_, '_, W, E>) -> Result<Self, E> {
        let cfg = b.cfg;
        let (d, hd, qd) = (cfg.n_embd, cfg.head_dim, cfg.q_dim());
        let trunk = b.trunk(&LAYER, |b, blk| {
            Ok(Gemma3Layer {
                attn_norm: b.get(&blk.weight("attn_norm"), 1, d)?,
                qkv: Qkv::bind(b, blk, false)?,
                q_norm: b.get(&blk.weight("attn_q_norm"), 1, hd)?,
                k_norm: b.get(&blk.weight("attn_k_norm"), 1, hd)?,
                wo: b.get(&blk.weight("attn_output"), d, qd)?,
                post_attn_norm: b.get(&blk.weight("post_attention_norm"), 1, d)?,
                ffn_norm: b.get(&blk.weight("ffn_norm"), 1, d)?,
                ffn: GatedFfn::bind(b, blk)?,
                post_ffn_norm: b.get(&blk.weight("post_ffw_norm"), 1, d)?,
            })
        })?;
        Ok(Gemma3Weights { trunk })
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
    let (start_pos, n) = (pass.start_pos, pass.tokens.len());
    let (d, eps) = (cfg.n_embd, cfg.norm_eps);
    let mut x = parts::embed(ops, cfg, &w.trunk.token_embd, &mut pass)?;
    ops.scale(&mut x, (d as f32).sqrt())?;
    pass.rec.record(ops, "inp_scaled", &x)?;

    let mut s = Stream::new(ops, x)?;
    let mut a = parts::AttnBufs::new(ops, cfg, n)?;
    let mut normed = ops.buf(n, d)?;
    let mut f = GluBufs::new(ops, n, cfg.n_ff)?;
    let scale = attention_scale(cfg);
    let layers = &w.trunk.layers;

    s.first_norm(ops, cfg, layers.first().map(|l| &l.attn_norm))?;
    for (il, l) in layers.iter().enumerate() {
        ops.matmuls(&s.h, &mut l.qkv.products(&mut a.q, &mut a.k, &mut a.v))?;
        let shape = AttentionShape {
            scale,
            ..parts::attention_shape(cfg, il, start_pos, n)
        };
        let prep = QkPrep {
            norms: Some(HeadNorms {
                q: &l.q_norm,
                k: &l.k_norm,
                eps,
            }),
            rope: Some(parts::rope_pair(cfg, il, start_pos, None)),
        };
        ops.attend(&mut a.q, &mut a.k, &a.v, prep, cache, shape, &mut a.attn)?;
        ops.matmul(&a.attn, &l.wo, None, &mut a.proj)?;
        let (x, h) = (&mut s.x, &mut s.h);
        ops.norm_add_rms_norm(x, &a.proj, &l.post_attn_norm, &l.ffn_norm, eps, h)?;

        parts::gated_ffn(ops, h, &l.ffn, Glu::GeGlu, &mut f, &mut a.proj)?;
        match layers.get(il + 1) {
            Some(next) => {
                ops.norm_add_rms_norm(x, &a.proj, &l.post_ffn_norm, &next.attn_norm, eps, h)?
            }
            None => {
                ops.rms_norm(&a.proj, &l.post_ffn_norm, eps, &mut normed)?;
                ops.add_assign(x, &normed)?
            }
        }
        pass.rec.layer_out(ops, il, x)?;
    }
    parts::lm_head(ops, cfg, s.x, &w.trunk, pass)
}
