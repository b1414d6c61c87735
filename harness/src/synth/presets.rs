//! The named shapes `harness synth-model --preset` writes: each one's
//! architecture, hyperparameters and vocabulary source, and the published
//! shapes the real-size ones copy.

use anyhow::{anyhow, Result};

use super::blocks::Format;
use super::harmony;

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

/// Shapes from the models' public `config.json`; the tiny ones are made up
/// but keep a real vocabulary (SmolLM2's, Qwen2's), so their tokenizers and
/// LM heads are real-sized.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "tiny-llama",
        arch: Arch::Llama,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 49152,
        context: 2048,
        rope_base: 10_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // tiny-llama with Mistral Nemo's explicit head size: 4 heads of 128
    // over 256 wide (`attention.key_length`), as Mistral-Nemo's 32 of 128
    // over 5120.
    Preset {
        name: "tiny-mistral",
        arch: Arch::Llama,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 49152,
        context: 2048,
        rope_base: 1_000_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: None,
    },
    Preset {
        name: "tiny-qwen2",
        arch: Arch::Qwen2,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 151_936,
        context: 2048,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: true,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // Phi-3-mini's layout and vocabulary size, small.
    // tiny-qwen2's size with Qwen3's layout: heads of 128, twice
    // n_embd / n_head as on Qwen3-0.6B, normed per head.
    Preset {
        name: "tiny-qwen3",
        arch: Arch::Qwen3,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 151_936,
        context: 2048,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: true,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: None,
    },
    // tiny-qwen3 with Qwen3-MoE's feed-forward: 4 of 16 experts of 256.
    Preset {
        name: "tiny-qwen3moe",
        arch: Arch::Qwen3Moe,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 151_936,
        context: 2048,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: true,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: Some(Moe {
            experts: 16,
            used: 4,
            n_ff: 256,
        }),
    },
    Preset {
        name: "tiny-phi3",
        arch: Arch::Phi3,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 512,
        vocab: 32064,
        context: 2048,
        rope_base: 10_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Spm,
        sliding_window: 2047,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // GPT-2's layout and vocabulary size, small.
    Preset {
        name: "tiny-gpt2",
        arch: Arch::Gpt2,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 1024,
        vocab: 50257,
        context: 1024,
        rope_base: 0.0,
        norm_eps: 1e-5,
        tied: true,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // HuggingFaceTB/SmolLM2-135M.
    Preset {
        name: "smollm2",
        arch: Arch::Llama,
        n_embd: 576,
        n_layer: 30,
        n_head: 9,
        n_head_kv: 3,
        n_ff: 1536,
        vocab: 49152,
        context: 8192,
        rope_base: 100_000.0,
        norm_eps: 1e-5,
        tied: true,
        default_format: Format::Q4_1,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // Qwen/Qwen2.5-0.5B.
    Preset {
        name: "qwen2.5-0.5b",
        arch: Arch::Qwen2,
        n_embd: 896,
        n_layer: 24,
        n_head: 14,
        n_head_kv: 2,
        n_ff: 4864,
        vocab: 151_936,
        context: 32768,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: true,
        default_format: Format::Q4_1,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // Qwen/Qwen3-0.6B: heads of 128 over a 1024-wide model, tied head.
    Preset {
        name: "qwen3-0.6b",
        arch: Arch::Qwen3,
        n_embd: 1024,
        n_layer: 28,
        n_head: 16,
        n_head_kv: 8,
        n_ff: 3072,
        vocab: 151_936,
        context: 40_960,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: true,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: None,
    },
    // Qwen/Qwen3-8B.
    Preset {
        name: "qwen3-8b",
        arch: Arch::Qwen3,
        n_embd: 4096,
        n_layer: 36,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 12_288,
        vocab: 151_936,
        context: 40_960,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: false,
        default_format: Format::Q4K,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: None,
    },
    // Qwen/Qwen3-30B-A3B: 30.5 B parameters (3.3 B active), 8 of 128
    // experts of 768 a token.
    Preset {
        name: "qwen3-30b-a3b",
        arch: Arch::Qwen3Moe,
        n_embd: 2048,
        n_layer: 48,
        n_head: 32,
        n_head_kv: 4,
        n_ff: 6144,
        vocab: 151_936,
        context: 40_960,
        rope_base: 1_000_000.0,
        norm_eps: 1e-6,
        tied: false,
        default_format: Format::Q4K,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: Some(Moe {
            experts: 128,
            used: 8,
            n_ff: 768,
        }),
    },
    // mistralai/Mistral-Nemo-Instruct-2407: 12.2 B parameters, heads of 128
    // over 5120 wide (32 of them make 4096), a 1,024,000-token context.
    Preset {
        name: "mistral-nemo-12b",
        arch: Arch::Llama,
        n_embd: 5120,
        n_layer: 40,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14_336,
        vocab: 131_072,
        context: 1_024_000,
        rope_base: 1_000_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q4K,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 128,
        moe: None,
    },
    // meta-llama/Meta-Llama-3-8B.
    Preset {
        name: "llama-3-8b",
        arch: Arch::Llama,
        n_embd: 4096,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14336,
        vocab: 128_256,
        context: 8192,
        rope_base: 500_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q4_1,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // meta-llama/Llama-3.1-8B: llama-3-8b's shape with the 131,072-token
    // context and Llama 3.1's RoPE (issue 45's long-context shape).
    Preset {
        name: "llama-3.1-8b",
        arch: Arch::Llama,
        n_embd: 4096,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 8,
        n_ff: 14336,
        vocab: 128_256,
        context: 131_072,
        rope_base: 500_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q4_1,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::Llama3,
        head_dim: 0,
        moe: None,
    },
    // meta-llama/Llama-3.2-3B (context cut to 8192): 3.2 B parameters, 2.0 GB in Q4_1.
    Preset {
        name: "llama-2gb",
        arch: Arch::Llama,
        n_embd: 3072,
        n_layer: 28,
        n_head: 24,
        n_head_kv: 8,
        n_ff: 8192,
        vocab: 128_256,
        context: 8192,
        rope_base: 500_000.0,
        norm_eps: 1e-5,
        tied: true,
        default_format: Format::Q4_1,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // microsoft/Phi-3-mini-4k-instruct: 3.8 B parameters, 2.2 GB in Q4_K.
    Preset {
        name: "phi3",
        arch: Arch::Phi3,
        n_embd: 3072,
        n_layer: 32,
        n_head: 32,
        n_head_kv: 32,
        n_ff: 8192,
        vocab: 32064,
        context: 4096,
        rope_base: 10_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q4K,
        vocab_source: Vocab::Spm,
        sliding_window: 2047,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // openai-community/gpt2 (124 M; the converter writes no `output.weight`).
    Preset {
        name: "gpt2",
        arch: Arch::Gpt2,
        n_embd: 768,
        n_layer: 12,
        n_head: 12,
        n_head_kv: 12,
        n_ff: 3072,
        vocab: 50257,
        context: 1024,
        rope_base: 0.0,
        norm_eps: 1e-5,
        tied: true,
        default_format: Format::Q4K,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // tiny-llama with every matrix in MXFP4 (M0-W-1435: the format in an
    // architecture other than gpt-oss, whose experts carry it).
    Preset {
        name: "llama-mxfp4",
        arch: Arch::Llama,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 49152,
        context: 2048,
        rope_base: 10_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Mxfp4,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::None,
        head_dim: 0,
        moe: None,
    },
    // tiny-llama with Llama 3.1's RoPE: base 500 000 and `rope_freqs`.
    Preset {
        name: "tiny-llama3.1",
        arch: Arch::Llama,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 512,
        vocab: 49152,
        context: 2048,
        rope_base: 500_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Reference,
        sliding_window: 0,
        rope_scaling: RopeScaling::Llama3,
        head_dim: 0,
        moe: None,
    },
    // tiny-phi3 with Phi-3-mini-128k's LongRoPE, scaled down: a context of
    // 4096 over 1024 trained positions (so the long table applies).
    Preset {
        name: "tiny-phi3-128k",
        arch: Arch::Phi3,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 512,
        vocab: 32064,
        context: 4096,
        rope_base: 10_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Spm,
        sliding_window: 2047,
        rope_scaling: RopeScaling::LongRope { orig: 1024 },
        head_dim: 0,
        moe: None,
    },
    // A gpt-oss of the real layout and vocabulary, small (CPU tests).
    Preset {
        name: "gpt-oss",
        arch: Arch::GptOss,
        n_embd: 256,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 256,
        vocab: harmony::VOCAB,
        context: 131_072,
        rope_base: 150_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Harmony,
        sliding_window: 128,
        rope_scaling: GPT_OSS_YARN,
        head_dim: 64,
        moe: Some(Moe {
            experts: 4,
            used: 2,
            n_ff: 256,
        }),
    },
    // openai/gpt-oss-20b: 20.9 B parameters (3.6 B active), 12.1 GB with the
    // experts in MXFP4 and the rest in Q8_0.
    Preset {
        name: "gpt-oss-20b",
        arch: Arch::GptOss,
        n_embd: 2880,
        n_layer: 24,
        n_head: 64,
        n_head_kv: 8,
        n_ff: 2880,
        vocab: harmony::VOCAB,
        context: 131_072,
        rope_base: 150_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Harmony,
        sliding_window: 128,
        rope_scaling: GPT_OSS_YARN,
        head_dim: 64,
        moe: Some(Moe {
            experts: 32,
            used: 4,
            n_ff: 2880,
        }),
    },
    // openai/gpt-oss-120b: 116.8 B parameters (5.1 B active), 63 GB.
    Preset {
        name: "gpt-oss-120b",
        arch: Arch::GptOss,
        n_embd: 2880,
        n_layer: 36,
        n_head: 64,
        n_head_kv: 8,
        n_ff: 2880,
        vocab: harmony::VOCAB,
        context: 131_072,
        rope_base: 150_000.0,
        norm_eps: 1e-5,
        tied: false,
        default_format: Format::Q8_0,
        vocab_source: Vocab::Harmony,
        sliding_window: 128,
        rope_scaling: GPT_OSS_YARN,
        head_dim: 64,
        moe: Some(Moe {
            experts: 128,
            used: 4,
            n_ff: 2880,
        }),
    },
];

/// gpt-oss's `rope_scaling`.
const GPT_OSS_YARN: RopeScaling = RopeScaling::Yarn {
    factor: 32.0,
    orig: 4096,
    beta_fast: 32.0,
    beta_slow: 1.0,
};

pub fn preset(name: &str) -> Result<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        let known: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
        anyhow!("unknown preset {name:?}; known: {}", known.join(", "))
    })
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
