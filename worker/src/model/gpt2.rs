//! GPT-2 (`gpt2`): GGUF tensor names, shapes, and the forward pass,
//! following llama.cpp's `llama_model_gpt2` graph.
//!
//! Learned position embeddings added to the token embeddings (positions past
//! the table are refused: the model's context must fit it, checked at load);
//! pre-norm blocks with LayerNorm (weight and bias, M0-W-1432); a fused
//! `attn_qkv` projection with bias; multi-head attention without RoPE; a
//! GELU (tanh form, M0-W-1433) feed-forward with biases; a final LayerNorm and
//! the LM head (tied to the embeddings unless the file has `output.weight`).

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{GraphError, Ops};
use crate::model::parts::{self, Affine, Binder, LayerTensors, Pass, Trunk, FUSED_LAYER};

/// One transformer block's weights.
pub struct Gpt2Layer<W> {
    pub attn_norm: Affine<W>,
    /// `[3 n_embd, n_embd]`: Q, K, V.
    pub qkv: Affine<W>,
    pub wo: Affine<W>,
    pub ffn_norm: Affine<W>,
    pub ffn_up: Affine<W>,
    pub ffn_down: Affine<W>,
}

/// All weights of a GPT-2 model.
pub struct Gpt2Weights<W> {
    /// `[positions, n_embd]`.
    pub position_embd: W,
    pub trunk: Trunk<W, Gpt2Layer<W>>,
}

/// Every layer's tensors: the fused block's six, each a weight and a bias.
const LAYER: [LayerTensors; 1] = [LayerTensors {
    names: &FUSED_LAYER,
    suffixes: &["weight", "bias"],
}];

impl<W> Gpt2Weights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        parts::tensor_names(cfg, file, &["position_embd.weight"], &LAYER)
    }

    /// Binds every tensor, checking each one's shape first; the position
    /// table must cover the context.
    pub fn load<E: From<GraphError>>(b: &mut Binder<'_, '_, W, E>) -> Result<Self, E> {
        let cfg = b.cfg;
        let positions = match b
            .file
            .tensor("position_embd.weight")
            .map(|t| t.dims.as_slice())
        {
            Some(&[_, rows]) => usize::try_from(rows).unwrap_or(usize::MAX),
            _ => return Err(GraphError::MissingTensor("position_embd.weight".into()).into()),
        };
        if positions < cfg.context_length {
            return Err(GraphError::Unsupported(format!(
                "position_embd has {positions} positions, fewer than the context of {}",
                cfg.context_length
            ))
            .into());
        }
        let (d, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let position_embd = b.get("position_embd.weight", positions, d)?;
        let trunk = b.trunk(&LAYER, |b, blk| {
            Ok(Gpt2Layer {
                attn_norm: b.affine(&blk.name("attn_norm"), 1, d)?,
                qkv: b.affine(&blk.name("attn_qkv"), qd + 2 * kvd, d)?,
                wo: b.affine(&blk.name("attn_output"), d, qd)?,
                ffn_norm: b.affine(&blk.name("ffn_norm"), 1, d)?,
                ffn_up: b.affine(&blk.name("ffn_up"), ff, d)?,
                ffn_down: b.affine(&blk.name("ffn_down"), d, ff)?,
            })
        })?;
        Ok(Gpt2Weights {
            position_embd,
            trunk,
        })
    }
}

/// The gpt2 graph for one pass (see [`crate::model::forward`]).
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &Gpt2Weights<O::Weight>,
    cache: &mut O::Cache,
    mut pass: Pass<'_>,
) -> Result<(), O::Error> {
    let (start_pos, n, d, eps) = (pass.start_pos, pass.tokens.len(), cfg.n_embd, cfg.norm_eps);

    let mut x = ops.buf(n, d)?;
    let mut h = ops.buf(n, d)?;
    ops.embed(&w.trunk.token_embd, pass.tokens, &mut x)?;
    pass.rec.record(ops, "inp_embd", &x)?;
    ops.embed_positions(&w.position_embd, start_pos, &mut h)?;
    ops.add_assign(&mut x, &h)?;
    pass.rec.record(ops, "inpL", &x)?;

    let mut qkv = ops.buf(n, cfg.q_dim() + 2 * cfg.kv_dim())?;
    let mut a = parts::AttnBufs::new(ops, cfg, n)?;
    let mut up = ops.buf(n, cfg.n_ff)?;
    let mut act = ops.buf(n, cfg.n_ff)?;
    let norm = |ops: &mut O, x: &O::Buf, a: &Affine<O::Weight>, out: &mut O::Buf| {
        ops.layer_norm(x, &a.weight, Some(&a.bias), eps, out)
    };
    let product = |ops: &mut O, x: &O::Buf, a: &Affine<O::Weight>, out: &mut O::Buf| {
        ops.matmul(x, &a.weight, Some(&a.bias), out)
    };
    for (il, l) in w.trunk.layers.iter().enumerate() {
        norm(ops, &x, &l.attn_norm, &mut h)?;
        product(ops, &h, &l.qkv, &mut qkv)?;
        parts::split_qkv(ops, cfg, &qkv, &mut a)?;
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        ops.attention(&a.q, &a.k, &a.v, cache, shape, &mut a.attn)?;
        product(ops, &a.attn, &l.wo, &mut a.proj)?;
        ops.add_assign(&mut x, &a.proj)?;

        norm(ops, &x, &l.ffn_norm, &mut h)?;
        product(ops, &h, &l.ffn_up, &mut up)?;
        ops.gelu(&up, &mut act)?;
        product(ops, &act, &l.ffn_down, &mut a.proj)?;
        ops.add_assign(&mut x, &a.proj)?;
        pass.rec.layer_out(ops, il, &x)?;
    }
    parts::lm_head(ops, cfg, x, &w.trunk, pass)
}
