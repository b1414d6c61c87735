//! `harness synth-model`: random-weight GGUF files of named, real model shapes,
//! for scenarios that need an architecture or a size the reference model does
//! not have (qwen2, phi3, gpt2, Llama-3-8B, a 2 GB file, every weight format).
//!
//! A file is the preset's hyperparameters (for phi3 and gpt2 exactly the keys
//! llama.cpp's `convert_hf_to_gguf.py` writes for them), a vocabulary, and
//! llama.cpp-named tensors (the converter's names, shapes and fusions) whose
//! bytes come from `blocks`. The vocabulary is the reference model's
//! `tokenizer.*` metadata (SmolLM2's byte-level BPE) padded to the preset's
//! size with unused `[PAD<id>]` tokens, as llama.cpp's converter pads Qwen2's;
//! or, for the phi3 presets, a SentencePiece vocabulary cut from another file
//! (`--spm-reference`: Gemma 3's 262,144 pieces, the first 32,064 of which hold
//! the 256 byte-fallback tokens, the special ones and the best-scored pieces),
//! with a Phi-3 file's tokenizer keys; or, for the gpt-oss presets, o200k_harmony from tiktoken-rs
//! (`harmony`), their experts written straight in MXFP4 and the rest in the format asked for
//! (Q8_0 by default, as llama.cpp's own gpt-oss files). The bytes are a function of (preset, format, seed) alone: each
//! 8192-value chunk of each tensor has its own random stream, so any number of
//! threads writes the same file.
//!
//! Writing streams: the header is computed first (every size is known), then
//! each tensor is generated window by window in parallel and handed to a
//! writer thread, so memory stays at a few windows whatever the file size.
//! The file appears under its name only when complete (`FILE.part`, renamed).
//!
//! Default formats: the tiny presets are Q8_0 (close to the float model, fast
//! on the CPU); the real shapes are Q4_1, the reference model's type, so the
//! large files stay small on disk (Llama-3-8B about 5 GB) and run the same
//! kernels as the goldens; phi3 and gpt2 are Q4_K, the format of their
//! llama.cpp goldens (testdata/golden-synth, which has the tiny ones in Q8_0,
//! Q4_K and F16). Norm weights and biases are F32 in every format, as in
//! llama.cpp's files (and gpt2's `position_embd`, which llama.cpp never quantizes).
//!
//! Like `gguf`, this deliberately does not use the worker's writer or quantizer.

pub mod blocks;
pub mod harmony;

use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};

pub use blocks::{FactorTable, Format, Init};

use crate::gguf::{Gguf, Kv};

/// Tensor data alignment (`general.alignment`).
pub const ALIGNMENT: u64 = 32;
/// Values per independent random stream: a multiple of every block size.
const CHUNK_VALUES: u64 = 8192;
/// Bytes generated per window (split among the threads, then written).
const WINDOW_BYTES: u64 = 32 << 20;

/// The model families the worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    /// Llama with Q/K/V biases and NEOX RoPE (the worker decides the RoPE style).
    Qwen2,
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
    /// Values per attention head (0: `n_embd / n_head`; gpt-oss's 64 is not).
    pub head_dim: u64,
    /// Experts in place of the dense feed-forward (gpt-oss).
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

/// One tensor to write.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: `[cols, rows]` for a matrix (ne0, the row length, first).
    pub dims: Vec<u64>,
    pub format: Format,
    pub init: Init,
}

