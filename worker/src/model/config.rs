//! Typed model configuration, read once from GGUF metadata.
//!
//! Required keys are checked up front so that a missing one fails the load
//! with an error naming it (M0-W-1211). Architecture-specific choices, such
//! as the rotary layout, are decided here and nowhere else.

use crate::gguf::{GgufError, Metadata};

/// The architectures this worker runs (M0-W-1212).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
}

impl Architecture {
    pub fn from_name(name: &str) -> Result<Self, ConfigError> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            other => Err(ConfigError::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }

    /// The rotary layout llama.cpp assigns to the architecture
    /// (`llama_model_rope_type`): `llama` GGUF files store Q/K rows permuted
    /// for adjacent pairs; `qwen2` (like phi3, gpt-oss) rotates halves (NEOX).
    /// Position 0 is unaffected by either, so a wrong choice only shows from
    /// the second token on.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Architecture::Llama => RopeStyle::Normal,
            Architecture::Qwen2 => RopeStyle::Neox,
        }
    }

    /// Qwen2 adds biases to Q, K and V; their large values are real.
    pub fn has_qkv_bias(self) -> bool {
        matches!(self, Architecture::Qwen2)
    }
}

/// How rotary position embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate adjacent pairs `(2i, 2i+1)`.
    Normal,
    /// Rotate halves `(i, i + n_rot/2)`.
    Neox,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("unsupported architecture {0:?} (supported: llama, qwen2)")]
    UnsupportedArchitecture(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("invalid model configuration: {0}")]
    Invalid(String),
}

/// Upper bounds on the hyperparameters a file may claim. Each sizes an
/// allocation (layers, KV cache, activations, logits), so each is checked
/// before anything is built from it; the bounds sit far above any published
/// llama-family model (at most ~130 layers, width 16 384, vocabulary 256 000,
/// context 10M) and far below what would overflow a product of them.
#[derive(Clone, Copy, Debug)]
pub struct HyperLimits {
    pub block_count: u64,
    pub embedding_length: u64,
    pub feed_forward_length: u64,
    pub head_count: u64,
    pub context_length: u64,
    pub vocab_size: u64,
}

pub const HYPER_LIMITS: HyperLimits = HyperLimits {
    block_count: 1024,
    embedding_length: 1 << 16,
    feed_forward_length: 1 << 20,
    head_count: 1024,
    context_length: 1 << 24,
    vocab_size: 1 << 21,
};

/// Hyperparameters of a llama-family transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub name: String,
    pub context_length: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (`rope.dimension_count`).
    pub n_rot: usize,
    pub rope_freq_base: f32,
    /// Linear RoPE scaling factor: positions are multiplied by `1 / factor`.
    pub rope_freq_scale: f32,
    pub rms_eps: f32,
    pub vocab_size: usize,
}

impl ModelConfig {
    pub fn rope_style(&self) -> RopeStyle {
        self.architecture.rope_style()
    }

    /// Width of the K and V projections.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the Q projection.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}

impl TryFrom<&Metadata> for ModelConfig {
    type Error = ConfigError;

    fn try_from(md: &Metadata) -> Result<Self, ConfigError> {
        let arch_name = md.get_str("general.architecture")?;
        let architecture = Architecture::from_name(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let lim = &HYPER_LIMITS;
        let bounded = |k: &str, v: u64, max: u64| -> Result<usize, ConfigError> {
            if v > max {
                return Err(ConfigError::Invalid(format!(
                    "{} = {v} is above the limit of {max}",
                    key(k)
                )));
            }
            // `max` is far below u32::MAX, so this cannot fail.
            Ok(v as usize)
        };
        let usize_key = |k: &str, max: u64| bounded(k, md.get_u64(&key(k))?, max);

        let name = md.get_str("general.name")?.to_string();
        let context_length = usize_key("context_length", lim.context_length)?;
        let n_embd = usize_key("embedding_length", lim.embedding_length)?;
        let n_layer = usize_key("block_count", lim.block_count)?;
        let n_head = usize_key("attention.head_count", lim.head_count)?;
        let n_head_kv = match md.opt_u64(&key("attention.head_count_kv"))? {
            Some(v) => bounded("attention.head_count_kv", v, lim.head_count)?,
            None => n_head,
        };
        let n_ff = usize_key("feed_forward_length", lim.feed_forward_length)?;
        let rms_eps = md.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_freq_base = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let rope_freq_scale = match md.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => 1.0 / md.opt_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
            Some(other) => {
                return Err(ConfigError::Invalid(format!(
                    "RoPE scaling {other:?} is not supported"
                )))
            }
        };
        check_floats(rms_eps, rope_freq_base, rope_freq_scale)?;
        let vocab_size = match md.opt_u64(&key("vocab_size"))? {
            Some(v) => bounded("vocab_size", v, lim.vocab_size)?,
            None => md.get_str_array("tokenizer.ggml.tokens")?.len(),
        };

        if n_head == 0 || n_head_kv == 0 || n_embd % n_head != 0 || n_head % n_head_kv != 0 {
            return Err(ConfigError::Invalid(format!(
                "{n_head} heads, {n_head_kv} KV heads and width {n_embd} do not divide evenly"
            )));
        }
        let head_dim = n_embd / n_head;
        let n_rot = match md.opt_u64(&key("rope.dimension_count"))? {
            // Anything above the head size is refused just below.
            Some(v) => usize::try_from(v).unwrap_or(usize::MAX),
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ConfigError::Invalid(format!(
                "rope.dimension_count {n_rot} must be even and at most the head size {head_dim}"
            )));
        }
        if n_layer == 0 || n_ff == 0 || vocab_size == 0 || context_length == 0 {
            return Err(ConfigError::Invalid("a zero dimension".into()));
        }
        Ok(ModelConfig {
            architecture,
            name,
            context_length,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            head_dim,
            n_rot,
            rope_freq_base,
            rope_freq_scale,
            rms_eps,
            vocab_size,
        })
    }
}

/// The float hyperparameters must be finite and positive: a NaN epsilon or
/// frequency would turn every activation into NaN without an error.
fn check_floats(rms_eps: f32, freq_base: f32, freq_scale: f32) -> Result<(), ConfigError> {
    for (name, v) in [
        ("attention.layer_norm_rms_epsilon", rms_eps),
        ("rope.freq_base", freq_base),
        ("rope scaling (1 / rope.scaling.factor)", freq_scale),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "{name} = {v} must be finite and positive"
            )));
        }
    }
    Ok(())
}
