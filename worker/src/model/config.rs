//! Typed model configuration, read once from GGUF metadata.
//!
//! Required keys are checked up front so that a missing one fails the load
//! with an error naming it (M0-W-1211). Architecture-specific choices, such
//! as the rotary layout, are decided here and nowhere else.

use crate::gguf::{GgufError, MetaValue, Metadata};

/// The architectures this worker runs (M0-W-1212).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Gemma3,
    Phi3,
    Gpt2,
    /// gpt-oss (llama.cpp's `openai-moe`): experts, attention sinks, YaRN,
    /// every other layer windowed.
    GptOss,
}

impl Architecture {
    pub fn from_name(name: &str) -> Result<Self, ConfigError> {
        match name {
            "llama" => Ok(Architecture::Llama),
            "qwen2" => Ok(Architecture::Qwen2),
            "gemma3" => Ok(Architecture::Gemma3),
            "phi3" => Ok(Architecture::Phi3),
            "gpt2" => Ok(Architecture::Gpt2),
            "gpt-oss" => Ok(Architecture::GptOss),
            other => Err(ConfigError::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Gpt2 => "gpt2",
            Architecture::GptOss => "gpt-oss",
        }
    }

    /// The rotary layout llama.cpp assigns to the architecture
    /// (`llama_model_rope_type`): `llama` GGUF files store Q/K rows permuted
    /// for adjacent pairs; `qwen2`, `gemma3` and `phi3` (like gpt-oss) rotate
    /// halves (NEOX). `gpt2` has no RoPE (learned positions).
    /// Position 0 is unaffected by either, so a wrong choice only shows from
    /// the second token on.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Architecture::Llama | Architecture::Gpt2 => RopeStyle::Normal,
            Architecture::Qwen2
            | Architecture::Gemma3
            | Architecture::Phi3
            | Architecture::GptOss => RopeStyle::Neox,
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
    #[error(
        "unsupported architecture {0:?} (supported: llama, qwen2, gemma3, phi3, gpt2, gpt-oss)"
    )]
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
    /// The context the RoPE frequencies were trained for
    /// (`rope.scaling.original_context_length`): LongRoPE files (Phi-3
    /// 128k) use their long factor table when `context_length` exceeds it.
    pub rope_orig_context: Option<usize>,
    /// The magnitude factor on RoPE's cosines and sines
    /// (`rope.scaling.attn_factor`, 1 where the file has none; with YaRN
    /// times YaRN's own, [`Yarn::mscale`]).
    pub rope_attn_factor: f32,
    /// YaRN (`rope.scaling.type` yarn), which turns into a frequency-factor
    /// table ([`Yarn::freq_factors`]); `rope_freq_scale` is then 1.
    pub rope_yarn: Option<Yarn>,
    /// The epsilon of the architecture's norms: RMSNorm's, or LayerNorm's for gpt2.
    pub norm_eps: f32,
    pub vocab_size: usize,
    /// Sliding-window attention: how many positions back a query of a
    /// windowed layer sees, itself included (`attention.sliding_window`).
    pub sliding_window: Option<usize>,
    /// Which layers attend through the window (empty without one).
    pub swa_layers: Vec<bool>,
    /// The RoPE base of windowed layers (`rope.freq_base_swa`; llama.cpp's
    /// default 10 000 where the file has none).
    pub rope_freq_base_swa: f32,
    /// Experts in place of a dense feed-forward (gpt-oss).
    pub moe: Option<MoeConfig>,
}

