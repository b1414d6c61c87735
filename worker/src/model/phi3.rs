//! Phi-3 (`phi3`): GGUF tensor names, shapes, and the forward pass,
//! following llama.cpp's `llama_model_phi3` graph.
//!
//! The llama block with two fused projections: `attn_qkv` holds Q, K and V
//! one after another, and `ffn_up` holds the SwiGLU's gate then its up
//! projection; NEOX RoPE over `rope.dimension_count` dimensions, with
//! LongRoPE's frequency factors and `rope.scaling.attn_factor` where the file
//! has them (Phi-3 128k, Phi-3.5: `parts::rope_factors` picks the table); and, where
//! the file sets `attention.sliding_window`, every layer attends through that
//! window (see `config::sliding_window`).

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{GraphError, Ops, QkPrep};
use crate::model::parts::{
    self, Binder, Glu, GluBufs, LayerTensors, Pass, Stream, Trunk, FUSED_LAYER,
};

/// One transformer block's weights.
pub struct Phi3Layer<W> {
    pub attn_norm: W,
    /// `[q_dim + 2 kv_dim, n_embd]`: Q, K, V.
    pub wqkv: W,
    pub wo: W,
    pub ffn_norm: W,
    /// `[2 n_ff, n_embd]`: gate, then up.
    pub ffn_up: W,
    pub ffn_down: W,
}

/// All weights of a Phi-3 model.
pub struct Phi3Weights<W> {
    pub trunk: Trunk<W, Phi3Layer<W>>,
    /// LongRoPE's frequency factors for the served context, on the host.
    pub rope_factors: Option<Vec<f32>>,
}

/// Every layer's tensors: the fused block's six weights.
const LAYER: [LayerTensors; 1] = [LayerTensors::weights(&FUSED_LAYER)];

impl<W> Phi3Weights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        let mut names = parts::tensor_names(cfg, file, &[], &LAYER);
        names.extend(parts::rope_factor_names(file));
        names
    }

    /// Binds every tensor, checking each one's shape first, and reads the
    /// LongRoPE factors the served context uses.
    pub fn load<E: From<GraphError>>(b: &mut Binder<'_, '_, W, E>) -> Result<Self, E> {
        let cfg = b.cfg;
        let (d, qd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.n_ff);
        let qkv = qd + 2 * cfg.kv_dim();
        let trunk = b.trunk(&LAYER, |b, blk| {
            Ok(Phi3Layer {
                attn_norm: b.get(&blk.weight("attn_norm"), 1, d)?,
                wqkv: b.get(&blk.weight("attn_qkv"), qkv, d)?,
                wo: b.get(&blk.weight("attn_output"), d, qd)?,
                ffn_norm: b.get(&blk.weight("ffn_norm"), 1, d)?,
                ffn_up: b.get(&blk.weight("ffn_up"), 2 * ff, d)?,
                ffn_down: b.get(&blk.weight("ffn_down"), d, ff)?,
            })
        })?;
        let rope_factors = parts::rope_factors(cfg, b.file)?;
        Ok(Phi3Weights {
            trunk,
            rope_factors,
        })
    }
}

/// The phi3 graph for one pass (see [`crate::model::forward`]).
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &Phi3Weights<O::Weight>,
    cache: &mut O::Cache,
    mut pass: Pass<'_>,
) -> Result<(), O::Error> {
    let (start_pos, n, ff) = (pass.start_pos, pass.tokens.len(), cfg.n_ff);
    let x = parts::embed(ops, cfg, &w.trunk.token_embd, &mut pass)?;
    let mut s = Stream::new(ops, x)?;
    let mut qkv = ops.buf(n, cfg.q_dim() + 2 * cfg.kv_dim())?;
    let mut a = parts::AttnBufs::new(ops, cfg, n)?;
    let mut gate_up = ops.buf(n, 2 * ff)?;
    let mut f = GluBufs::new(ops, n, ff)?;
    let layers = &w.trunk.layers;

    s.first_norm(ops, cfg, layers.first().map(|l| &l.attn_norm))?;
    for (il, l) in layers.iter().enumerate() {
        ops.matmul(&s.h, &l.wqkv, None, &mut qkv)?;
        parts::split_qkv(ops, cfg, &qkv, &mut a)?;
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        let rope = parts::rope_pair(cfg, il, start_pos, w.rope_factors.as_deref());
        let prep = QkPrep {
            norms: None,
            rope: Some(rope),
        };
        ops.attend(&mut a.q, &mut a.k, &a.v, prep, cache, shape, &mut a.attn)?;
        ops.matmul(&a.attn, &l.wo, None, &mut a.proj)?;
        ops.add_rms_norm(&mut s.x, &a.proj, &l.ffn_norm, cfg.norm_eps, &mut s.h)?;

        ops.matmul(&s.h, &l.ffn_up, None, &mut gate_up)?;
        ops.copy_cols(&gate_up, 0, &mut f.gate)?;
        ops.copy_cols(&gate_up, ff, &mut f.up)?;
        parts::glu_down(ops, Glu::SwiGlu, &mut f, &l.ffn_down, &mut a.proj)?;
        let next = layers.get(il + 1).map(|l| &l.attn_norm);
        parts::end_layer(ops, cfg, &mut pass.rec, il, &mut s, &a.proj, next)?;
    }
    parts::lm_head(ops, cfg, s.x, &w.trunk, pass)
}
