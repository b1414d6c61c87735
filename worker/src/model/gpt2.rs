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
use crate::model::parts::{self, check_layer_count, lm_head, Binder, FinalNorm, Pass, Upload};

/// A weight and its bias.
pub struct Affine<W> {
    pub weight: W,
    pub bias: W,
}

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
    pub token_embd: W,
    /// `[positions, n_embd]`.
    pub position_embd: W,
    pub layers: Vec<Gpt2Layer<W>>,
    pub output_norm: Affine<W>,
    /// `None` when the LM head is tied to `token_embd`.
    pub output: Option<W>,
}

const LAYER_TENSORS: [&str; 6] = [
    "attn_norm",
    "attn_qkv",
    "attn_output",
    "ffn_norm",
    "ffn_up",
    "ffn_down",
];

impl<W> Gpt2Weights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        let top = [
            "token_embd.weight",
            "position_embd.weight",
            "output_norm.weight",
            "output_norm.bias",
        ];
        parts::tensor_names(cfg, file, &top, &LAYER_TENSORS, &["weight", "bias"])
    }

    /// Binds every tensor through `upload`, checking each one's shape first.
    pub fn load<E: From<GraphError>>(
        cfg: &ModelConfig,
        file: &GgufFile,
        upload: &mut Upload<'_, W, E>,
    ) -> Result<Self, E> {
        check_layer_count(cfg, file, 2 * LAYER_TENSORS.len() as u64)?;
        let positions = match file
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
        let mut b = Binder { file, upload };
        let (d, v, ff) = (cfg.n_embd, cfg.vocab_size, cfg.n_ff);
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        // A norm's bias is as long as its weight; a projection's, as its outputs.
        let affine = |b: &mut Binder<'_, '_, W, E>, name: &str, rows: usize, cols: usize| {
            let bias_len = if rows == 1 { cols } else { rows };
            Ok::<_, E>(Affine {
                weight: b.get(&format!("{name}.weight"), rows, cols)?,
                bias: b.get(&format!("{name}.bias"), 1, bias_len)?,
            })
        };
        let token_embd = b.get("token_embd.weight", v, d)?;
        let position_embd = b.get("position_embd.weight", positions, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            layers.push(Gpt2Layer {
                attn_norm: affine(&mut b, &n("attn_norm"), 1, d)?,
                qkv: affine(&mut b, &n("attn_qkv"), qd + 2 * kvd, d)?,
                wo: affine(&mut b, &n("attn_output"), d, qd)?,
                ffn_norm: affine(&mut b, &n("ffn_norm"), 1, d)?,
                ffn_up: affine(&mut b, &n("ffn_up"), ff, d)?,
                ffn_down: affine(&mut b, &n("ffn_down"), d, ff)?,
            });
        }
        let output_norm = affine(&mut b, "output_norm", 1, d)?;
        let output = b.optional("output.weight", v, d)?;
        Ok(Gpt2Weights {
            token_embd,
            position_embd,
            layers,
            output_norm,
            output,
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
    let (tokens, start_pos, n) = (pass.tokens, pass.start_pos, pass.tokens.len());
    let (d, qd, kvd, ff, eps) = (
        cfg.n_embd,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.n_ff,
        cfg.norm_eps,
    );

    let mut x = ops.buf(n, d)?;
    let mut h = ops.buf(n, d)?;
    ops.embed(&w.token_embd, tokens, &mut x)?;
    pass.rec.record(ops, "inp_embd", &x)?;
    ops.embed_positions(&w.position_embd, start_pos, &mut h)?;
    ops.add_assign(&mut x, &h)?;
    pass.rec.record(ops, "inpL", &x)?;

    let mut qkv = ops.buf(n, qd + 2 * kvd)?;
    let mut q = ops.buf(n, qd)?;
    let mut k = ops.buf(n, kvd)?;
    let mut v = ops.buf(n, kvd)?;
    let mut attn = ops.buf(n, qd)?;
    let mut proj = ops.buf(n, d)?;
    let mut up = ops.buf(n, ff)?;
    let mut act = ops.buf(n, ff)?;
    let norm = |ops: &mut O, x: &O::Buf, a: &Affine<O::Weight>, out: &mut O::Buf| {
        ops.layer_norm(x, &a.weight, Some(&a.bias), eps, out)
    };
    for (il, l) in w.layers.iter().enumerate() {
        norm(ops, &x, &l.attn_norm, &mut h)?;
        ops.matmul(&h, &l.qkv.weight, Some(&l.qkv.bias), &mut qkv)?;
        ops.copy_cols(&qkv, 0, &mut q)?;
        ops.copy_cols(&qkv, qd, &mut k)?;
        ops.copy_cols(&qkv, qd + kvd, &mut v)?;
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        ops.attention(&q, &k, &v, cache, shape, &mut attn)?;
        ops.matmul(&attn, &l.wo.weight, Some(&l.wo.bias), &mut proj)?;
        ops.add_assign(&mut x, &proj)?;

        norm(ops, &x, &l.ffn_norm, &mut h)?;
        ops.matmul(&h, &l.ffn_up.weight, Some(&l.ffn_up.bias), &mut up)?;
        ops.gelu(&up, &mut act)?;
        ops.matmul(&act, &l.ffn_down.weight, Some(&l.ffn_down.bias), &mut proj)?;
        ops.add_assign(&mut x, &proj)?;
        pass.rec.record(ops, &format!("l_out-{il}"), &x)?;
    }

    let head = w.output.as_ref().unwrap_or(&w.token_embd);
    let norm = FinalNorm::Layer(&w.output_norm.weight, &w.output_norm.bias);
    lm_head(ops, cfg, x, norm, head, pass)
}