impl TensorSpec {
    pub fn values(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        self.format.bytes_for(self.values())
    }
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

/// Every tensor of `p` in file order, llama.cpp's names and shapes, matrices
/// in `format` (or its fallback for their row length). Vectors (norms,
/// biases) and gpt2's `position_embd` are F32 in every format, as llama.cpp's
/// converter writes them and its quantizer leaves them.
pub fn tensors(p: &Preset, format: Format) -> Vec<TensorSpec> {
    let head_dim = p.head_dim();
    let (q_dim, kv_dim) = (p.n_head * head_dim, p.n_head_kv * head_dim);
    // Deviation 1/√cols keeps each product's output near unit scale.
    let matrix = |name: String, rows: u64, cols: u64| TensorSpec {
        name,
        dims: vec![cols, rows],
        format: format.for_row(cols),
        init: Init::Matrix {
            std: 1.0 / (cols as f32).sqrt(),
        },
    };
    let vector = |name: String, len: u64, init: Init| TensorSpec {
        name,
        dims: vec![len],
        format: Format::F32,
        init,
    };
    // The converter writes the factor tables first (generate_extra_tensors).
    let half = head_dim / 2;
    let factors = |name: &str, table| vector(name.into(), half, Init::Factors(table));
    let mut t = match p.rope_scaling {
        RopeScaling::None | RopeScaling::Yarn { .. } => Vec::new(),
        RopeScaling::Llama3 => vec![factors(
            "rope_freqs.weight",
            FactorTable::Llama3 {
                base: p.rope_base,
                n_rot: head_dim as u32,
            },
        )],
        RopeScaling::LongRope { .. } => vec![
            factors("rope_factors_long.weight", FactorTable::LongRopeLong),
            factors("rope_factors_short.weight", FactorTable::LongRopeShort),
        ],
    };
    t.push(matrix("token_embd.weight".into(), p.vocab, p.n_embd));
    if p.arch == Arch::Gpt2 {
        t.push(TensorSpec {
            name: "position_embd.weight".into(),
            dims: vec![p.n_embd, u64::from(p.context)],
            format: Format::F32,
            init: Init::Matrix {
                std: 1.0 / (p.n_embd as f32).sqrt(),
            },
        });
    }
    // gpt2's LayerNorms and matrices all have biases.
    let biased = p.arch == Arch::Gpt2;
    for i in 0..p.n_layer {
        if let (Arch::GptOss, Some(moe)) = (p.arch, p.moe) {
            t.extend(gpt_oss_layer(p, moe, i, format));
            continue;
        }
        let n = |s: &str| format!("blk.{i}.{s}");
        let norm = |t: &mut Vec<TensorSpec>, s: &str| {
            t.push(vector(n(&format!("{s}.weight")), p.n_embd, Init::Norm));
            if biased {
                t.push(vector(n(&format!("{s}.bias")), p.n_embd, Init::Bias));
            }
        };
        let linear = |t: &mut Vec<TensorSpec>, s: &str, rows: u64, cols: u64| {
            t.push(matrix(n(&format!("{s}.weight")), rows, cols));
            if biased {
                t.push(vector(n(&format!("{s}.bias")), rows, Init::Bias));
            }
        };
        norm(&mut t, "attn_norm");
        match p.arch {
            Arch::Llama | Arch::Qwen2 => {
                for (m, rows) in [("q", q_dim), ("k", kv_dim), ("v", kv_dim)] {
                    t.push(matrix(n(&format!("attn_{m}.weight")), rows, p.n_embd));
                    if p.arch == Arch::Qwen2 {
                        t.push(vector(n(&format!("attn_{m}.bias")), rows, Init::Bias));
                    }
                }
            }
            Arch::Phi3 | Arch::Gpt2 => {
                linear(&mut t, "attn_qkv", q_dim + 2 * kv_dim, p.n_embd);
            }
            Arch::GptOss => unreachable!("written by gpt_oss_layer"),
        }
        linear(&mut t, "attn_output", p.n_embd, q_dim);
        norm(&mut t, "ffn_norm");
        match p.arch {
            Arch::Llama | Arch::Qwen2 => {
                t.push(matrix(n("ffn_gate.weight"), p.n_ff, p.n_embd));
                t.push(matrix(n("ffn_up.weight"), p.n_ff, p.n_embd));
            }
            // Gate rows, then up rows (llama.cpp's LLM_FFN_SWIGLU split).
            Arch::Phi3 => t.push(matrix(n("ffn_up.weight"), 2 * p.n_ff, p.n_embd)),
            Arch::Gpt2 => linear(&mut t, "ffn_up", p.n_ff, p.n_embd),
            Arch::GptOss => unreachable!("written by gpt_oss_layer"),
        }
        linear(&mut t, "ffn_down", p.n_embd, p.n_ff);
    }
    t.push(vector("output_norm.weight".into(), p.n_embd, Init::Norm));
    if biased {
        t.push(vector("output_norm.bias".into(), p.n_embd, Init::Bias));
    }
    if !p.tied {
        t.push(matrix("output.weight".into(), p.vocab, p.n_embd));
    }
    t
}

/// Layer `i` of a gpt-oss preset, as llama.cpp's `openai-moe` loads it:
/// Q, K, V and the output projection with biases (matrices in `format`),
/// the heads' attention sinks, `post_attention_norm`, the router
/// (`ffn_gate_inp`, F32 as the converter keeps it, with a bias), and the
/// experts' gate, up and down matrices, `[cols, rows, experts]` in MXFP4
/// whatever `format` is (gpt-oss ships them so), each with an F32
/// `[rows, experts]` bias.
fn gpt_oss_layer(p: &Preset, moe: Moe, i: u64, format: Format) -> Vec<TensorSpec> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let (q_dim, kv_dim) = (p.n_head * p.head_dim(), p.n_head_kv * p.head_dim());
    let spec = |name: String, dims: Vec<u64>, format: Format, init: Init| TensorSpec {
        name,
        dims,
        format,
        init,
    };
    let std = |cols: u64| Init::Matrix {
        std: 1.0 / (cols as f32).sqrt(),
    };
    let mut t = vec![spec(
        n("attn_norm.weight"),
        vec![p.n_embd],
        Format::F32,
        Init::Norm,
    )];
    for (m, rows, cols) in [
        ("attn_q", q_dim, p.n_embd),
        ("attn_k", kv_dim, p.n_embd),
        ("attn_v", kv_dim, p.n_embd),
        ("attn_output", p.n_embd, q_dim),
    ] {
        t.push(spec(
            n(&format!("{m}.weight")),
            vec![cols, rows],
            format.for_row(cols),
            std(cols),
        ));
        t.push(spec(
            n(&format!("{m}.bias")),
            vec![rows],
            Format::F32,
            Init::Bias,
        ));
    }
    t.push(spec(
        n("attn_sinks.weight"),
        vec![p.n_head],
        Format::F32,
        Init::Bias,
    ));
    t.push(spec(
        n("post_attention_norm.weight"),
        vec![p.n_embd],
        Format::F32,
        Init::Norm,
    ));
    t.push(spec(
        n("ffn_gate_inp.weight"),
        vec![p.n_embd, moe.experts],
        Format::F32,
        std(p.n_embd),
    ));
    t.push(spec(
        n("ffn_gate_inp.bias"),
        vec![moe.experts],
        Format::F32,
        Init::Bias,
    ));
    for (m, rows, cols) in [
        ("ffn_gate_exps", moe.n_ff, p.n_embd),
        ("ffn_up_exps", moe.n_ff, p.n_embd),
        ("ffn_down_exps", p.n_embd, moe.n_ff),
    ] {
        t.push(spec(
            n(&format!("{m}.weight")),
            vec![cols, rows, moe.experts],
            Format::Mxfp4,
            std(cols),
        ));
        t.push(spec(
            n(&format!("{m}.bias")),
            vec![rows, moe.experts],
            Format::F32,
            Init::Bias,
        ));
    }
    t
}

