//! The transformer's hyperparameters ([`ModelConfig`]), read and bounded
//! from the metadata's keys.

use crate::gguf::Metadata;
use crate::model::config::attention::{head_dim, sliding_window};
use crate::model::config::rope::{yarn, Yarn};
use crate::model::config::{Architecture, ConfigError, RopeStyle};

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
    /// Experts in place of a dense feed-forward (gpt-oss, qwen3moe).
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

    /// The RoPE scaling of layer `il`: Gemma 3's windowed layers keep their
    /// trained positions (llama.cpp's `rope_freq_scale_train_swa`, 1); every
    /// other layer takes the file's.
    pub fn rope_scale(&self, il: usize) -> f32 {
        match (self.architecture, self.window(il)) {
            (Architecture::Gemma3, Some(_)) => 1.0,
            _ => self.rope_freq_scale,
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
        let norm_eps = if architecture.layer_norm() {
            md.get_f32(&key("attention.layer_norm_epsilon"))?
        } else {
            md.get_f32(&key("attention.layer_norm_rms_epsilon"))?
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
        let moe = match architecture.has_experts() {
            true => {
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
            false => None,
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

/// Most experts a file may claim (gpt-oss-120b has 128; each sizes tables).
const MAX_EXPERTS: u64 = 1024;

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
