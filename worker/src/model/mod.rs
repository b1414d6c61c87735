//! Model architectures: typed configuration read once from GGUF metadata
//! ([`config`]), the operations a device provides ([`ops`]), and one file per
//! architecture family that maps GGUF tensor names to weights and describes
//! the forward pass, keeping only what differs from the others; what they
//! share is in [`parts`]. Nothing here names a backend: `crate::load` puts a
//! model on one.

pub mod config;
pub mod gemma3;
pub mod gpt2;
pub mod gpt_oss;
pub mod llama;
pub mod ops;
pub mod parts;
pub mod phi3;
pub mod synthetic;

pub use config::{Architecture, ConfigError, ModelConfig, RopeStyle};

use crate::gguf::GgufFile;
use gemma3::Gemma3Weights;
use gpt2::Gpt2Weights;
use gpt_oss::GptOssWeights;
use llama::LlamaWeights;
use ops::{Checkpoints, GraphError, Logits, Ops};
use parts::{Binder, Pass, Recorder, Upload};
use phi3::Phi3Weights;

/// A model's weights, as handles of a backend's weight type, in the layout
/// of its architecture family: what a backend holds and runs.
pub enum Weights<W> {
    /// `llama`, `qwen2`, `qwen3` and `qwen3moe`.
    Llama(LlamaWeights<W>),
    Gemma3(Gemma3Weights<W>),
    Phi3(Phi3Weights<W>),
    Gpt2(Gpt2Weights<W>),
    GptOss(GptOssWeights<W>),
}

impl<W> Weights<W> {
    /// Every tensor name the architecture reads, for checks that nothing is
    /// left unused (M0-W-1213).
    pub fn tensor_names(cfg: &ModelConfig, file: &GgufFile) -> Vec<String> {
        match cfg.architecture {
            Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe => LlamaWeights::<W>::tensor_names(cfg, file),
            Architecture::Gemma3 => Gemma3Weights::<W>::tensor_names(cfg, file),
            Architecture::Phi3 => Phi3Weights::<W>::tensor_names(cfg, file),
            Architecture::Gpt2 => Gpt2Weights::<W>::tensor_names(cfg, file),
            Architecture::GptOss => GptOssWeights::<W>::tensor_names(cfg, file),
        }
    }

    /// The RoPE frequency factors the model turns by, if any.
    pub fn rope_freq_factors(&self) -> Option<&[f32]> {
        match self {
            Weights::Llama(w) => w.rope_factors.as_deref(),
            Weights::Phi3(w) => w.rope_factors.as_deref(),
            Weights::GptOss(w) => w.rope_factors.as_deref(),
            Weights::Gemma3(_) | Weights::Gpt2(_) => None,
        }
    }

    /// Binds every tensor through `upload` (the device's), checking each
    /// one's shape first. `E` is the device's error type.
    pub fn load<E: From<GraphError>>(
        cfg: &ModelConfig,
        file: &GgufFile,
        upload: &mut Upload<'_, W, E>,
    ) -> Result<Self, E> {
        let b = &mut Binder { cfg, file, upload };
        Ok(match cfg.architecture {
            Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe => Weights::Llama(LlamaWeights::load(b)?),
            Architecture::Gemma3 => Weights::Gemma3(Gemma3Weights::load(b)?),
            Architecture::Phi3 => Weights::Phi3(Phi3Weights::load(b)?),
            Architecture::Gpt2 => Weights::Gpt2(Gpt2Weights::load(b)?),
            Architecture::GptOss => Weights::GptOss(GptOssWeights::load(b)?),
        })
    }
}