/// A mixture-of-experts feed-forward's shape: `count` experts
/// (`expert_count`) of `n_ff` rows (`expert_feed_forward_length`), `used` of
/// them a token (`expert_used_count`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub count: usize,
    pub used: usize,
    pub n_ff: usize,
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

    /// The window of layer `il`'s attention, `None` where it sees every position.
    pub fn window(&self, il: usize) -> Option<usize> {
        match self.swa_layers.get(il) {
            Some(true) => self.sliding_window,
            _ => None,
        }
    }

    /// The RoPE base of layer `il`: windowed layers have their own.
    pub fn rope_base(&self, il: usize) -> f32 {
        match self.window(il) {
            Some(_) => self.rope_freq_base_swa,
            None => self.rope_freq_base,
        }
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
        let norm_eps = match architecture {
            Architecture::Gpt2 => md.get_f32(&key("attention.layer_norm_epsilon"))?,
            _ => md.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        };
        let rope_freq_base = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let scaling = md.opt_str(&key("rope.scaling.type"))?;
        let rope_freq_scale = match scaling {
            None | Some("none") | Some("yarn") => 1.0,
            Some("linear") => 1.0 / md.opt_f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
            Some(other) => {
                return Err(ConfigError::Invalid(format!(
                    "RoPE scaling {other:?} is not supported"
                )))
            }
        };
        let rope_orig_context = md
            .opt_u64(&key("rope.scaling.original_context_length"))?
            .map(|v| {
                bounded(
                    "rope.scaling.original_context_length",
                    v,
                    lim.context_length,
                )
            })
            .transpose()?;
        let rope_yarn = match scaling {
            Some("yarn") => Some(yarn(md, arch_name, architecture, rope_orig_context)?),
            _ => None,
        };
        let rope_attn_factor = md.opt_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0)
            * rope_yarn.map_or(1.0, |y| y.mscale());
        let vocab_size = match md.opt_u64(&key("vocab_size"))? {
            Some(v) => bounded("vocab_size", v, lim.vocab_size)?,
            None => md.get_str_array("tokenizer.ggml.tokens")?.len(),
        };

        let head_dim = head_dim(md, arch_name, n_embd, n_head, n_head_kv)?;
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
        let sliding = sliding_window(md, architecture, n_layer)?;
        let moe = match architecture {
            Architecture::GptOss => {
                let count = usize_key("expert_count", MAX_EXPERTS)?;
                let used = usize_key("expert_used_count", MAX_EXPERTS)?;
                let n_ff = usize_key("expert_feed_forward_length", lim.feed_forward_length)?;
                if count == 0 || used == 0 || used > count || n_ff == 0 {
                    return Err(ConfigError::Invalid(format!(
                        "{used} of {count} experts of {n_ff} rows"
                    )));
                }
                Some(MoeConfig { count, used, n_ff })
            }
            _ => None,
        };
        // Gemma 3's windowed layers have a base of their own (llama.cpp's
        // default 10 000 where the file names none); phi3's share the one base.
        let rope_freq_base_swa = match architecture {
            Architecture::Gemma3 => md.opt_f32(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0),
            _ => rope_freq_base,
        };
        check_floats(&[
            ("the norms' epsilon", norm_eps),
            ("rope.freq_base", rope_freq_base),
            ("rope.freq_base_swa", rope_freq_base_swa),
            ("rope scaling (1 / rope.scaling.factor)", rope_freq_scale),
            ("rope.scaling.attn_factor", rope_attn_factor),
        ])?;
        if md
            .opt_f32(&key("final_logit_softcapping"))?
            .is_some_and(|c| c != 0.0)
        {
            return Err(ConfigError::Invalid(
                "final_logit_softcapping is not supported".into(),
            ));
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
            rope_orig_context,
            rope_attn_factor,
            rope_yarn,
            norm_eps,
            vocab_size,
            sliding_window: sliding.as_ref().map(|s| s.0),
            swa_layers: sliding.map(|s| s.1).unwrap_or_default(),
            rope_freq_base_swa,
            moe,
        })
    }
}

/// YaRN's parameters (llama.cpp's `yarn_*` hparams and `n_ctx_orig_yarn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `rope.scaling.factor`: the interpolated dimensions turn `1 / factor`
    /// as fast.
    pub factor: f32,
    /// `rope.scaling.original_context_length`.
    pub orig_context: usize,
    /// `rope.scaling.yarn_beta_fast` / `_slow` (32 and 1 by default): the
    /// rotations per original context that bound the ramp.
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `rope.scaling.yarn_ext_factor` (1 by default): how much of the ramp
    /// extrapolates.
    pub ext_factor: f32,
}

