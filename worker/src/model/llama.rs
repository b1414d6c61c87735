//! The llama family (`llama`, `qwen2`, `qwen3`): GGUF tensor names, shapes,
//! and the forward pass, following llama.cpp's `build_llama`, `build_qwen2`
//! and `build_qwen3` graphs.
//!
//! Per layer: RMSNorm, Q/K/V projections (+ biases on qwen2), RMSNorm of
//! each head of Q and K on qwen3, RoPE in the architecture's style, causal
//! grouped-query attention over the KV cache, output projection, residual;
//! RMSNorm, SwiGLU feed-forward, residual. Then `output_norm` and the LM head
//! (`output`, or the tied `token_embd`).

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{GraphError, HeadNorms, Ops, QkPrep};
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
    pub ffn: GatedFfn<W>,
}

/// All weights of a llama-family model, as handles of a backend's weight type.
pub struct LlamaWeights<W> {
    pub trunk: Trunk<W, LayerWeights<W>>,
    /// RoPE frequency factors (Llama 3.1's `rope_freqs`, or YaRN's), on the host.
    pub rope_factors: Option<Vec<f32>>,
}

/// Tensors every layer has whatever the architecture: two norms, four
/// attention and three feed-forward matrices.
const LAYER: [LayerTensors; 4] = [
    LayerTensors::weights(&["attn_norm"]),
    LayerTensors::weights(&QKV),
    LayerTensors::weights(&["attn_output", "ffn_norm"]),
    LayerTensors::weights(&GATED_FFN),
];

/// qwen3's per-head norms.
const QK_NORM: [&str; 2] = ["attn_q_norm", "attn_k_norm"];

impl<W> LlamaWeights<W> {
    /// Every tensor name this architecture reads, for checks that nothing is
    /// left unused (M0-W-1213).
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        let mut names = parts::tensor_names(cfg, file, &[], &LAYER);
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
                ffn: GatedFfn::bind(b, blk)?,
            })
        })?;
        let rope_factors = parts::rope_factors(cfg, b.file)?;
        Ok(LlamaWeights {
            trunk,
            rope_factors,
        })
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
    let mut f = GluBufs::new(ops, n, cfg.n_ff)?;
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

        parts::gated_ffn(ops, &s.h, &l.ffn, Glu::SwiGlu, &mut f, &mut a.proj)?;
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
