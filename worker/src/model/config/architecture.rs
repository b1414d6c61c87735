//! The architectures this worker runs and the choices each one fixes
//! (rotary layout, QKV biases, the kind of norm).

use crate::model::config::ConfigError;

/// The architectures this worker runs (M0-W-1212).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    /// Qwen3 dense: llama's block with RMSNorm on each head of Q and K
    /// before RoPE, no QKV biases, heads from `attention.key_length`.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, a mixture of experts (SwiGLU, no
    /// biases, no shared expert) in place of the feed-forward.
    Qwen3Moe,
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
            "qwen3" => Ok(Architecture::Qwen3),
            "qwen3moe" => Ok(Architecture::Qwen3Moe),
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
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Gpt2 => "gpt2",
            Architecture::GptOss => "gpt-oss",
        }
    }

    /// The rotary layout llama.cpp assigns to the architecture
    /// (`llama_model_rope_type`): `llama` GGUF files store Q/K rows permuted
    /// for adjacent pairs; `qwen2`, `qwen3`, `gemma3` and `phi3` (like gpt-oss) rotate
    /// halves (NEOX), as `qwen3moe` does. `gpt2` has no RoPE (learned positions).
    /// Position 0 is unaffected by either, so a wrong choice only shows from
    /// the second token on.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Architecture::Llama | Architecture::Gpt2 => RopeStyle::Normal,
            Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::Gemma3
            | Architecture::Phi3
            | Architecture::GptOss => RopeStyle::Neox,
        }
    }

    /// Qwen2 adds biases to Q, K and V; their large values are real.
    pub fn has_qkv_bias(self) -> bool {
        matches!(self, Architecture::Qwen2)
    }

    /// Qwen3 norms each head of Q and K (`attn_q_norm`, `attn_k_norm`)
    /// before RoPE; in the llama family only it (Gemma 3 has its own graph).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Architecture::Qwen3 | Architecture::Qwen3Moe)
    }

    /// The architectures whose feed-forward is a mixture of experts
    /// (`expert_count` and friends in the file).
    pub fn has_experts(self) -> bool {
        matches!(self, Architecture::Qwen3Moe | Architecture::GptOss)
    }

    /// GPT-2 normalises with LayerNorm (a weight and a bias, its own
    /// epsilon key); every other architecture here with RMSNorm.
    pub fn layer_norm(self) -> bool {
        matches!(self, Architecture::Gpt2)
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
