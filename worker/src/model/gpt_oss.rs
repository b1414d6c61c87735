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
use crate::model::ops::{ExpertAct, GraphError, MoeWeights, Ops};
use crate::model::parts::{self, Binder, LayerTensors, Pass, Qkv, Stream, Trunk, QKV};

/// One transformer block's weights.
pub struct GptOssLayer<W> {
    pub attn_norm: W,
    /// Q, K and V, each with its bias.
    pub qkv: Qkv<W>,
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

/// All weights of a gpt-oss model. Its LM head is never tied: the load
/// refuses a file without `output.weight`.
pub struct GptOssWeights<W> {
    pub trunk: Trunk<W, GptOssLayer<W>>,
    /// YaRN's frequency factors (`config::Yarn::freq_factors`), if any.
    pub rope_factors: Option<Vec<f32>>,
}

/// The experts' matrices, each with a bias.
const EXPERTS: [&str; 3] = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];

/// Tensors of one layer: every `.weight`, then the `.bias`es.
const LAYER: [LayerTensors; 7] = [
    LayerTensors::weights(&["attn_norm"]),
    LayerTensors::weights(&QKV),
    LayerTensors::weights(&[
        "attn_output",
        "attn_sinks",
        "post_attention_norm",
        "ffn_gate_inp",
    ]),
    LayerTensors::weights(&EXPERTS),
    LayerTensors::biases(&QKV),
    LayerTensors::biases(&["attn_output", "ffn_gate_inp"]),
    LayerTensors::biases(&EXPERTS),
];

fn moe_config(cfg: &ModelConfig) -> Result<MoeConfig, GraphError> {
    cfg.moe
        .ok_or_else(|| GraphError::Unsupported("gpt-oss without expert keys".into()))
}

impl<W> GptOssWeights<W> {
    /// Every tensor name this architecture reads.
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        parts::tensor_names(cfg, file, &[], &LAYER)
    }

    /// Binds every tensor, checking each one's shape first.
    pub fn load<E: From<GraphError>>(b: &mut Binder<'_, '_, W, E>) -> Result<Self, E> {
        let cfg = b.cfg;
        let moe = moe_config(cfg)?;
        let (d, qd, x, ff) = (cfg.n_embd, cfg.q_dim(), moe.count, moe.n_ff);
        let trunk = b.trunk(&LAYER, |b, blk| {
            let (w, bias) = (|s: &str| blk.weight(s), |s: &str| blk.bias(s));
            Ok(GptOssLayer {
                attn_norm: b.get(&w("attn_norm"), 1, d)?,
                qkv: Qkv::bind(b, blk, true)?,
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
            })
        })?;
        if trunk.output.is_none() {
            return Err(GraphError::MissingTensor("output.weight".into()).into());
        }
        let rope_factors = parts::rope_factors(cfg, b.file)?;
        Ok(GptOssWeights {
            trunk,
            rope_factors,
        })
    }
}

impl<W> GptOssLayer<W> {
    /// The experts as [`Ops::moe`] takes them.
    fn experts(&self, moe: MoeConfig) -> MoeWeights<'_, W> {
        MoeWeights {
            gate: &self.gate,
            gate_bias: Some(&self.gate_bias),
            up: &self.up,
            up_bias: Some(&self.up_bias),
            down: &self.down,
            down_bias: Some(&self.down_bias),
            experts: moe.count,
            used: moe.used,
            act: ExpertAct::SwiGluOai,
        }
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
    let (start_pos, n) = (pass.start_pos, pass.tokens.len());
    let x = parts::embed(ops, cfg, &w.trunk.token_embd, &mut pass)?;
    let mut s = Stream::new(ops, x)?;
    let mut a = parts::AttnBufs::new(ops, cfg, n)?;
    let mut router = ops.buf(n, moe.count)?;
    let layers = &w.trunk.layers;

    s.first_norm(ops, cfg, layers.first().map(|l| &l.attn_norm))?;
    for (il, l) in layers.iter().enumerate() {
        ops.matmuls(&s.h, &mut l.qkv.products(&mut a.q, &mut a.k, &mut a.v))?;
        let (pq, pk) = parts::rope_pair(cfg, il, start_pos, w.rope_factors.as_deref());
        ops.rope_qk(&mut a.q, &mut a.k, pq, pk)?;
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        ops.attention_sinks(&a.q, &a.k, &a.v, cache, shape, &l.sinks, &mut a.attn)?;
        ops.matmul(&a.attn, &l.wo, Some(&l.bo), &mut a.proj)?;
        let eps = cfg.norm_eps;
        ops.add_rms_norm(&mut s.x, &a.proj, &l.post_attention_norm, eps, &mut s.h)?;

        ops.matmul(&s.h, &l.router, Some(&l.router_bias), &mut router)?;
        pass.rec
            .record(ops, &format!("ffn_moe_logits-{il}"), &router)?;
        ops.moe(&s.h, &router, l.experts(moe), &mut a.proj)?;
        let next = layers.get(il + 1).map(|l| &l.attn_norm);
        parts::end_layer(ops, cfg, &mut pass.rec, il, &mut s, &a.proj, next)?;
    }
    parts::lm_head(ops, cfg, s.x, &w.trunk, pass)
}
