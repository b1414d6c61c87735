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
use crate::model::parts::{self, check_layer_count, lm_head, Binder, FinalNorm, Pass, Upload};

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
    pub token_embd: W,
    pub layers: Vec<Phi3Layer<W>>,
    pub output_norm: W,
    /// `None` when the LM head is tied to `token_embd`.
    pub output: Option<W>,
    /// LongRoPE's frequency factors for the served context, on the host.
    pub rope_factors: Option<Vec<f32>>,
}

const LAYER_TENSORS: [&str; 6] = [
    "attn_norm",
    "attn_qkv",
    "attn_output",
    "ffn_norm",
    "ffn_up",
    "ffn_down",
];

impl<W> Phi3Weights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        let mut names = parts::tensor_names(
            cfg,
            file,
            &["token_embd.weight", "output_norm.weight"],
            &LAYER_TENSORS,
            &["weight"],
        );
        names.extend(parts::rope_factor_names(file));
        names
    }

    /// Binds every tensor through `upload`, checking each one's shape first,
    /// and reads the LongRoPE factors the served context uses.
    pub fn load<E: From<GraphError>>(
        cfg: &ModelConfig,
        file: &GgufFile,
        upload: &mut Upload<'_, W, E>,
    ) -> Result<Self, E> {
        check_layer_count(cfg, file, LAYER_TENSORS.len() as u64)?;
        let mut b = Binder { file, upload };
        let (d, v, ff) = (cfg.n_embd, cfg.vocab_size, cfg.n_ff);
        let qkv = cfg.q_dim() + 2 * cfg.kv_dim();
        let token_embd = b.get("token_embd.weight", v, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Phi3Layer {
                attn_norm: b.get(&n("attn_norm"), 1, d)?,
                wqkv: b.get(&n("attn_qkv"), qkv, d)?,
                wo: b.get(&n("attn_output"), d, cfg.q_dim())?,
                ffn_norm: b.get(&n("ffn_norm"), 1, d)?,
                ffn_up: b.get(&n("ffn_up"), 2 * ff, d)?,
                ffn_down: b.get(&n("ffn_down"), d, ff)?,
            });
        }
        let output_norm = b.get("output_norm.weight", 1, d)?;
        let output = b.optional("output.weight", v, d)?;
        Ok(Phi3Weights {
            token_embd,
            layers,
            output_norm,
            output,
            rope_factors: parts::rope_factors(cfg, file)?,
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
    let (tokens, start_pos, n) = (pass.tokens, pass.start_pos, pass.tokens.len());
    let (d, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);

    let mut x = ops.buf(n, d)?;
    ops.embed(&w.token_embd, tokens, &mut x)?;
    pass.rec.record(ops, "inp_embd", &x)?;

    let mut h = ops.buf(n, d)?;
    let mut qkv = ops.buf(n, qd + 2 * kvd)?;
    let mut q = ops.buf(n, qd)?;
    let mut k = ops.buf(n, kvd)?;
    let mut v = ops.buf(n, kvd)?;
    let mut attn = ops.buf(n, qd)?;
    let mut proj = ops.buf(n, d)?;
    let mut gate_up = ops.buf(n, 2 * ff)?;
    let mut gate = ops.buf(n, ff)?;
    let mut up = ops.buf(n, ff)?;
    let mut act = ops.buf(n, ff)?;
    let rope = |n_head| parts::rope_params(cfg, n_head, start_pos, w.rope_factors.as_deref());

    if let Some(first) = w.layers.first() {
        ops.rms_norm(&x, &first.attn_norm, cfg.norm_eps, &mut h)?;
    }
    for (il, l) in w.layers.iter().enumerate() {
        ops.matmul(&h, &l.wqkv, None, &mut qkv)?;
        ops.copy_cols(&qkv, 0, &mut q)?;
        ops.copy_cols(&qkv, qd, &mut k)?;
        ops.copy_cols(&qkv, qd + kvd, &mut v)?;
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        let prep = QkPrep {
            norms: None,
            rope: Some((rope(cfg.n_head), rope(cfg.n_head_kv))),
        };
        ops.attend(&mut q, &mut k, &v, prep, cache, shape, &mut attn)?;
        ops.matmul(&attn, &l.wo, None, &mut proj)?;
        ops.add_rms_norm(&mut x, &proj, &l.ffn_norm, cfg.norm_eps, &mut h)?;

        ops.matmul(&h, &l.ffn_up, None, &mut gate_up)?;
        ops.copy_cols(&gate_up, 0, &mut gate)?;
        ops.copy_cols(&gate_up, ff, &mut up)?;
        ops.swiglu(&gate, &up, &mut act)?;
        ops.matmul(&act, &l.ffn_down, None, &mut proj)?;
        match w.layers.get(il + 1) {
            Some(next) => ops.add_rms_norm(&mut x, &proj, &next.attn_norm, cfg.norm_eps, &mut h)?,
            None => ops.add_assign(&mut x, &proj)?,
        }
        pass.rec.record(ops, &format!("l_out-{il}"), &x)?;
    }

    let head = w.output.as_ref().unwrap_or(&w.token_embd);
    let norm = FinalNorm::Rms(&w.output_norm);
    lm_head(ops, cfg, x, norm, head, pass)
}
