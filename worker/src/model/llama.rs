//! The llama family (`llama`, `qwen2`, `qwen3`, `qwen3moe`): GGUF tensor
//! names, shapes, and the forward pass, following llama.cpp's `build_llama`,
//! `build_qwen2`, `build_qwen3` and `build_qwen3moe` graphs.
//!
//! Per layer: RMSNorm, Q/K/V projections (+ biases on qwen2), RMSNorm of
//! each head of Q and K on qwen3 and qwen3moe, RoPE in the architecture's
//! style, causal grouped-query attention over the KV cache, output
//! projection, residual; RMSNorm, a SwiGLU feed-forward (on qwen3moe a
//! mixture of SwiGLU experts: `Ops::moe` over an unbiased router's logits),
//! residual. Then `output_norm` and the LM head (`output`, or the tied
//! `token_embd`).

use crate::gguf::GgufFile;
use crate::model::config::{ModelConfig, MoeConfig};
use crate::model::ops::{ExpertAct, GraphError, HeadNorms, MoeWeights, Ops, QkPrep};
use crate::model::parts::{
    self, Binder, GatedFfn, Glu, GluBufs, LayerTensors, Pass, Qkv, Stream, Trunk, GATED_FFN, QKV,
};

/// One transformer block's weights.
pub struct LayerWeights<W> {
    pub attn_norm: W,
    /// Q, K and V, with qwen2's biases.
    pub qkv: Qkv<W>,
    /// qwen3's `[head_dim]` norms of each Q head and each K head.
    pub qk_norm: Option<(W, W)>,
    pub wo: W,
    pub ffn_norm: W,
    pub ffn: Ffn<W>,
}

/// A layer's feed-forward: dense, or qwen3moe's experts.
pub enum Ffn<W> {
    Dense(GatedFfn<W>),
    Experts(Experts<W>),
}

/// qwen3moe's router (`[experts, n_embd]`, no bias) and its experts'
/// stacked matrices (gate and up `[experts * n_ff, n_embd]`, down
/// `[experts * n_embd, n_ff]`), no biases.
pub struct Experts<W> {
    pub router: W,
    pub gate: W,
    pub up: W,
    pub down: W,
}

/// All weights of a llama-family model, as handles of a backend's weight type.
pub struct LlamaWeights<W> {
    pub trunk: Trunk<W, LayerWeights<W>>,
    /// RoPE frequency factors (Llama 3.1's `rope_freqs`, or YaRN's), on the host.
    pub rope_factors: Option<Vec<f32>>,
}

/// Tensors every layer has whatever the architecture: two norms and four
/// attention matrices.
const LAYER: [LayerTensors; 3] = [
    LayerTensors::weights(&["attn_norm"]),
    LayerTensors::weights(&QKV),
    LayerTensors::weights(&["attn_output", "ffn_norm"]),
];

/// qwen3's per-head norms.
const QK_NORM: [&str; 2] = ["attn_q_norm", "attn_k_norm"];

/// qwen3moe's router and experts, in place of [`GATED_FFN`].
const EXPERTS: [&str; 4] = [
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
];