/// Runs `tokens` at positions `start_pos..` through the model, appending
/// their K/V to `cache`, writes the requested logits to `out` (left empty for
/// `Logits::None`) and hands the last position's logits to
/// `Ops::keep_last_row`.
#[allow(clippy::too_many_arguments)]
pub fn forward<O: Ops>(
    ops: &mut O,
    cfg: &ModelConfig,
    w: &Weights<O::Weight>,
    cache: &mut O::Cache,
    tokens: &[u32],
    start_pos: usize,
    logits: Logits,
    out: &mut Vec<f32>,
    checkpoints: Option<&mut Checkpoints>,
) -> Result<(), O::Error> {
    if tokens.is_empty() {
        return Err(GraphError::NoTokens.into());
    }
    let pass = Pass {
        tokens,
        start_pos,
        logits,
        out,
        rec: Recorder::new(checkpoints, tokens.len()),
    };
    match w {
        Weights::Llama(w) => llama::forward(ops, cfg, w, cache, pass),
        Weights::Gemma3(w) => gemma3::forward(ops, cfg, w, cache, pass),
        Weights::Phi3(w) => phi3::forward(ops, cfg, w, cache, pass),
        Weights::Gpt2(w) => gpt2::forward(ops, cfg, w, cache, pass),
        Weights::GptOss(w) => gpt_oss::forward(ops, cfg, w, cache, pass),
    }
}

/// The f32 activation buffers (their lengths in values) that one forward
/// pass of `n` tokens allocates at most, for the architecture's graph, the LM
/// head's included: what a backend reserves for a decode step (`n = 1`).
pub fn step_buffers(cfg: &ModelConfig, n: usize) -> Vec<usize> {
    let (d, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    let mut v = match cfg.architecture {
        // x, h, q, k, v, attn, proj, gate, up, act
        Architecture::Llama | Architecture::Qwen2 => vec![d, d, qd, kvd, kvd, qd, d, ff, ff, ff],
        // x, h, q_raw, q, k_raw, k, v, attn, proj, gate, up, act
        Architecture::Qwen3 => vec![d, d, qd, qd, kvd, kvd, kvd, qd, d, ff, ff, ff],
        // x, h, q_raw, q, k_raw, k, v, attn, proj, normed, gate, up, act
        Architecture::Gemma3 => vec![d, d, qd, qd, kvd, kvd, kvd, qd, d, d, ff, ff, ff],
        // x, h, qkv, q, k, v, attn, proj, gate_up, gate, up, act
        Architecture::Phi3 => {
            vec![d, d, qd + 2 * kvd, qd, kvd, kvd, qd, d, 2 * ff, ff, ff, ff]
        }
        // x, h, qkv, q, k, v, attn, proj, up, act
        Architecture::Gpt2 => vec![d, d, qd + 2 * kvd, qd, kvd, kvd, qd, d, ff, ff],
        // x, h, q, k, v, attn, proj, then `moe`'s and its router's.
        Architecture::GptOss => [vec![d, d, qd, kvd, kvd, qd, d], experts(cfg)].concat(),
        // x, h, q_raw, q, k_raw, k, v, attn, proj, then `moe`'s as gpt-oss.
        Architecture::Qwen3Moe => [vec![d, d, qd, qd, kvd, kvd, kvd, qd, d], experts(cfg)].concat(),
    };
    // lm_head: the last row, its norm, the logits.
    v.extend([d, d, cfg.vocab_size]);
    v.iter().map(|&len| len * n).collect()
}

/// The buffers of `moe` and its router for one row: the router's logits,
/// the chosen experts and their weights, and each chosen expert's gate, up,
/// act and down output.
fn experts(cfg: &ModelConfig) -> Vec<usize> {
    let (x, used, eff) = cfg.moe.map_or((0, 0, 0), |m| (m.count, m.used, m.n_ff));
    let d = cfg.n_embd;
    vec![x, used, used, used * eff, used * eff, used * eff, used * d]
}

/// What the rest of the worker needs to know about the loaded model.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelInfo {
    /// `general.name`.
    pub name: String,
    /// `general.architecture` (`llama`, `qwen2`, ...).
    pub architecture: String,
    /// The file type's short name (`Q4_1`, `Q4_K_M`, ...).
    pub quant_kind: String,
    pub vocab_size: usize,
    /// The effective context limit in tokens.
    pub context_length: usize,
    /// Bytes of tensor data in the file.
    pub tensor_bytes: u64,
}