impl Yarn {
    /// llama.cpp's `ggml_rope_yarn_corr_dims`: the pair indices where the
    /// ramp from extrapolation (below) to interpolation (above) starts and
    /// ends, for `n_rot` rotated dimensions at `base`.
    pub fn corr_dims(&self, n_rot: usize, base: f32) -> (f32, f32) {
        let n = n_rot as f32;
        let dim = |beta: f32| {
            n * (self.orig_context as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = dim(self.beta_fast).floor().max(0.0);
        let end = dim(self.beta_slow).ceil().min(n - 1.0);
        (start, end)
    }

    /// The divisor of each rotated pair's frequency that makes `pos *
    /// base^(-2i/n_rot) / factor_i` ggml's `rope_yarn` angle: the
    /// interpolated angle (`1 / factor` as fast) blended with the original
    /// one by the ramp (`ext_factor` times 1 below the correction dims, 0
    /// above, linear between). The blend is linear in the position, so a
    /// table serves every position and both backends' RoPE take it as they
    /// take Llama 3.1's `rope_freqs`.
    pub fn freq_factors(&self, n_rot: usize, base: f32) -> Vec<f32> {
        let (low, high) = self.corr_dims(n_rot, base);
        let scale = 1.0 / self.factor;
        (0..n_rot / 2)
            .map(|i| {
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                1.0 / (scale * (1.0 - mix) + mix)
            })
            .collect()
    }

    /// The factor on the cosines and sines: llama.cpp's `yarn_attn_factor`
    /// (`0.1 ln(factor) + 1`, over the same factor that `rope_yarn` then
    /// multiplies back in when `ext_factor` is not 0), so `0.1 ln(factor) +
    /// 1` in all; 1 without extrapolation.
    pub fn mscale(&self) -> f32 {
        if self.ext_factor == 0.0 || self.factor <= 1.0 {
            1.0
        } else {
            0.1 * self.factor.ln() + 1.0
        }
    }
}

/// YaRN's keys, for the architectures that take it (llama, qwen2).
fn yarn(
    md: &Metadata,
    arch_name: &str,
    arch: Architecture,
    orig_context: Option<usize>,
) -> Result<Yarn, ConfigError> {
    let key = |k: &str| format!("{arch_name}.rope.scaling.{k}");
    if !matches!(
        arch,
        Architecture::Llama | Architecture::Qwen2 | Architecture::GptOss
    ) {
        return Err(ConfigError::Invalid(format!(
            "YaRN RoPE scaling is not supported for {arch_name}"
        )));
    }
    if md.opt_f32(&key("yarn_log_multiplier"))?.is_some() {
        return Err(ConfigError::Invalid(
            "rope.scaling.yarn_log_multiplier is not supported".into(),
        ));
    }
    let y = Yarn {
        factor: md.get_f32(&key("factor"))?,
        orig_context: orig_context.ok_or_else(|| {
            ConfigError::Invalid(format!("YaRN needs {}", key("original_context_length")))
        })?,
        beta_fast: md.opt_f32(&key("yarn_beta_fast"))?.unwrap_or(32.0),
        beta_slow: md.opt_f32(&key("yarn_beta_slow"))?.unwrap_or(1.0),
        ext_factor: md.opt_f32(&key("yarn_ext_factor"))?.unwrap_or(1.0),
    };
    let ok = |v: f32| v.is_finite() && v > 0.0;
    let in_range = ok(y.factor)
        && ok(y.beta_fast)
        && ok(y.beta_slow)
        && y.orig_context > 0
        && (0.0..=1.0).contains(&y.ext_factor);
    if !in_range {
        return Err(ConfigError::Invalid(format!(
            "YaRN parameters out of range: {y:?}"
        )));
    }
    Ok(y)
}

/// The head size: `attention.key_length` where the file has it (Gemma 3's
/// heads are wider than `embedding_length / head_count`), else the width
/// shared among the heads. K and V heads must be the same size.
fn head_dim(
    md: &Metadata,
    arch: &str,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
) -> Result<usize, ConfigError> {
    if n_head == 0 || n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
        return Err(ConfigError::Invalid(format!(
            "{n_head} heads and {n_head_kv} KV heads do not divide evenly"
        )));
    }
    let key_len = md.opt_u64(&format!("{arch}.attention.key_length"))?;
    let value_len = md.opt_u64(&format!("{arch}.attention.value_length"))?;
    match (key_len, value_len) {
        (Some(k), v) if v.is_none_or(|v| v == k) => {
            if k == 0 || k > MAX_HEAD_DIM {
                return Err(ConfigError::Invalid(format!(
                    "attention.key_length {k} must be 1 to {MAX_HEAD_DIM}"
                )));
            }
            Ok(k as usize)
        }
        (None, None) if n_embd.is_multiple_of(n_head) => Ok(n_embd / n_head),
        (None, None) => Err(ConfigError::Invalid(format!(
            "{n_head} heads do not divide the width {n_embd}"
        ))),
        (k, v) => Err(ConfigError::Invalid(format!(
            "attention.key_length {k:?} and value_length {v:?} differ"
        ))),
    }
}

/// Most experts a file may claim (gpt-oss-120b has 128; each sizes tables).
const MAX_EXPERTS: u64 = 1024;

/// Largest head size a file may claim (every backend also checks its own).
const MAX_HEAD_DIM: u64 = 1024;

/// The sliding window and the layers that use it. Gemma 3, as llama.cpp's
/// loader reads it: `attention.sliding_window`, and either a per-layer
/// `attention.sliding_window_pattern` array or a period `n` (default 6) in
/// which every layer but the `n`-th is windowed. Phi-3: every layer, as
/// Hugging Face's Phi-3 attends (llama.cpp ignores phi3's window, which
/// makes a difference only past it: 2,047 positions for Phi-3-mini-4k).
fn sliding_window(
    md: &Metadata,
    arch: Architecture,
    n_layer: usize,
) -> Result<Option<(usize, Vec<bool>)>, ConfigError> {
    let name = arch.name();
    let window = match md.opt_u64(&format!("{name}.attention.sliding_window"))? {
        Some(w) if w > 0 => w,
        _ => return Ok(None),
    };
    let window = usize::try_from(window).unwrap_or(usize::MAX);
    match arch {
        Architecture::Gemma3 => {}
        Architecture::Phi3 => return Ok(Some((window, vec![true; n_layer]))),
        // llama.cpp's `load_swa_pattern(ml, 2)`: layers 0, 2, 4, ... windowed.
        Architecture::GptOss => {
            return Ok(Some((window, (0..n_layer).map(|il| il % 2 == 0).collect())))
        }
        _ => {
            return Err(ConfigError::Invalid(format!(
                "sliding-window attention is not supported for {name}"
            )))
        }
    }
    let pattern_key = format!("{name}.attention.sliding_window_pattern");
    let layers = match md.get(&pattern_key) {
        Some(MetaValue::Array(items)) => {
            let layers: Option<Vec<bool>> = items.iter().map(MetaValue::as_bool).collect();
            match layers {
                Some(l) if l.len() == n_layer => l,
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "{pattern_key} must hold {n_layer} booleans"
                    )))
                }
            }
        }
        _ => {
            let period = md.opt_u64(&pattern_key)?.unwrap_or(6) as usize;
            (0..n_layer)
                .map(|il| period == 0 || il % period < period - 1)
                .collect()
        }
    };
    Ok(Some((window, layers)))
}

