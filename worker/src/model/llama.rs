//! The llama family (`llama`, `qwen2`): GGUF tensor names, shapes, and the
//! forward pass, following llama.cpp's `build_llama` / `build_qwen2` graphs.
//!
//! Per layer: RMSNorm, Q/K/V projections (+ biases on qwen2), RoPE in the
//! architecture's style, causal grouped-query attention over the KV cache,
//! output projection, residual; RMSNorm, SwiGLU feed-forward, residual.
//! Then `output_norm` and the LM head (`output`, or the tied `token_embd`).

use crate::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{GraphError, Ops, Product, QkPrep};
use crate::model::parts::{self, check_layer_count, lm_head, Binder, FinalNorm, Pass, Upload};

/// One transformer block's weights.
pub struct LayerWeights<W> {
    pub attn_norm: W,
    pub wq: W,
    pub wk: W,
    pub wv: W,
    pub bq: Option<W>,
    pub bk: Option<W>,
    pub bv: Option<W>,
    pub wo: W,
    pub ffn_norm: W,
    pub ffn_gate: W,
    pub ffn_up: W,
    pub ffn_down: W,
}

/// All weights of a llama-family model, as handles of a backend's weight type.
pub struct LlamaWeights<W> {
    pub token_embd: W,
    pub layers: Vec<LayerWeights<W>>,
    pub output_norm: W,
    /// `None` when the LM head is tied to `token_embd`.
    pub output: Option<W>,
    /// RoPE frequency factors (Llama 3.1's `rope_freqs`), on the host.
    pub rope_factors: Option<Vec<f32>>,
}

impl<W> LlamaWeights<W> {
    /// Every tensor name this architecture reads, for checks that nothing is
    /// left unused (M0-W-1213).
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        let mut names = parts::tensor_names(
            cfg,
            file,
            &["token_embd.weight", "output_norm.weight"],
            &LAYER_TENSORS,
            &["weight"],
        );
        if cfg.architecture.has_qkv_bias() {
            for i in 0..cfg.n_layer {
                for n in ["attn_q", "attn_k", "attn_v"] {
                    names.push(format!("blk.{i}.{n}.bias"));
                }
            }
        }
        names.extend(parts::rope_factor_names(file));
        names
    }

    /// Binds every tensor through `upload`, checking each one's shape first.
    /// `E` is the device's error type.
    pub fn load<E: From<GraphError>>(
        cfg: &ModelConfig,
        file: &GgufFile,
        upload: &mut Upload<'_, W, E>,
    ) -> Result<Self, E> {
        check_layer_count(cfg, file, LAYER_TENSORS.len() as u64)?;
        let mut b = Binder { file, upload };
        let (d, v, ff) = (cfg.n_embd, cfg.vocab_size, cfg.n_ff);
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let bias = cfg.architecture.has_qkv_bias();
        let token_embd = b.get("token_embd.weight", v, d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{i}.{s}");
            layers.push(LayerWeights {
                attn_norm: b.get(&n("attn_norm.weight"), 1, d)?,
                wq: b.get(&n("attn_q.weight"), qd, d)?,
                wk: b.get(&n("attn_k.weight"), kvd, d)?,
                wv: b.get(&n("attn_v.weight"), kvd, d)?,
                bq: b.when(bias, &n("attn_q.bias"), 1, qd)?,
                bk: b.when(bias, &n("attn_k.bias"), 1, kvd)?,
                bv: b.when(bias, &n("attn_v.bias"), 1, kvd)?,
                wo: b.get(&n("attn_output.weight"), d, qd)?,
                ffn_norm: b.get(&n("ffn_norm.weight"), 1, d)?,
                ffn_gate: b.get(&n("ffn_gate.weight"), ff, d)?,
                ffn_up: b.get(&n("ffn_up.weight"), ff, d)?,
                ffn_down: b.get(&n("ffn_down.weight"), d, ff)?,
            });
        }
        let output_norm = b.get("output_norm.weight", 1, d)?;
        let output = b.optional("output.weight", v, d)?;
        Ok(LlamaWeights {
            token_embd,
            layers,
            output_norm,
            output,
            rope_factors: parts::rope_factors(cfg, file)?,
        })
    }
}

/// Tensors every layer has whatever the architecture: two norms, four
/// attention and three feed-forward matrices.
const LAYER_TENSORS: [&str; 9] = [
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// The llama graph for one pass (see [`crate::model::forward`]).
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &LlamaWeights<O::Weight>,
    cache: &mut O::Cache,
    mut pass: Pass<'_>,
) -> Result<(), O::Error> {
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
    let mut gate = ops.buf(n, cfg.n_ff)?;
    let mut up = ops.buf(n, cfg.n_ff)?;
    let mut act = ops.buf(n, cfg.n_ff)?;
    let rope = |n_head| parts::rope_params(cfg, n_head, start_pos, w.rope_factors.as_deref());

    // Each residual add is done with the norm after it (`add_rms_norm`);
    // only the first layer's input norm stands alone.
    if let Some(first) = w.layers.first() {
        ops.rms_norm(&x, &first.attn_norm, cfg.norm_eps, &mut h)?;
    }
    for (il, l) in w.layers.iter().enumerate() {
        let qkv = [
            Product {
                w: &l.wq,
                bias: l.bq.as_ref(),
                out: &mut q,
            },
            Product {
                w: &l.wk,
                bias: l.bk.as_ref(),
                out: &mut k,
            },
            Product {
                w: &l.wv,
                bias: l.bv.as_ref(),
                out: &mut v,
            },
        ];
        let shape = parts::attention_shape(cfg, il, start_pos, n);
        let prep = QkPrep {
            norms: None,
            rope: Some((rope(cfg.n_head), rope(cfg.n_head_kv))),
        };
        ops.project_attend(&h, qkv, prep, cache, shape, &mut attn)?;
        ops.matmul(&attn, &l.wo, None, &mut proj)?;
        ops.add_rms_norm(&mut x, &proj, &l.ffn_norm, cfg.norm_eps, &mut h)?;

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
        ops.swiglu(&gate, &up, &mut act)?;
        ops.matmul(&act, &l.ffn_down, None, &mut proj)?;
        match w.layers.get(il + 1) {
            Some(next) => ops.add_rms_norm(&mut x, &proj, &next.attn_norm, cfg.norm_eps, &mut h)?,
            None => ops.add_assign(&mut x, &proj)?,
        }
        pass.rec.record(ops, &format!("l_out-{il}"), &x)?;
    }

    let head = w.output.as_ref().unwrap_or(&w.token_embd);
    lm_head(ops, cfg, x, FinalNorm::Rms(&w.output_norm), head, pass)
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
        let err = LlamaWeights::<()>::load(&cfg, &file, &mut |_| Ok::<(), GraphError>(()))
            .err()
            .expect("shape mismatch");
        assert!(err.to_string().contains("ffn_gate"), "{err}");
    }
}