impl<W> LlamaWeights<W> {
    /// Every tensor name this architecture reads, for checks that nothing is
    /// left unused (M0-W-1213).
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        let mut names = parts::tensor_names(cfg, file, &[], &LAYER);
        // The config reads expert keys exactly for the architectures that have
        // them: `cfg.moe` decides here as it does in `load`.
        let ffn: &'static [&'static str] = match cfg.moe {
            Some(_) => &EXPERTS,
            None => &GATED_FFN,
        };
        names.extend(parts::layer_names(cfg, &[LayerTensors::weights(ffn)]));
        if cfg.architecture.has_qkv_bias() {
            names.extend(parts::layer_names(cfg, &[LayerTensors::biases(&QKV)]));
        }
        if cfg.architecture.has_qk_norm() {
            names.extend(parts::layer_names(cfg, &[LayerTensors::weights(&QK_NORM)]));
        }
        names.extend(parts::rope_factor_names(file));
        names
    }

    /// Binds every tensor, checking each one's shape first, and reads the
    /// RoPE factors to the host.
    pub fn load<E: From<GraphError>>(b: &mut Binder<'_, '_, W, E>) -> Result<Self, E> {
        let cfg = b.cfg;
        let (d, qd, hd) = (cfg.n_embd, cfg.q_dim(), cfg.head_dim);
        let bias = cfg.architecture.has_qkv_bias();
        let qk_norm = cfg.architecture.has_qk_norm();
        let trunk = b.trunk(&LAYER, |b, blk| {
            Ok(LayerWeights {
                attn_norm: b.get(&blk.weight("attn_norm"), 1, d)?,
                qkv: Qkv::bind(b, blk, bias)?,
                qk_norm: match qk_norm {
                    true => Some((
                        b.get(&blk.weight("attn_q_norm"), 1, hd)?,
                        b.get(&blk.weight("attn_k_norm"), 1, hd)?,
                    )),
                    false => None,
                },
                wo: b.get(&blk.weight("attn_output"), d, qd)?,
                ffn_norm: b.get(&blk.weight("ffn_norm"), 1, d)?,
                ffn: match cfg.moe {
                    Some(moe) => Ffn::Experts(Experts::bind(b, blk, moe)?),
                    None => Ffn::Dense(GatedFfn::bind(b, blk)?),
                },
            })
        })?;
        let rope_factors = parts::rope_factors(cfg, b.file)?;
        Ok(LlamaWeights {
            trunk,
            rope_factors,
        })
    }
}

impl<W> Experts<W> {
    /// Layer `blk`'s router and experts.
    fn bind<E: From<GraphError>>(
        b: &mut Binder<'_, '_, W, E>,
        blk: parts::Blk,
        moe: MoeConfig,
    ) -> Result<Self, E> {
        let (d, x, ff) = (b.cfg.n_embd, moe.count, moe.n_ff);
        let w = |s: &str| blk.weight(s);
        Ok(Experts {
            router: b.get(&w("ffn_gate_inp"), x, d)?,
            gate: b.experts(&w("ffn_gate_exps"), x, ff, d)?,
            up: b.experts(&w("ffn_up_exps"), x, ff, d)?,
            down: b.experts(&w("ffn_down_exps"), x, d, ff)?,
        })
    }

    /// The experts as [`Ops::moe`] takes them.
    fn weights(&self, moe: MoeConfig) -> MoeWeights<'_, W> {
        MoeWeights {
            gate: &self.gate,
            gate_bias: None,
            up: &self.up,
            up_bias: None,
            down: &self.down,
            down_bias: None,
            experts: moe.count,
            used: moe.used,
            act: ExpertAct::SwiGlu,
        }
    }
}

/// The feed-forward's buffers: the dense one's, or the router's logits.
enum FfnBufs<B> {
    Dense(GluBufs<B>),
    Experts { logits: B, moe: MoeConfig },
}

impl<B> FfnBufs<B> {
    fn new<O: Ops<Buf = B>>(ops: &mut O, cfg: &ModelConfig, n: usize) -> Result<Self, O::Error> {
        Ok(match cfg.moe {
            Some(moe) => FfnBufs::Experts {
                logits: ops.buf(n, moe.count)?,
                moe,
            },
            None => FfnBufs::Dense(GluBufs::new(ops, n, cfg.n_ff)?),
        })
    }
}

/// Layer `il`'s feed-forward of `h` into `out`.
fn feed_forward<O: Ops>(
    ops: &mut O,
    rec: &mut parts::Recorder<'_>,
    il: usize,
    h: &O::Buf,
    ffn: &Ffn<O::Weight>,
    bufs: &mut FfnBufs<O::Buf>,
    out: &mut O::Buf,
) -> Result<(), O::Error> {
    match (ffn, bufs) {
        (Ffn::Dense(w), FfnBufs::Dense(f)) => parts::gated_ffn(ops, h, w, Glu::SwiGlu, f, out),
        (Ffn::Experts(w), FfnBufs::Experts { logits, moe }) => {
            ops.matmul(h, &w.router, None, logits)?;
            rec.record(ops, &format!("ffn_moe_logits-{il}"), logits)?;
            ops.moe(h, logits, w.weights(*moe), out)
        }
        _ => Err(GraphError::Unsupported("a layer's feed-forward of another kind".into()).into()),
    }
}