/// Offsets of each tensor in the data section, and the section's size.
pub fn layout(tensors: &[TensorSpec]) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offsets = tensors
        .iter()
        .map(|t| {
            let o = at.div_ceil(ALIGNMENT) * ALIGNMENT;
            at = o + t.bytes();
            o
        })
        .collect();
    (offsets, at)
}

/// The file whose tokenizer a preset takes: `reference` (the BPE reference
/// model) or `spm_reference`; gpt-oss's comes from tiktoken-rs, and the
/// reference is read but not used.
pub fn tokenizer_source<'a>(p: &Preset, reference: &'a Path, spm_reference: &'a Path) -> &'a Path {
    match p.vocab_source {
        Vocab::Reference | Vocab::Harmony => reference,
        Vocab::Spm => spm_reference,
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

/// What was written.
#[derive(Clone, Debug)]
pub struct Written {
    pub bytes: u64,
    pub tensors: usize,
    pub data_offset: u64,
    pub data_bytes: u64,
    pub seconds: f64,
}

fn kv(key: &str, vtype: u32, raw: Vec<u8>) -> Kv {
    Kv {
        key: key.into(),
        vtype,
        raw,
        at: 0,
    }
}

fn string_raw(s: &str) -> Vec<u8> {
    let mut raw = (s.len() as u64).to_le_bytes().to_vec();
    raw.extend_from_slice(s.as_bytes());
    raw
}

const U32: u32 = 4;
const I32: u32 = 5;
const F32: u32 = 6;
const STRING: u32 = 8;
const ARRAY: u32 = 9;
const U64: u32 = 10;
/// llama.cpp's `LLAMA_TOKEN_TYPE_UNUSED`: never produced by encoding, renders as nothing.
const TOKEN_TYPE_UNUSED: i32 = 5;

/// The reference's `tokenizer.*` entries, token lists padded to `vocab`.
pub fn tokenizer_kvs(reference: &Gguf, vocab: u64) -> Result<Vec<Kv>> {
    let have = reference
        .array_len("tokenizer.ggml.tokens")
        .ok_or_else(|| anyhow!("the reference has no tokenizer.ggml.tokens"))?;
    if have > vocab {
        bail!("the reference vocabulary ({have} tokens) is larger than the preset's ({vocab})");
    }
    let mut out = Vec::new();
    for k in reference
        .kvs
        .iter()
        .filter(|k| k.key.starts_with("tokenizer."))
    {
        let pad: Option<Box<dyn Fn(u64) -> Vec<u8>>> = match k.key.as_str() {
            "tokenizer.ggml.tokens" => Some(Box::new(|id| string_raw(&format!("[PAD{id}]")))),
            "tokenizer.ggml.token_type" => {
                Some(Box::new(|_| TOKEN_TYPE_UNUSED.to_le_bytes().to_vec()))
            }
            "tokenizer.ggml.scores" => Some(Box::new(|_| (-1000f32).to_le_bytes().to_vec())),
            _ => None,
        };
        let Some(pad) = pad.filter(|_| have < vocab) else {
            out.push(k.clone());
            continue;
        };
        let elem = u32::from_le_bytes(k.raw[..4].try_into()?);
        let n = u64::from_le_bytes(k.raw[4..12].try_into()?);
        let want_elem = match k.key.as_str() {
            "tokenizer.ggml.tokens" => STRING,
            "tokenizer.ggml.token_type" => I32,
            _ => F32,
        };
        if k.vtype != ARRAY || elem != want_elem || n != have {
            bail!(
                "{} in the reference is not an array of {have} values of type {want_elem}",
                k.key
            );
        }
        let mut raw = k.raw.clone();
        raw[4..12].copy_from_slice(&vocab.to_le_bytes());
        for id in have..vocab {
            raw.extend(pad(id));
        }
        out.push(kv(&k.key, ARRAY, raw));
    }
    Ok(out)
}

/// SentencePiece token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_NORMAL: i32 = 1;
const BOOL: u32 = 7;

/// The elements of array `key` of `g`, each as its raw bytes (a string's
/// without its length), checking the element type.
fn array_elems(g: &Gguf, key: &str, elem: u32) -> Result<Vec<Vec<u8>>> {
    let k = g
        .kv(key)
        .ok_or_else(|| anyhow!("the SentencePiece reference has no {key}"))?;
    let bad = || anyhow!("{key} in the SentencePiece reference is not an array of type {elem}");
    if k.vtype != ARRAY || k.raw.len() < 12 || u32::from_le_bytes(k.raw[..4].try_into()?) != elem {
        return Err(bad());
    }
    let n = u64::from_le_bytes(k.raw[4..12].try_into()?);
    let mut at = 12usize;
    let mut out = Vec::with_capacity(usize::try_from(n)?);
    for _ in 0..n {
        let (start, len) = if elem == STRING {
            let len = k.raw.get(at..at + 8).ok_or_else(bad)?;
            (
                at + 8,
                usize::try_from(u64::from_le_bytes(len.try_into()?))?,
            )
        } else {
            (at, 4)
        };
        out.push(k.raw.get(start..start + len).ok_or_else(bad)?.to_vec());
        at = start + len;
    }
    Ok(out)
}

fn array_raw(elem: u32, items: impl ExactSizeIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut raw = elem.to_le_bytes().to_vec();
    raw.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for i in items {
        raw.extend(i);
    }
    raw
}

/// Which ids of a SentencePiece vocabulary (its pieces, token types and
/// scores) to keep for a `vocab`-token one, in their original relative order
/// (the caller renumbers them). A smaller vocabulary is kept whole (and padded
/// by the caller).
///
/// The cut is closed, as every real SentencePiece BPE vocabulary is: every
/// kept piece of two or more characters splits into two kept pieces, down to
/// single characters, so a tokenizer whose merges are derived from the
/// pieces (Hugging Face's, the worker's `gguf-spm`) reaches every piece that
/// llama.cpp's character-level merging reaches. Kept, in this order:
/// 1. every non-normal token (control, byte, user-defined, unknown, unused)
///    and the special ids (an error when they alone exceed `vocab`);
/// 2. every normal single-character piece (one Unicode scalar, `▁` included),
///    or the highest-scored of them when they do not all fit;
/// 3. the highest-scored remaining normal pieces that split, at some
///    character boundary, into two kept normal pieces; a piece that does not
///    is skipped and the next one tried.
///
/// Step 3 takes candidates in descending score order, so a piece's parts
/// are decided before it. In Gemma 3's vocabulary (the phi3 presets'
/// reference) the merged pieces' scores fall strictly with their ids
/// (494..236742), and every merged piece splits into single characters or
/// merged pieces of higher score; the single characters come last (ids
/// 236743 on, the lowest scores of all), as SentencePiece's BPE trainer
/// writes them, which is why step 2 keeps them whatever their score.
pub fn spm_selection(
    tokens: &[Vec<u8>],
    types: &[i32],
    scores: &[f32],
    specials: &[u64],
    vocab: u64,
) -> Result<Vec<usize>> {
    let n = usize::try_from(vocab)?;
    if types.len() <= n {
        return Ok((0..types.len()).collect());
    }
    let mut keep: Vec<bool> = types.iter().map(|&t| t != TOKEN_TYPE_NORMAL).collect();
    for &id in specials {
        if let Some(k) = keep.get_mut(id as usize) {
            *k = true;
        }
    }
    let mut kept = keep.iter().filter(|&&k| k).count();
    if kept > n {
        bail!("the SentencePiece reference has {kept} control, byte and special tokens, more than the preset's {n}");
    }
    let piece = |id: usize| std::str::from_utf8(&tokens[id]).ok();
    let by_score = |ids: &mut Vec<usize>| {
        ids.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    };
    let normal = |id: usize| types[id] == TOKEN_TYPE_NORMAL;
    // The kept normal pieces, by text: what a longer piece may be built from.
    let mut pieces: std::collections::HashSet<&str> = (0..types.len())
        .filter(|&id| keep[id] && normal(id))
        .filter_map(piece)
        .collect();
    let single = |id: usize| piece(id).is_some_and(|s| s.chars().count() == 1);
    let mut singles: Vec<usize> = (0..types.len())
        .filter(|&id| !keep[id] && normal(id) && single(id))
        .collect();
    by_score(&mut singles);
    for &id in singles.iter().take(n - kept) {
        keep[id] = true;
        pieces.insert(piece(id).unwrap());
        kept += 1;
    }
    let mut rest: Vec<usize> = (0..types.len())
        .filter(|&id| !keep[id] && normal(id) && !single(id))
        .collect();
    by_score(&mut rest);
    for id in rest {
        if kept == n {
            break;
        }
        let Some(s) = piece(id) else { continue };
        let reachable = s
            .char_indices()
            .skip(1)
            .any(|(at, _)| pieces.contains(&s[..at]) && pieces.contains(&s[at..]));
        if reachable {
            keep[id] = true;
            pieces.insert(s);
            kept += 1;
        }
    }
    Ok((0..types.len()).filter(|&id| keep[id]).collect())
}

/// A Phi-3 file's `tokenizer.*` entries (as `convert_hf_to_gguf.py`'s
/// `Phi3MiniModel.set_vocab` writes them: model `llama`, pre `default`,
/// tokens, scores, types, the special ids, `add_bos_token` true and
/// `add_eos_token` false, no `add_space_prefix`, so llama.cpp's SentencePiece
/// default, true, applies) over the pieces of `reference`, cut to `vocab`
/// tokens by `spm_selection` or padded with unused `[PAD<id>]` tokens as the
/// converter pads Phi-3's 32011 to 32064.
pub fn spm_tokenizer_kvs(reference: &Gguf, vocab: u64) -> Result<Vec<Kv>> {
    if reference.string("tokenizer.ggml.model").as_deref() != Some("llama") {
        bail!("the SentencePiece reference's tokenizer.ggml.model is not \"llama\"");
    }
    let tokens = array_elems(reference, "tokenizer.ggml.tokens", STRING)?;
    let to_f32 = |b: Vec<u8>| f32::from_le_bytes(b.try_into().unwrap());
    let to_i32 = |b: Vec<u8>| i32::from_le_bytes(b.try_into().unwrap());
    let scores: Vec<f32> = array_elems(reference, "tokenizer.ggml.scores", F32)?
        .into_iter()
        .map(to_f32)
        .collect();
    let types: Vec<i32> = array_elems(reference, "tokenizer.ggml.token_type", I32)?
        .into_iter()
        .map(to_i32)
        .collect();
    if scores.len() != tokens.len() || types.len() != tokens.len() {
        bail!("the SentencePiece reference's tokens, scores and types differ in length");
    }
    const IDS: [&str; 4] = [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
    ];
    let specials: Vec<(&str, u64)> = IDS
        .iter()
        .filter_map(|&k| Some((k, reference.u64_value(k)?)))
        .collect();
    let ids: Vec<u64> = specials.iter().map(|s| s.1).collect();
    let keep = spm_selection(&tokens, &types, &scores, &ids, vocab)?;
    let pad = usize::try_from(vocab)? - keep.len();
    let new_id = |old: u64| keep.iter().position(|&k| k as u64 == old);

    let mut out = vec![
        kv("tokenizer.ggml.model", STRING, string_raw("llama")),
        kv("tokenizer.ggml.pre", STRING, string_raw("default")),
    ];
    let n = keep.len();
    let token_items = keep
        .iter()
        .map(|&id| {
            let mut r = (tokens[id].len() as u64).to_le_bytes().to_vec();
            r.extend_from_slice(&tokens[id]);
            r
        })
        .chain((n..n + pad).map(|id| string_raw(&format!("[PAD{id}]"))));
    let token_items: Vec<Vec<u8>> = token_items.collect();
    out.push(kv(
        "tokenizer.ggml.tokens",
        ARRAY,
        array_raw(STRING, token_items.into_iter()),
    ));
    let score_items: Vec<Vec<u8>> = keep
        .iter()
        .map(|&id| scores[id])
        .chain(std::iter::repeat_n(-10_000.0f32, pad))
        .map(|s| s.to_le_bytes().to_vec())
        .collect();
    out.push(kv(
        "tokenizer.ggml.scores",
        ARRAY,
        array_raw(F32, score_items.into_iter()),
    ));
    let type_items: Vec<Vec<u8>> = keep
        .iter()
        .map(|&id| types[id])
        .chain(std::iter::repeat_n(TOKEN_TYPE_UNUSED, pad))
        .map(|t| t.to_le_bytes().to_vec())
        .collect();
    out.push(kv(
        "tokenizer.ggml.token_type",
        ARRAY,
        array_raw(I32, type_items.into_iter()),
    ));
    for (key, old) in specials {
        let id = new_id(old).ok_or_else(|| anyhow!("{key} {old} was not kept"))?;
        out.push(kv(key, U32, u32::try_from(id)?.to_le_bytes().to_vec()));
    }
    out.push(kv("tokenizer.ggml.add_bos_token", BOOL, vec![1]));
    out.push(kv("tokenizer.ggml.add_eos_token", BOOL, vec![0]));
    Ok(out)
}

/// `general.name`: `synthetic-<preset>`, but `phi 3` for `phi3`. llama.cpp
/// (llama-vocab.cpp) sets Phi-3's special-token attributes when the lowercased
/// name holds `phi3` or `phi-3`, looking up `</s>` and `<|endoftext|>` by text:
/// a vocabulary without them (Gemma's) then fails to load. llama.cpp's
/// converter names Phi-3-mini `Phi 3 Mini 4k Instruct`, which it does not
/// match either.
pub fn general_name(p: &Preset) -> String {
    format!("synthetic-{}", p.name).replace("phi3", "phi 3")
}

/// `general.file_type`: the format's, but `MOSTLY_MXFP4_MOE` (38) for the
/// gpt-oss presets, whose experts are MXFP4 in every format (what llama.cpp's
/// converter records for an MXFP4 model, and llama-quantize for experts in
/// MXFP4 and the rest in Q8_0).
fn file_type(o: &Options) -> u32 {
    match o.preset.arch {
        Arch::GptOss => Format::Mxfp4.file_type(),
        _ => o.format.file_type(),
    }
}

/// Every metadata entry of the file. `reference` is the tokenizer's source:
/// the BPE reference, or the SentencePiece one for `Vocab::Spm` presets.
pub fn metadata(o: &Options, reference: &Gguf) -> Result<Vec<Kv>> {
    let p = o.preset;
    let a = p.arch.name();
    let u32_kv = |k: &str, v: u64| -> Result<Kv> {
        Ok(kv(
            &format!("{a}.{k}"),
            U32,
            u32::try_from(v)?.to_le_bytes().to_vec(),
        ))
    };
    let f32_kv = |k: &str, v: f32| kv(&format!("{a}.{k}"), F32, v.to_le_bytes().to_vec());
    let mut kvs = vec![
        kv("general.architecture", STRING, string_raw(a)),
        kv("general.name", STRING, string_raw(&general_name(p))),
        kv(
            "general.file_type",
            U32,
            file_type(o).to_le_bytes().to_vec(),
        ),
        kv(
            "general.alignment",
            U32,
            (ALIGNMENT as u32).to_le_bytes().to_vec(),
        ),
        kv(
            "general.quantization_version",
            U32,
            2u32.to_le_bytes().to_vec(),
        ),
    ];
    let context = u64::from(p.context);
    let orig_context = match p.rope_scaling {
        RopeScaling::LongRope { orig } => u64::from(orig),
        _ => context,
    };
    let head_dim = p.head_dim();
    let string_kv = |k: &str, v: &str| kv(&format!("{a}.{k}"), STRING, string_raw(v));
    match p.arch {
        Arch::Llama | Arch::Qwen2 => kvs.extend([
            u32_kv("context_length", context)?,
            u32_kv("embedding_length", p.n_embd)?,
            u32_kv("block_count", p.n_layer)?,
            u32_kv("feed_forward_length", p.n_ff)?,
            u32_kv("attention.head_count", p.n_head)?,
            u32_kv("attention.head_count_kv", p.n_head_kv)?,
            f32_kv("rope.freq_base", p.rope_base),
            u32_kv("rope.dimension_count", head_dim)?,
            f32_kv("attention.layer_norm_rms_epsilon", p.norm_eps),
            u32_kv("vocab_size", p.vocab)?,
        ]),
        // Phi3MiniModel.set_gguf_parameters, in its order (no vocab_size).
        Arch::Phi3 => kvs.extend([
            u32_kv("context_length", context)?,
            u32_kv("rope.scaling.original_context_length", orig_context)?,
            u32_kv("embedding_length", p.n_embd)?,
            u32_kv("feed_forward_length", p.n_ff)?,
            u32_kv("block_count", p.n_layer)?,
            u32_kv("attention.head_count", p.n_head)?,
            u32_kv("attention.head_count_kv", p.n_head_kv)?,
            f32_kv("attention.layer_norm_rms_epsilon", p.norm_eps),
            u32_kv("rope.dimension_count", head_dim)?,
            f32_kv("rope.freq_base", p.rope_base),
            u32_kv("attention.sliding_window", u64::from(p.sliding_window))?,
        ]),
        // GPT2Model.set_gguf_parameters, in its order: no head_count_kv (llama.cpp
        // takes head_count), no RoPE, no vocab_size.
        Arch::Gpt2 => kvs.extend([
            u32_kv("block_count", p.n_layer)?,
            u32_kv("context_length", context)?,
            u32_kv("embedding_length", p.n_embd)?,
            u32_kv("feed_forward_length", p.n_ff)?,
            u32_kv("attention.head_count", p.n_head)?,
            f32_kv("attention.layer_norm_epsilon", p.norm_eps),
        ]),
        // TextModel.set_gguf_parameters in its order, then GptOssModel's
        // sliding window and expert width (no rope.dimension_count: llama.cpp
        // takes key_length).
        Arch::GptOss => {
            let moe = p
                .moe
                .ok_or_else(|| anyhow!("{}: gpt-oss without experts", p.name))?;
            kvs.extend([
                u32_kv("block_count", p.n_layer)?,
                u32_kv("context_length", context)?,
                u32_kv("embedding_length", p.n_embd)?,
                u32_kv("feed_forward_length", p.n_ff)?,
                u32_kv("attention.head_count", p.n_head)?,
                u32_kv("attention.head_count_kv", p.n_head_kv)?,
            ]);
            if let RopeScaling::Yarn {
                factor,
                orig,
                beta_fast,
                beta_slow,
            } = p.rope_scaling
            {
                kvs.extend([
                    string_kv("rope.scaling.type", "yarn"),
                    f32_kv("rope.scaling.factor", factor),
                    u32_kv("rope.scaling.original_context_length", u64::from(orig))?,
                    f32_kv("rope.scaling.yarn_beta_fast", beta_fast),
                    f32_kv("rope.scaling.yarn_beta_slow", beta_slow),
                ]);
            }
            kvs.extend([
                f32_kv("rope.freq_base", p.rope_base),
                f32_kv("attention.layer_norm_rms_epsilon", p.norm_eps),
                u32_kv("expert_count", moe.experts)?,
                u32_kv("expert_used_count", moe.used)?,
                u32_kv("attention.key_length", head_dim)?,
                u32_kv("attention.value_length", head_dim)?,
                u32_kv("attention.sliding_window", u64::from(p.sliding_window))?,
                u32_kv("expert_feed_forward_length", moe.n_ff)?,
            ]);
        }
    }
    // Phi3MiniModel.generate_extra_tensors adds LongRoPE's magnitude factor.
    if let RopeScaling::LongRope { orig } = p.rope_scaling {
        let scale = context as f64 / f64::from(orig);
        let attn_factor = (1.0 + scale.ln() / f64::from(orig).ln()).sqrt() as f32;
        kvs.push(f32_kv("rope.scaling.attn_factor", attn_factor));
    }
    kvs.push(kv(
        "general.synthetic_seed",
        U64,
        o.seed.to_le_bytes().to_vec(),
    ));
    kvs.extend(match p.vocab_source {
        Vocab::Reference => tokenizer_kvs(reference, p.vocab)?,
        Vocab::Spm => spm_tokenizer_kvs(reference, p.vocab)?,
        Vocab::Harmony => harmony::tokenizer_kvs()?,
    });
    Ok(kvs)
}

/// The header (up to the data section, padded): the `Gguf` writer's layout
/// with the offsets of `layout`.
pub fn header(kvs: &[Kv], tensors: &[TensorSpec], offsets: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for k in kvs {
        out.extend(string_raw(&k.key));
        out.extend_from_slice(&k.vtype.to_le_bytes());
        out.extend_from_slice(&k.raw);
    }
    for (t, off) in tensors.iter().zip(offsets) {
        out.extend(string_raw(&t.name));
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.format.ggml_type().to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
    }
    let a = ALIGNMENT as usize;
    out.resize(out.len().div_ceil(a) * a, 0);
    out
}

/// Generates chunks `chunks` of tensor `index` into `out` (their bytes, in order).
fn fill_window(
    t: &TensorSpec,
    index: u64,
    seed: u64,
    chunks: std::ops::Range<u64>,
    out: &mut [u8],
    threads: usize,
) {
    let chunk_bytes = t.format.bytes_for(CHUNK_VALUES) as usize;
    let fill_range = |first: u64, out: &mut [u8]| {
        for (k, part) in out.chunks_mut(chunk_bytes).enumerate() {
            let mut rng = blocks::Rng::for_chunk(seed, index, first + k as u64);
            blocks::fill(t.format, t.init, &mut rng, part);
        }
    };
    let n = (chunks.end - chunks.start) as usize;
    if threads <= 1 || n < 2 * threads {
        fill_range(chunks.start, out);
        return;
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        for (k, part) in out.chunks_mut(per * chunk_bytes).enumerate() {
            let fill_range = &fill_range;
            s.spawn(move || fill_range(chunks.start + (k * per) as u64, part));
        }
    });
}

/// Writes the whole file to `w`: header, then each tensor aligned.
pub fn write_to(o: &Options, reference: &Gguf, w: &mut (impl Write + Send)) -> Result<Written> {
    let start = Instant::now();
    let specs = tensors(o.preset, o.format);
    let (offsets, data_bytes) = layout(&specs);
    let head = header(&metadata(o, reference)?, &specs, &offsets);
    let data_offset = head.len() as u64;

    std::thread::scope(|s| -> Result<()> {
        // Two buffers circulate: one being generated, one being written.
        let (full_tx, full_rx) = mpsc::sync_channel::<Vec<u8>>(1);
        let (empty_tx, empty_rx) = mpsc::channel::<Vec<u8>>();
        empty_tx.send(Vec::new())?;
        empty_tx.send(Vec::new())?;
        let writer = s.spawn(move || -> std::io::Result<()> {
            for buf in full_rx {
                w.write_all(&buf)?;
                // The generator may have stopped; then the buffer is not wanted.
                let _ = empty_tx.send(buf);
            }
            w.flush()
        });
        let send = |fill: &mut dyn FnMut(&mut Vec<u8>)| -> Result<()> {
            let mut buf = empty_rx
                .recv()
                .map_err(|_| anyhow!("the writer thread stopped"))?;
            fill(&mut buf);
            full_tx
                .send(buf)
                .map_err(|_| anyhow!("the writer thread stopped"))
        };
        let produced = || -> Result<()> {
            send(&mut |b| {
                b.clear();
                b.extend_from_slice(&head);
            })?;
            let mut at = 0u64;
            for (i, (t, &off)) in specs.iter().zip(&offsets).enumerate() {
                if off > at {
                    send(&mut |b| {
                        b.clear();
                        b.resize((off - at) as usize, 0);
                    })?;
                }
                let values = t.values();
                let n_chunks = values.div_ceil(CHUNK_VALUES);
                let per_window = (WINDOW_BYTES / t.format.bytes_for(CHUNK_VALUES)).max(1);
                let mut c = 0;
                while c < n_chunks {
                    let end = (c + per_window).min(n_chunks);
                    let len = t
                        .format
                        .bytes_for((end * CHUNK_VALUES).min(values) - c * CHUNK_VALUES);
                    send(&mut |b| {
                        b.clear();
                        b.resize(len as usize, 0);
                        fill_window(t, i as u64, o.seed, c..end, b, o.threads);
                    })?;
                    c = end;
                }
                at = off + t.bytes();
            }
            Ok(())
        };
        let made = produced();
        drop(full_tx);
        let wrote = writer
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))?;
        made?;
        Ok(wrote?)
    })?;
    Ok(Written {
        bytes: data_offset + data_bytes,
        tensors: specs.len(),
        data_offset,
        data_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Writes the file at `out` (through `out.part`, renamed when complete), with
/// the tokenizer of `reference`: the BPE reference model, or for a preset of
/// `Vocab::Spm` the SentencePiece one (`tokenizer_source` picks).
pub fn write_file(o: &Options, reference: &Path, out: &Path) -> Result<Written> {
    let reference = Gguf::read_header(reference).with_context(|| {
        format!(
            "reading the {} tokenizer from {}",
            match o.preset.vocab_source {
                Vocab::Reference | Vocab::Harmony => "reference's",
                Vocab::Spm => "SentencePiece reference's",
            },
            reference.display()
        )
    })?;
    let mut part = out.as_os_str().to_owned();
    part.push(".part");
    let part = std::path::PathBuf::from(part);
    let file =
        std::fs::File::create(&part).with_context(|| format!("creating {}", part.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = match write_to(o, &reference, &mut w) {
        Ok(x) => x,
        Err(e) => {
            drop(w);
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    let file = w.into_inner().map_err(|e| e.into_error())?;
    let len = file.metadata()?.len();
    if len != written.bytes {
        bail!(
            "wrote {len} bytes to {}, expected {}",
            part.display(),
            written.bytes
        );
    }
    drop(file);
    std::fs::rename(&part, out)
        .with_context(|| format!("renaming {} to {}", part.display(), out.display()))?;
    Ok(written)
}

#[cfg(test)]
pub(crate) mod tests;
