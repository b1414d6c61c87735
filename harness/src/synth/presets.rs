//! The named shapes `harness synth-model --preset` writes: what a preset
//! states (architecture, hyperparameters, vocabulary source, RoPE scaling,
//! experts); the table and the lookup by name are `preset_table.rs`.

use super::blocks::Format;

/// The model families the worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    /// Llama with Q/K/V biases and NEOX RoPE (the worker decides the RoPE style).
    Qwen2,
    /// Qwen3 dense: llama's block with RMSNorm on each head of Q and K
    /// (`attn_q_norm`, `attn_k_norm`), no biases, `attention.key_length`
    /// heads (128, wider than `n_embd / n_head` on the small sizes).
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, then an F32 router (`ffn_gate_inp`, no
    /// bias) over experts whose gate, up and down matrices are 3-D tensors
    /// (`ffn_*_exps`, no biases) in place of the dense feed-forward.
    Qwen3Moe,
    /// Fused `attn_qkv` (Q|K|V rows) and `ffn_up` (gate|up rows), RMSNorm,
    /// NEOX RoPE, `attention.sliding_window` (which llama.cpp ignores for phi3).
    Phi3,
    /// LayerNorm with biases, learned `position_embd`, fused `attn_qkv` with a
    /// bias, biases on every matrix, GELU, LM head tied to `token_embd`.
    Gpt2,
    /// gpt-oss (llama.cpp's `openai-moe`): Q/K/V and output with biases,
    /// per-head attention sinks, `post_attention_norm`, a biased router over
    /// experts whose gate, up and down matrices (MXFP4) and biases are 3-D and
    /// 2-D tensors; YaRN RoPE, sliding-window layers.
    GptOss,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Phi3 => "phi3",
            Arch::Gpt2 => "gpt2",
            Arch::GptOss => "gpt-oss",
        }
    }
}

/// Where a preset's `tokenizer.*` metadata comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vocab {
    /// The reference model's (`--reference`, SmolLM2's byte-level BPE), padded
    /// to the preset's size.
    Reference,
    /// A SentencePiece file's (`--spm-reference`, Gemma 3's), cut to the
    /// preset's size (`spm_tokenizer_kvs`).
    Spm,
    /// gpt-oss's `o200k_harmony` (`harmony`): no reference file.
    Harmony,
}

/// The file `--spm-reference` defaults to, in `.models/` beside the reference
/// model (`ci/fetch-model gemma3` puts it there).
pub const SPM_REFERENCE_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// The RoPE frequency factors a preset's file carries, as llama.cpp's
/// converter writes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Llama 3.1's `rope_freqs.weight` (no keys).
    Llama3,
    /// Phi-3's LongRoPE: `rope_factors_long` / `_short`,
    /// `rope.scaling.original_context_length` = `orig` and
    /// `rope.scaling.attn_factor` = sqrt(1 + ln(context / orig) / ln(orig)).
    LongRope {
        orig: u32,
    },
    /// YaRN, as gpt-oss's `config.json` has it: `rope.scaling.type` yarn,
    /// its factor, original context and beta_fast / beta_slow.
    Yarn {
        factor: f32,
        orig: u32,
        beta_fast: f32,
        beta_slow: f32,
    },
}

/// A mixture-of-experts feed-forward: `experts` of `n_ff` rows each,
/// `used` of them a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub experts: u64,
    pub used: u64,
    pub n_ff: u64,
}

/// A named model shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub arch: Arch,
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_ff: u64,
    pub vocab: u64,
    pub context: u32,
    /// Unused by gpt2 (learned positions, no RoPE key).
    pub rope_base: f32,
    /// RMSNorm's epsilon, or LayerNorm's for gpt2.
    pub norm_eps: f32,
    /// The LM head is `token_embd` (no `output.weight`).
    pub tied: bool,
    pub default_format: Format,
    pub vocab_source: Vocab,
    /// `attention.sliding_window` (phi3 only; 0: no key).
    pub sliding_window: u32,
    pub rope_scaling: RopeScaling,
    /// Values per attention head (0: `n_embd / n_head`; gpt-oss's 64, Qwen3's
    /// and Mistral Nemo's 128 are not), written as `attention.key_length`.
    pub head_dim: u64,
    /// Experts in place of the dense feed-forward (gpt-oss, qwen3moe).
    pub moe: Option<Moe>,
}

impl Preset {
    /// Values per attention head.
    pub fn head_dim(&self) -> u64 {
        if self.head_dim == 0 {
            self.n_embd / self.n_head
        } else {
            self.head_dim
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct Options {
    pub preset: &'static Preset,
    pub format: Format,
    pub seed: u64,
    /// Worker threads for generation; the output does not depend on it.
    pub threads: usize,
}