/// The llama graph for one pass (see [`crate::model::forward`]).
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &LlamaWeights<O::Weight>,
    cache: &mut O::Cache,
    mut pass: Pass<'_>,
) -> Result<(), O::Error> {
    let (start_pos, n) = (pass.start_pos, pass.tokens.len());
    let x = parts::embed(ops, cfg, &w.trunk.token_embd, &mut pass)?;
    let mut s = Stream::new(ops, x)?;
    let mut a = parts::AttnBufs::new(ops, cfg, n)?;
    let mut f = FfnBufs::new(ops, cfg, n)?;
    let layers = &w.trunk.layers;

    // Each residual add is done with the norm after it (`add_rms_norm`);
    // only the first layer's input norm stands alone.
    s.first_norm(ops, cfg, layers.first().map(|l| &l.attn_norm))?;
    for (il, l) in layers.iter().enumerate() {
        let qkv = l.qkv.products(&mut a.q, &mut a.k, &mut a.v);
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        let rope = parts::rope_pair(cfg, il, start_pos, w.rope_factors.as_deref());
        let prep = QkPrep {
            norms: l.qk_norm.as_ref().map(|(q, k)| HeadNorms {
                q,
                k,
                eps: cfg.norm_eps,
            }),
            rope: Some(rope),
        };
        ops.project_attend(&s.h, qkv, prep, cache, shape, &mut a.attn)?;
        ops.matmul(&a.attn, &l.wo, None, &mut a.proj)?;
        ops.add_rms_norm(&mut s.x, &a.proj, &l.ffn_norm, cfg.norm_eps, &mut s.h)?;

        feed_forward(ops, &mut pass.rec, il, &s.h, &l.ffn, &mut f, &mut a.proj)?;
        let next = layers.get(il + 1).map(|l| &l.attn_norm);
        parts::end_layer(ops, cfg, &mut pass.rec, il, &mut s, &a.proj, next)?;
    }
    parts::lm_head(ops, cfg, s.x, &w.trunk, pass)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::model::config::{Architecture, ConfigError};
    use crate::model::synthetic::{synthetic_llama, synthetic_model, SYNTHETIC_ARCHS};
    use crate::model::Weights;

    /// M0-W-1213: the factory maps each architecture name (an error names any
    /// other), and the adapter reads every tensor of its synthetic file.
    #[test]
    fn m0_w_1213_factory_and_every_tensor_used() {
        assert_eq!(
            Architecture::from_name("llama").unwrap(),
            Architecture::Llama
        );
        assert_eq!(
            Architecture::from_name("qwen2").unwrap(),
            Architecture::Qwen2
        );
        match Architecture::from_name("mamba") {
            Err(e @ ConfigError::UnsupportedArchitecture(_)) => {
                assert!(e.to_string().contains("mamba"))
            }
            other => panic!("expected UnsupportedArchitecture, got {other:?}"),
        }
        for arch in SYNTHETIC_ARCHS {
            let file = GgufFile::from_bytes(synthetic_model(arch, 3, 32)).unwrap();
            let cfg = ModelConfig::try_from(&file.metadata).unwrap();
            assert_eq!(cfg.architecture.name(), arch);
            let mut bound = BTreeSet::new();
            Weights::<()>::load(&cfg, &file, &mut |spec| {
                bound.insert(spec.info.name.clone());
                Ok::<(), GraphError>(())
            })
            .unwrap();
            let in_file: BTreeSet<String> = file.tensors.iter().map(|t| t.name.clone()).collect();
            assert_eq!(
                bound, in_file,
                "{arch}: every tensor of the file is bound, and nothing else"
            );
            let listed: BTreeSet<String> = Weights::<()>::tensor_names(&cfg, &file)
                .into_iter()
                .collect();
            assert_eq!(
                listed, in_file,
                "{arch}: tensor_names lists exactly the file's tensors"
            );
        }
    }

    /// A tensor of the wrong shape fails the load with a message naming it.
    #[test]
    fn a_wrong_shape_is_refused_by_name() {
        let file = GgufFile::from_bytes(synthetic_llama("llama", 3, 32)).unwrap();
        let mut cfg = ModelConfig::try_from(&file.metadata).unwrap();
        cfg.n_ff += 32;
        let err = Weights::<()>::load(&cfg, &file, &mut |_| Ok::<(), GraphError>(()))
            .err()
            .expect("shape mismatch");
        assert!(err.to_string().contains("ffn_gate"), "{err}");
    }
}
