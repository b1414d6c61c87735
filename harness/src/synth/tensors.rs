//! Every tensor of a preset in file order, with llama.cpp's names, shapes and
//! fusions, and where each one's bytes go in the data section.

use super::blocks::{FactorTable, Format, Init};
use super::presets::{Arch, Moe, Preset, RopeScaling};

/// Tensor data alignment (`general.alignment`).
pub const ALIGNMENT: u64 = 32;

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
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => {
                for (m, rows) in [("q", q_dim), ("k", kv_dim), ("v", kv_dim)] {
                    t.push(matrix(n(&format!("attn_{m}.weight")), rows, p.n_embd));
                    if p.arch == Arch::Qwen2 {
                        t.push(vector(n(&format!("attn_{m}.bias")), rows, Init::Bias));
                    }
                }
                if matches!(p.arch, Arch::Qwen3 | Arch::Qwen3Moe) {
                    for m in ["q", "k"] {
                        t.push(vector(
                            n(&format!("attn_{m}_norm.weight")),
                            head_dim,
                            Init::Norm,
                        ));
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
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {
                t.push(matrix(n("ffn_gate.weight"), p.n_ff, p.n_embd));
                t.push(matrix(n("ffn_up.weight"), p.n_ff, p.n_embd));
            }
            Arch::Qwen3Moe => {
                let moe = p.moe.expect("qwen3moe presets have experts");
                t.extend(qwen3moe_experts(p, moe, i, format));
                continue;
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

/// Layer `i`'s experts of a qwen3moe preset, as llama.cpp's `qwen3moe`
/// loads them: the router (`ffn_gate_inp`, F32 as llama-quantize leaves
/// it, no bias), then the experts' gate, up and down matrices, `[cols, rows,
/// experts]` in `format` (or its fallback for their row length), no biases.
fn qwen3moe_experts(p: &Preset, moe: Moe, i: u64, format: Format) -> Vec<TensorSpec> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let std = |cols: u64| Init::Matrix {
        std: 1.0 / (cols as f32).sqrt(),
    };
    let mut t = vec![TensorSpec {
        name: n("ffn_gate_inp.weight"),
        dims: vec![p.n_embd, moe.experts],
        format: Format::F32,
        init: std(p.n_embd),
    }];
    for (m, rows, cols) in [
        ("ffn_gate_exps", moe.n_ff, p.n_embd),
        ("ffn_up_exps", moe.n_ff, p.n_embd),
        ("ffn_down_exps", p.n_embd, moe.n_ff),
    ] {
        t.push(TensorSpec {
            name: n(&format!("{m}.weight")),
            dims: vec![cols, rows, moe.experts],
            format: format.for_row(cols),
            init: std(cols),
        });
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