/// The float hyperparameters must be finite and positive: a NaN epsilon or
/// frequency would turn every activation into NaN without an error.
fn check_floats(values: &[(&str, f32)]) -> Result<(), ConfigError> {
    for &(name, v) in values {
        if !(v.is_finite() && v > 0.0) {
            return Err(ConfigError::Invalid(format!(
                "{name} = {v} must be finite and positive"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::model::synthetic::synthetic_model;

    fn metadata(arch: &str) -> Metadata {
        GgufFile::from_bytes(synthetic_model(arch, 1, 64))
            .unwrap()
            .metadata
    }

    /// `md` with the keys of `changes` replaced (`Some`) or removed (`None`).
    fn with(md: &Metadata, changes: &[(&str, Option<MetaValue>)]) -> Metadata {
        let mut out = Metadata::new();
        for (k, v) in md.iter() {
            if !changes.iter().any(|(c, _)| *c == k) {
                out.insert(k, v.clone()).unwrap();
            }
        }
        for (k, v) in changes {
            if let Some(v) = v {
                out.insert(k, v.clone()).unwrap();
            }
        }
        out
    }

    /// Gemma 3: heads from `attention.key_length`, a window on the layers
    /// its pattern names (a period, or one boolean a layer), their own RoPE base.
    #[test]
    fn gemma3_heads_windows_and_rope_bases() {
        let md = metadata("gemma3");
        let cfg = ModelConfig::try_from(&md).unwrap();
        assert_eq!((cfg.head_dim, cfg.q_dim()), (128, 512));
        assert_eq!((cfg.window(0), cfg.window(1)), (Some(8), None));
        assert_eq!(
            (cfg.rope_base(0), cfg.rope_base(1)),
            (10_000.0, 1_000_000.0)
        );

        let pattern = |v: Vec<MetaValue>| {
            let key = "gemma3.attention.sliding_window_pattern";
            with(&md, &[(key, Some(MetaValue::Array(v)))])
        };
        let cfg = ModelConfig::try_from(&pattern(vec![
            MetaValue::Bool(false),
            MetaValue::Bool(true),
        ]))
        .unwrap();
        assert_eq!((cfg.window(0), cfg.window(1)), (None, Some(8)));
        let err = ModelConfig::try_from(&pattern(vec![MetaValue::Bool(true)])).unwrap_err();
        assert!(err.to_string().contains("2 booleans"), "{err}");

        let base = with(
            &md,
            &[("gemma3.rope.freq_base_swa", Some(MetaValue::F32(5e5)))],
        );
        assert_eq!(ModelConfig::try_from(&base).unwrap().rope_base(0), 5e5);
        let no_window = with(&md, &[("gemma3.attention.sliding_window", None)]);
        let cfg = ModelConfig::try_from(&no_window).unwrap();
        assert_eq!((cfg.window(0), cfg.rope_base(0)), (None, 1_000_000.0));
    }

    /// K and V heads of different sizes, or of none, are refused by name.
    #[test]
    fn key_and_value_lengths_must_agree() {
        let md = metadata("gemma3");
        let (k, v) = (
            "gemma3.attention.key_length",
            "gemma3.attention.value_length",
        );
        let differ = with(&md, &[(v, Some(MetaValue::U32(64)))]);
        let err = ModelConfig::try_from(&differ).unwrap_err();
        assert!(err.to_string().contains("differ"), "{err}");
        let empty = with(&md, &[(k, Some(MetaValue::U32(0))), (v, None)]);
        let err = ModelConfig::try_from(&empty).unwrap_err();
        assert!(err.to_string().contains("1 to 1024"), "{err}");
    }

    /// Phi-3 windows every layer and keeps one RoPE base; gpt2 reads
    /// LayerNorm's epsilon; an architecture without windows refuses one.
    #[test]
    fn phi3_gpt2_and_windows_elsewhere() {
        let cfg = ModelConfig::try_from(&metadata("phi3")).unwrap();
        assert_eq!((cfg.window(0), cfg.window(1)), (Some(16), Some(16)));
        assert_eq!(cfg.rope_base(0), cfg.rope_freq_base);
        let cfg = ModelConfig::try_from(&metadata("gpt2")).unwrap();
        assert_eq!((cfg.norm_eps, cfg.window(0)), (1e-5, None));
        let llama = with(
            &metadata("llama"),
            &[("llama.attention.sliding_window", Some(MetaValue::U32(8)))],
        );
        let err = ModelConfig::try_from(&llama).unwrap_err();
        assert!(err.to_string().contains("not supported for llama"), "{err}");
        let capped = with(
            &metadata("gemma3"),
            &[("gemma3.final_logit_softcapping", Some(MetaValue::F32(30.0)))],
        );
        let err = ModelConfig::try_from(&capped).unwrap_err();
        assert!(err.to_string().contains("final_logit_softcapping"), "{err}");
    }

    /// ggml's `rope_yarn` angle for pair `i` at `pos` (ggml-cpu's ops.cpp,
    /// written out in f64): the interpolated angle blended with the
    /// original one by the ramp between the correction dims.
    fn ggml_yarn_theta(y: &Yarn, n_rot: usize, base: f64, pos: f64, i: usize) -> f64 {
        let corr = |beta: f64| {
            n_rot as f64 * (y.orig_context as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let low = corr(y.beta_fast as f64).floor().max(0.0);
        let high = corr(y.beta_slow as f64).ceil().min(n_rot as f64 - 1.0);
        let extrap = pos * base.powf(-2.0 * i as f64 / n_rot as f64);
        let interp = extrap / y.factor as f64;
        let ramp = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let mix = ramp * y.ext_factor as f64;
        interp * (1.0 - mix) + extrap * mix
    }

    /// YaRN as gpt-oss has it (factor 32 over 4096 positions, betas 32 and
    /// 1, base 150 000, 64 rotated dims): correction dims 8 and 18, a
    /// factor table whose angles are ggml's `rope_yarn` angles at every
    /// pair and position, and llama.cpp's magnitude 0.1 ln 32 + 1; linear
    /// scaling off; refused for architectures without it.
    #[test]
    fn yarn_turns_into_llama_cpps_angles() {
        let md = with(
            &metadata("llama"),
            &[
                ("llama.rope.freq_base", Some(MetaValue::F32(150_000.0))),
                (
                    "llama.rope.scaling.type",
                    Some(MetaValue::String("yarn".into())),
                ),
                ("llama.rope.scaling.factor", Some(MetaValue::F32(32.0))),
                (
                    "llama.rope.scaling.original_context_length",
                    Some(MetaValue::U32(4096)),
                ),
                (
                    "llama.rope.scaling.yarn_beta_fast",
                    Some(MetaValue::F32(32.0)),
                ),
                (
                    "llama.rope.scaling.yarn_beta_slow",
                    Some(MetaValue::F32(1.0)),
                ),
            ],
        );
        let cfg = ModelConfig::try_from(&md).unwrap();
        let y = cfg.rope_yarn.unwrap();
        assert_eq!(cfg.rope_freq_scale, 1.0);
        assert!((cfg.rope_attn_factor - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
        let n_rot = 64;
        assert_eq!(y.corr_dims(n_rot, 150_000.0), (8.0, 18.0));
        let factors = y.freq_factors(n_rot, 150_000.0);
        assert_eq!(factors.len(), 32);
        assert_eq!(
            (factors[0], factors[8], factors[18], factors[31]),
            (1.0, 1.0, 32.0, 32.0)
        );
        let inv = crate::model::ops::rope_inv_freqs(150_000.0, n_rot, Some(&factors));
        for pos in [1.0, 7.0, 130.0, 4095.0, 100_000.0] {
            for (i, f) in inv.iter().enumerate() {
                let want = ggml_yarn_theta(&y, n_rot, 150_000.0, pos, i);
                let got = pos * f;
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                    "pos {pos} pair {i}: {got} vs {want}"
                );
            }
        }
        let missing = with(&md, &[("llama.rope.scaling.original_context_length", None)]);
        let err = ModelConfig::try_from(&missing).unwrap_err();
        assert!(err.to_string().contains("original_context_length"), "{err}");
        let phi3 = with(
            &metadata("phi3"),
            &[(
                "phi3.rope.scaling.type",
                Some(MetaValue::String("yarn".into())),
            )],
        );
        let err = ModelConfig::try_from(&phi3).unwrap_err();
        assert!(err.to_string().contains("not supported for phi3"), "{err}");
    }
}
