//! What a kernel launch is, apart from any particular kernel: the kernels
//! by name ([`Kernel`]), the argument checks every launch makes
//! ([`check_args`], M0-W-1431), the launch geometry of every kernel in one
//! place ([`launch_config`]), and the [`KernelCall`] trait that each
//! kernel's argument struct (`args.rs`) implements, so that one generic
//! launcher (`Kernels::launch`) checks, shapes and launches them all.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};

use crate::backend::cuda::ptr::Param;
pub use crate::backend::cuda::source::{f16_tiles, integer_gemm};
use crate::backend::cuda::source::{
    has_mmq, Module, ATC_BQ, ATC_SMEM_BYTES, ATC_THREADS, ATSC_THREADS, ATS_THREADS, ATT_THREADS,
    GEMM_BM, GEMM_BN, GEMM_THREADS, GF_MAX_TOKENS, GF_WARPS, GTC_BR, GTC_BT, GTC_SMEM_BYTES,
    GTC_THREADS, MMQ_WARPS, MOE_ROUTE_ROWS, MV1_ROWS, MV1_THREADS, MV8N_ROWS, MV8_MAX_TOKENS,
    MV8_ROWS, MV8_THREADS, MV_THREADS, SAMPLE_ARGMAX_BLOCKS, SAMPLE_ARGMAX_THREADS, SAMPLE_THREADS,
};
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// Every kernel the backend launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `embed_<type>`: rows of a stored table to f32.
    Embed(GgmlType),
    /// `mv_<type>`: matrix product for up to `MV_MAX_TOKENS` rows of x, a block per weight row.
    MatVec(GgmlType),
    /// `mvw_<type>`: the same with a warp per weight row, for matrices of many rows.
    MatVecWarp(GgmlType),
    /// `gemm_<type>`: tiled matrix product for any number of rows of x.
    Gemm(GgmlType),
    /// `mv1_<type>`: matrix product for one row of x (decode), streaming
    /// tiles of `MV1_ROWS` weight rows through shared memory.
    MatVec1(GgmlType),
    /// `mv1e_<type>`: `mv1_<type>` over the experts a router chose, one
    /// grid row per (token, chosen expert), the expert read on the device.
    MatVecExperts(GgmlType),
    /// `mv8e_<type>`: `mv8_<type>` over the experts a router chose, laid
    /// out as `mv1e_<type>`, from x split by `quantize_x8` (or `swiglu_oai`).
    MatVec8Experts(GgmlType),
    /// `mv8_<type>`: matrix product for one row of x (decode) on the integer
    /// units, from x split by `quantize_x8`; `MV8_ROWS` weight rows a block.
    MatVec8(GgmlType),
    /// `mv8m_<type>`: `mv8_<type>` for up to three matrices of one width
    /// and x in one launch (Q, K and V; gate and up).
    MatVec8Many(GgmlType),
    /// `mv8q_<type>`: `mv8m_<type>` of Q, K and V with Q's and K's heads
    /// turned (RoPE, adjacent pairs) and K and V stored in the cache, as
    /// `qk_rope_store` does them.
    MatVec8Qkv(GgmlType),
    /// `mv8n_<type>`: the same for several rows of x, in groups of
    /// `MV8_MAX_TOKENS` (the grid's y), `MV8N_ROWS` weight rows a block.
    MatVec8N(GgmlType),
    /// `mmq_<type>`: 9 to `MMQ_MAX_TOKENS` rows of x (short prompts) on the
    /// integer tensor cores, from x split by `quantize_x8` (Q8_0).
    Mmq(GgmlType),
    /// `quantize_x8`: rows of x as `mv8_*` reads them.
    QuantizeX8,
    /// `gemm_tc_<type>`: matrix product for many rows of x on tensor cores,
    /// float formats (3xTF32).
    GemmTc(GgmlType),
    /// `gemm_tck_<type>`: the quantized formats' matrix product for many
    /// rows of x on tensor cores (weight tiles decoded into f16, x in two
    /// f16 parts from `to_f16`), the columns split across blocks (short
    /// prompts leave SMs idle otherwise); `GemmSplitsSum` adds the parts.
    GemmTcSplit(GgmlType),
    /// `gemm_few_<type>`: the same product for up to `GF_MAX_TOKENS` rows
    /// of x (short prompts), weights decoded straight into the tensor
    /// cores' fragments: the weights' stream, no shared-memory tiles.
    GemmFew(GgmlType),
    GemmSplitsSum,
    /// `gemm_moe_<type>`: `gemm_tck_*`'s product for a mixture of experts'
    /// rows of x gathered by expert, every expert in one launch (prefill).
    GemmExperts(GgmlType),
    /// `moe_gather_f16`: rows of x gathered by expert, split into f16 parts.
    MoeGatherF16,
    /// `dequant_f16_<type>`: rows of a stored matrix as f16, for cuBLAS
    /// (`blas.rs`).
    DequantF16(GgmlType),
    /// `to_f16`: x as two f16 parts, for cuBLAS and `gemm_tck_*`.
    ToF16,
    /// `add_bias`: a bias added to each row of a cuBLAS product.
    AddBias,
    RmsNorm,
    /// `add_rms_norm`: a residual add, then `rms_norm` of the sum.
    AddRmsNorm,
    /// `add_rms_norm_cluster`: the same for one row split for `mv8_*`,
    /// over a cluster of blocks (sm_90 on; decode).
    AddRmsNormCluster,
    /// `layer_norm`: GPT-2's LayerNorm (M0-W-1432).
    LayerNorm,
    Rope,
    /// `qk_rope_store`: per-head norms and RoPE of Q and K in place, and
    /// the KV store, in one launch (before attention).
    QkRopeStore,
    /// `qk_rope_store_rows`: the same for a batched decode step, each row
    /// at its own sequence's position and into its own cache.
    QkRopeStoreRows,
    KvStore,
    Attention,
    /// `attention_tc`: the same for many query rows at once, on tensor
    /// cores (flash attention; heads of 64 or 128 dims).
    AttentionTc,
    /// `attention_split_<64 * n>_g<g>`: one query row over a long context,
    /// the context split into chunks across blocks, for heads of up to 64 * n
    /// dims (n = 1, 2, 4) and up to g query heads per KV head (g = 4, 8);
    /// `attention_combine` merges the chunks.
    AttentionSplit(u8, u8),
    /// `attention_split_tc_<64 * n>`: the same on tensor cores for heads of
    /// exactly 64 * n dims (n = 1, 2) and any group of up to 8 (the group's
    /// query heads are the rows of the products).
    AttentionSplitTc(u8),
    AttentionCombine,
    /// `attention_split_*_rows`: `AttentionSplit` for a batched decode
    /// step, each row over its own cache in chunks of `ATS_ROW_CHUNK`.
    AttentionSplitRows(u8, u8),
    /// `attention_split_tc_*_rows`: the same on tensor cores.
    AttentionSplitTcRows(u8),
    /// `attention_combine_rows`: the merge of each row's chunks.
    AttentionCombineRows,
    Swiglu,
    /// `swiglu_oai`: gpt-oss's clamped SwiGLU.
    SwigluOai,
    /// `moe_route`: the router's choice of experts and their weights.
    MoeRoute,
    /// `moe_sum`: the chosen experts' outputs, weighed and added.
    MoeSum,
    /// `geglu`: `swiglu` with the tanh-approximated GELU (Gemma's feed-forward).
    Geglu,
    /// `gelu`: GPT-2's tanh-approximated GELU (M0-W-1433).
    Gelu,
    AddAssign,
    /// `scale`: `x *= factor` (Gemma's embeddings).
    Scale,
    /// `copy_cols`: a column range of each row (fused projections' parts).
    CopyCols,
    /// `keep_rows`: each row of a batched step's logits to its sequence's
    /// sampler.
    KeepRows,
    /// `sample_select`: the sampling pipeline over one logit vector.
    SampleSelect,
    /// `sample_select_rows`: `sample_select` for each sequence of a batched
    /// decode step, a block each.
    SampleSelectRows,
    /// `sample_argmax`: greedy sampling without a penalty, over many blocks.
    SampleArgmax,
    /// `sample_logprobs`: the top log-probabilities of one logit vector.
    SampleLogprobs,
}

impl Kernel {
    /// Every kernel, for loading them all at start.
    pub fn all() -> Vec<Kernel> {
        let mut v = Vec::new();
        for t in GgmlType::ALL {
            v.extend([
                Kernel::Embed(t),
                Kernel::MatVec(t),
                Kernel::MatVecWarp(t),
                Kernel::Gemm(t),
            ]);
            v.extend([
                Kernel::MatVec1(t),
                Kernel::MatVecExperts(t),
                Kernel::DequantF16(t),
            ]);
            // The quantized formats' GEMM is gemm_tck_* (x split once into
            // f16 parts); the others' gemm_tc_* (3xTF32).
            if integer_gemm(t) {
                v.extend([Kernel::GemmTcSplit(t), Kernel::GemmFew(t)]);
            } else {
                v.push(Kernel::GemmTc(t));
            }
            if has_mv8_experts(t) {
                v.push(Kernel::MatVec8Experts(t));
            }
            if has_mv8(t) {
                v.extend([
                    Kernel::MatVec8(t),
                    Kernel::MatVec8Many(t),
                    Kernel::MatVec8Qkv(t),
                    Kernel::MatVec8N(t),
                ]);
            }
            if has_mmq(t) {
                v.push(Kernel::Mmq(t));
            }
            if f16_tiles(t) {
                v.push(Kernel::GemmExperts(t));
            }
        }
        v.extend([
            Kernel::QuantizeX8,
            Kernel::GemmSplitsSum,
            Kernel::ToF16,
            Kernel::AddBias,
            Kernel::RmsNorm,
            Kernel::AddRmsNorm,
            Kernel::AddRmsNormCluster,
            Kernel::LayerNorm,
            Kernel::Rope,
            Kernel::QkRopeStore,
            Kernel::QkRopeStoreRows,
            Kernel::KvStore,
            Kernel::Attention,
            Kernel::AttentionTc,
            Kernel::AttentionSplitTc(1),
            Kernel::AttentionSplitTc(2),
            Kernel::AttentionSplit(1, 4),
            Kernel::AttentionSplit(1, 8),
            Kernel::AttentionSplit(2, 4),
            Kernel::AttentionSplit(2, 8),
            Kernel::AttentionSplit(4, 4),
            Kernel::AttentionSplit(4, 8),
            Kernel::AttentionCombine,
            Kernel::AttentionSplitTcRows(1),
            Kernel::AttentionSplitTcRows(2),
            Kernel::AttentionSplitRows(1, 4),
            Kernel::AttentionSplitRows(1, 8),
            Kernel::AttentionSplitRows(2, 4),
            Kernel::AttentionSplitRows(2, 8),
            Kernel::AttentionSplitRows(4, 4),
            Kernel::AttentionSplitRows(4, 8),
            Kernel::AttentionCombineRows,
            Kernel::Swiglu,
            Kernel::SwigluOai,
            Kernel::MoeRoute,
            Kernel::MoeSum,
            Kernel::MoeGatherF16,
            Kernel::Geglu,
            Kernel::Gelu,
            Kernel::AddAssign,
            Kernel::Scale,
            Kernel::CopyCols,
            Kernel::KeepRows,
            Kernel::SampleSelect,
            Kernel::SampleSelectRows,
            Kernel::SampleArgmax,
            Kernel::SampleLogprobs,
        ]);
        v
    }

    pub fn module(self) -> Module {
        match self {
            Kernel::Embed(_) => Module::Embed,
            Kernel::MatVec(_) | Kernel::MatVecWarp(_) | Kernel::Gemm(_) => Module::Matmul,
            Kernel::MatVec1(_)
            | Kernel::MatVecExperts(_)
            | Kernel::MatVec8Experts(_)
            | Kernel::MatVec8(_)
            | Kernel::MatVec8Many(_)
            | Kernel::MatVec8Qkv(_)
            | Kernel::MatVec8N(_)
            | Kernel::Mmq(_) => Module::Matvec,
            Kernel::GemmTc(_)
            | Kernel::GemmTcSplit(_)
            | Kernel::GemmFew(_)
            | Kernel::GemmExperts(_)
            | Kernel::DequantF16(_) => Module::GemmTc,
            Kernel::RmsNorm
            | Kernel::AddRmsNorm
            | Kernel::AddRmsNormCluster
            | Kernel::LayerNorm => Module::Norm,
            Kernel::Rope | Kernel::QkRopeStore | Kernel::QkRopeStoreRows => Module::Rope,
            Kernel::KvStore | Kernel::Attention => Module::Attention,
            Kernel::AttentionSplit(..)
            | Kernel::AttentionSplitTc(_)
            | Kernel::AttentionCombine
            | Kernel::AttentionSplitRows(..)
            | Kernel::AttentionSplitTcRows(_)
            | Kernel::AttentionCombineRows => Module::AttentionSplit,
            Kernel::AttentionTc => Module::AttentionTc,
            Kernel::Swiglu
            | Kernel::SwigluOai
            | Kernel::MoeRoute
            | Kernel::MoeSum
            | Kernel::MoeGatherF16
            | Kernel::Geglu
            | Kernel::Gelu
            | Kernel::AddAssign
            | Kernel::Scale
            | Kernel::CopyCols
            | Kernel::KeepRows
            | Kernel::QuantizeX8
            | Kernel::GemmSplitsSum
            | Kernel::ToF16
            | Kernel::AddBias => Module::Elementwise,
            Kernel::SampleSelect
            | Kernel::SampleSelectRows
            | Kernel::SampleArgmax
            | Kernel::SampleLogprobs => Module::Sample,
        }
    }

    /// Which part of its module the kernel is compiled in, for the modules
    /// cut in [`Module::parts`] (the `ONE_PART` guards of their sources).
    pub fn part(self) -> Option<u8> {
        match self {
            Kernel::MatVec(_)
            | Kernel::Gemm(_)
            | Kernel::MatVec1(_)
            | Kernel::MatVec8(_)
            | Kernel::MatVec8Many(_)
            | Kernel::MatVec8Qkv(_)
            | Kernel::MatVec8N(_) => Some(0),
            Kernel::Mmq(_) => Some(1),
            Kernel::MatVecExperts(_) | Kernel::MatVec8Experts(_) => Some(2),
            Kernel::MatVecWarp(_) => Some(1),
            Kernel::GemmTc(_) | Kernel::GemmTcSplit(_) | Kernel::DequantF16(_) => Some(0),
            Kernel::GemmFew(_) => Some(1),
            Kernel::GemmExperts(_) => Some(2),
            Kernel::AttentionSplit(_, group) | Kernel::AttentionSplitRows(_, group) => {
                Some(1 + u8::from(group > 4))
            }
            Kernel::AttentionSplitTc(_)
            | Kernel::AttentionCombine
            | Kernel::AttentionSplitTcRows(_)
            | Kernel::AttentionCombineRows
            | Kernel::SampleSelect
            | Kernel::SampleSelectRows => Some(0),
            Kernel::SampleArgmax | Kernel::SampleLogprobs => Some(1),
            _ => None,
        }
    }

    /// Dynamic shared memory a block needs, for the kernels that take it
    /// (over the 48 KB default: the loader raises their limit to this).
    pub fn dynamic_smem(self) -> Option<u32> {
        match self {
            Kernel::GemmTc(_) | Kernel::GemmTcSplit(_) | Kernel::GemmExperts(_) => {
                Some(GTC_SMEM_BYTES)
            }
            Kernel::AttentionTc => Some(ATC_SMEM_BYTES),
            _ => None,
        }
    }

    /// Whether the kernel's blocks hold tens of KB of shared memory, so that
    /// the SM should give shared memory all it can (left to the driver, the
    /// H100 ran an earlier `attention_split` of 41 KB blocks at one block
    /// per SM: 6% occupancy), or blocks of a few KB that should share an SM
    /// four at a time (left to the driver, `attention_split`'s 4 KB blocks
    /// also ran one at a time).
    pub fn prefers_shared_memory(self) -> bool {
        matches!(
            self,
            Kernel::GemmTc(_)
                | Kernel::GemmTcSplit(_)
                | Kernel::GemmExperts(_)
                | Kernel::MatVec1(_)
                | Kernel::MatVecExperts(_)
                | Kernel::AttentionTc
                | Kernel::AttentionSplit(..)
                | Kernel::AttentionSplitTc(_)
                | Kernel::AttentionSplitRows(..)
                | Kernel::AttentionSplitTcRows(_)
        )
    }

    /// The weight format of a per-format kernel.
    pub fn format(self) -> Option<GgmlType> {
        match self {
            Kernel::Embed(t)
            | Kernel::MatVec(t)
            | Kernel::MatVecWarp(t)
            | Kernel::Gemm(t)
            | Kernel::MatVec1(t)
            | Kernel::MatVecExperts(t)
            | Kernel::MatVec8Experts(t)
            | Kernel::MatVec8(t)
            | Kernel::MatVec8Many(t)
            | Kernel::MatVec8Qkv(t)
            | Kernel::MatVec8N(t)
            | Kernel::Mmq(t)
            | Kernel::GemmTc(t)
            | Kernel::GemmTcSplit(t)
            | Kernel::GemmFew(t)
            | Kernel::GemmExperts(t)
            | Kernel::DequantF16(t) => Some(t),
            _ => None,
        }
    }

    /// The `extern "C"` symbol in the module.
    pub fn symbol(self) -> String {
        let ty = |t: GgmlType| t.name().to_ascii_lowercase();
        match self {
            Kernel::Embed(t) => format!("embed_{}", ty(t)),
            Kernel::MatVec(t) => format!("mv_{}", ty(t)),
            Kernel::MatVecWarp(t) => format!("mvw_{}", ty(t)),
            Kernel::Gemm(t) => format!("gemm_{}", ty(t)),
            Kernel::MatVec1(t) => format!("mv1_{}", ty(t)),
            Kernel::MatVecExperts(t) => format!("mv1e_{}", ty(t)),
            Kernel::MatVec8Experts(t) => format!("mv8e_{}", ty(t)),
            Kernel::MatVec8(t) => format!("mv8_{}", ty(t)),
            Kernel::MatVec8Many(t) => format!("mv8m_{}", ty(t)),
            Kernel::MatVec8Qkv(t) => format!("mv8q_{}", ty(t)),
            Kernel::MatVec8N(t) => format!("mv8n_{}", ty(t)),
            Kernel::Mmq(t) => format!("mmq_{}", ty(t)),
            Kernel::QuantizeX8 => "quantize_x8".into(),
            Kernel::GemmTc(t) => format!("gemm_tc_{}", ty(t)),
            Kernel::GemmTcSplit(t) => format!("gemm_tck_{}", ty(t)),
            Kernel::GemmFew(t) => format!("gemm_few_{}", ty(t)),
            Kernel::GemmSplitsSum => "gemm_splits_sum".into(),
            Kernel::GemmExperts(t) => format!("gemm_moe_{}", ty(t)),
            Kernel::MoeGatherF16 => "moe_gather_f16".into(),
            Kernel::DequantF16(t) => format!("dequant_f16_{}", ty(t)),
            Kernel::ToF16 => "to_f16".into(),
            Kernel::AddBias => "add_bias".into(),
            Kernel::RmsNorm => "rms_norm".into(),
            Kernel::AddRmsNorm => "add_rms_norm".into(),
            Kernel::AddRmsNormCluster => "add_rms_norm_cluster".into(),
            Kernel::LayerNorm => "layer_norm".into(),
            Kernel::Rope => "rope".into(),
            Kernel::QkRopeStore => "qk_rope_store".into(),
            Kernel::KvStore => "kv_store".into(),
            Kernel::Attention => "attention".into(),
            Kernel::AttentionTc => "attention_tc".into(),
            Kernel::AttentionSplit(pairs, group) => {
                format!("attention_split_{}_g{group}", 64 * pairs as usize)
            }
            Kernel::AttentionSplitTc(pairs) => {
                format!("attention_split_tc_{}", 64 * pairs as usize)
            }
            Kernel::AttentionCombine => "attention_combine".into(),
            Kernel::QkRopeStoreRows => "qk_rope_store_rows".into(),
            Kernel::AttentionSplitRows(pairs, group) => {
                format!("attention_split_{}_g{group}_rows", 64 * pairs as usize)
            }
            Kernel::AttentionSplitTcRows(pairs) => {
                format!("attention_split_tc_{}_rows", 64 * pairs as usize)
            }
            Kernel::AttentionCombineRows => "attention_combine_rows".into(),
            Kernel::Swiglu => "swiglu".into(),
            Kernel::SwigluOai => "swiglu_oai".into(),
            Kernel::MoeRoute => "moe_route".into(),
            Kernel::MoeSum => "moe_sum".into(),
            Kernel::Geglu => "geglu".into(),
            Kernel::Gelu => "gelu".into(),
            Kernel::AddAssign => "add_assign".into(),
            Kernel::Scale => "scale".into(),
            Kernel::CopyCols => "copy_cols".into(),
            Kernel::KeepRows => "keep_rows".into(),
            Kernel::SampleSelect => "sample_select".into(),
            Kernel::SampleArgmax => "sample_argmax".into(),
            Kernel::SampleLogprobs => "sample_logprobs".into(),
            Kernel::SampleSelectRows => "sample_select_rows".into(),
        }
    }
}

/// Formats with an integer decode mat-vec (`mv8_*`, matvec.cu).
pub fn has_mv8(t: GgmlType) -> bool {
    matches!(
        t,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q4K
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Q6K
    )
}

/// Formats with an integer mat-vec over chosen experts (`mv8e_*`): those
/// of `mv8_*`, and MXFP4 (whose E2M1 values, doubled, are small integers).
pub fn has_mv8_experts(t: GgmlType) -> bool {
    has_mv8(t) || t == GgmlType::Mxfp4
}

/// M0-W-1431: the checks every launch makes before it queues anything, so
/// that a bad call is a typed error rather than a launch that reads or
/// writes outside a buffer. Each `int` argument of the kernel must lie in
/// `1..=i32::MAX` (zero rows or columns are refused, not launched as empty
/// grids), and each required buffer must not be null. Buffer sizes are
/// checked one level up, in `ops.rs`, where the buffers are known.
pub fn check_args(
    k: Kernel,
    ints: &[(&str, usize)],
    ptrs: &[(&str, CUdeviceptr)],
) -> Result<(), BackendError> {
    for &(name, v) in ints {
        if v == 0 {
            return Err(refusal(k, format!("{name} is zero; nothing is launched")));
        }
        if v > i32::MAX as usize {
            return Err(refusal(
                k,
                format!("{name} = {v} exceeds the kernel's int range"),
            ));
        }
    }
    if let Some((name, _)) = ptrs.iter().find(|(_, p)| *p == 0) {
        return Err(refusal(k, format!("buffer {name} is null")));
    }
    Ok(())
}

/// A launch refused before anything was queued: `<symbol>: <why>`.
pub fn refusal(k: Kernel, why: String) -> BackendError {
    BackendError::InferenceFailed(format!("{}: {why}", k.symbol()))
}

/// The problem size a kernel's grid is laid over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// One thread per element.
    Elements(usize),
    /// One block per row of `cols` values.
    Rows { rows: usize, cols: usize },
    /// An output of `rows` weight rows by `n` rows of x (matmul).
    Matrix { rows: usize, n: usize },
    /// One row of x by `rows` weight rows of `cols` columns (`mv8_*`;
    /// `mv8m_*`: the matrices' rows each rounded up to whole blocks).
    MatVec { rows: usize, cols: usize },
    /// The same, its columns split into `splits` ranges.
    SplitMatrix {
        rows: usize,
        n: usize,
        splits: usize,
    },
    /// One block per (query row, head).
    Heads { n: usize, n_head: usize },
    /// `mv1_*`'s (or `mv8_*`'s) blocks over `rows` weight rows of `cols`
    /// columns, for each of `slots` (token, chosen expert) pairs, of each
    /// of `matrices` matrices.
    Experts {
        rows: usize,
        cols: usize,
        slots: usize,
        matrices: usize,
    },
    /// `gemm_tck_*`'s blocks over `rows` weight rows, for each of `tiles`
    /// tiles of rows of x of one expert each.
    ExpertTiles { rows: usize, tiles: usize },
    /// One block per (row, head) of heads of `head_dim` values, as wide as
    /// `rms_norm`'s block for a row of that width.
    HeadRows {
        n: usize,
        heads: usize,
        head_dim: usize,
    },
    /// One block per (KV head, chunk of the context).
    Chunks { n_head_kv: usize, nsplit: usize },
    /// The same for each of `rows` sequences (rows mode), `nsplit` chunks
    /// each at most.
    RowChunks {
        n_head_kv: usize,
        nsplit: usize,
        rows: usize,
    },
    /// One block for the whole problem.
    Single,
    /// One row of `cols` values over a cluster of `blocks` blocks, a
    /// thread a value.
    ClusterRow { cols: usize, blocks: usize },
}

impl Work {
    /// The thread block cluster the launch needs, if any.
    pub fn cluster(self) -> Option<u32> {
        match self {
            Work::ClusterRow { blocks, .. } => Some(blocks as u32),
            _ => None,
        }
    }
}

/// Rows from which the decode norm runs over a cluster
/// (`add_rms_norm_cluster`). On the reference model (576 values) it moved
/// the GPU-vs-CPU error at one position (66, after a 64-token prefill) from
/// 7.0e-3 to 1.05e-2, past the 1e-2 bound, with its scale taken as the
/// CPU's; every other position moved by under 30%. Not explained yet, so
/// the narrow rows keep the one-block kernel, which costs them least.
pub const NORM_CLUSTER_MIN_COLS: usize = 2048;

/// Blocks of the cluster `add_rms_norm_cluster` spreads a row of `cols`
/// values over: the most, up to 8 (the portable cluster size), that divide
/// it into whole warps of at most 1024 threads a block; none if no count
/// does or the row is narrower than [`NORM_CLUSTER_MIN_COLS`].
pub fn norm_cluster_blocks(cols: usize) -> Option<usize> {
    if cols < NORM_CLUSTER_MIN_COLS || !cols.is_multiple_of(32) {
        return None;
    }
    let warps = cols / 32;
    (2..=8usize)
        .rev()
        .find(|b| warps.is_multiple_of(*b) && cols / b <= 1024)
}

/// Warps of an `mv8_*` block that share one group of `MV8_ROWS` rows: as
/// few as cover a row's 32-value units (matvec.cu computes the same).
pub fn mv8_group_warps(cols: usize) -> u32 {
    match cols / 32 {
        0..=32 => 1,
        33..=64 => 2,
        _ => MV8_THREADS / 32,
    }
}

/// Weight rows an `mv8_*` block takes for rows of `cols` columns.
pub fn mv8_rows_per_block(cols: usize) -> usize {
    (MV8_ROWS * (MV8_THREADS / 32) / mv8_group_warps(cols)) as usize
}

/// Threads per block of the one-thread-per-element kernels.
const ELEMENT_THREADS: u32 = 256;
/// Threads per `embed_*` block (one block per token, threads over its row).
const EMBED_THREADS: u32 = 128;

/// Threads of a norm block (a multiple of 32, as `block_sum` needs): enough
/// to cover wide rows in few strides, few enough not to idle on narrow ones.
/// Blocks of `sample_argmax` over `n` logits: eight a thread, at most
/// `SAMPLE_ARGMAX_BLOCKS` (its buffer of partial results).
pub fn argmax_blocks(n: usize) -> u32 {
    let per_block = SAMPLE_ARGMAX_THREADS as usize * 8;
    n.div_ceil(per_block).clamp(1, SAMPLE_ARGMAX_BLOCKS) as u32
}

fn norm_threads(cols: usize) -> u32 {
    if cols >= 1024 {
        512
    } else if cols >= 256 {
        256
    } else {
        64
    }
}

fn blocks(grid: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per element in blocks of `block`; zero elements are refused.
fn grid_1d(n: u64, block: u32) -> Result<LaunchConfig, BackendError> {
    if n == 0 {
        return Err(BackendError::InferenceFailed(
            "a launch over zero elements".into(),
        ));
    }
    let count = u32::try_from(n.div_ceil(block as u64))
        .map_err(|_| BackendError::InferenceFailed(format!("{n} elements exceed one launch")))?;
    Ok(blocks((count, 1), block))
}

/// `gemm_tc_*` (`splits` = 1) and `gemm_tck_*`: a block per tile of `GTC_BR`
/// weight rows by `GTC_BT` rows of x, for each column range along z.
fn gemm_tc_config(rows: usize, n: usize, splits: usize) -> Result<LaunchConfig, BackendError> {
    let tiles_n = (n as u32).div_ceil(GTC_BT);
    if tiles_n > 65535 || splits > 64 {
        return Err(BackendError::InferenceFailed(format!(
            "{n} rows in {splits} column ranges exceed one matmul launch"
        )));
    }
    Ok(LaunchConfig {
        grid_dim: ((rows as u32).div_ceil(GTC_BR), tiles_n, splits as u32),
        block_dim: (GTC_THREADS, 1, 1),
        shared_mem_bytes: GTC_SMEM_BYTES,
    })
}

/// The grid and block of kernel `k` over `work`: the launch geometry of
/// every kernel, in one place. The block sizes are the ones the kernels
/// are compiled for (`source.rs`, `__launch_bounds__`); dimensions were
/// checked by [`check_args`] (at most `i32::MAX`) before this is asked.
pub fn launch_config(k: Kernel, work: Work) -> Result<LaunchConfig, BackendError> {
    match (k, work) {
        (Kernel::Embed(_), Work::Rows { rows, .. }) => Ok(blocks((rows as u32, 1), EMBED_THREADS)),
        (Kernel::MatVec(_), Work::Matrix { rows, .. }) => Ok(blocks((rows as u32, 1), MV_THREADS)),
        // A warp per weight row.
        (Kernel::MatVecWarp(_), Work::Matrix { rows, .. }) => Ok(blocks(
            ((rows as u32).div_ceil(MV_THREADS / 32), 1),
            MV_THREADS,
        )),
        (Kernel::Gemm(_), Work::Matrix { rows, n }) => {
            let tiles_n = (n as u32).div_ceil(GEMM_BN);
            if tiles_n > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{n} rows exceed one matmul launch"
                )));
            }
            Ok(blocks(
                ((rows as u32).div_ceil(GEMM_BM), tiles_n),
                GEMM_THREADS,
            ))
        }
        (Kernel::MatVec1(_), Work::Matrix { rows, .. }) => {
            Ok(blocks(((rows as u32).div_ceil(MV1_ROWS), 1), MV1_THREADS))
        }
        (
            Kernel::MatVecExperts(_) | Kernel::MatVec8Experts(_),
            Work::Experts {
                rows,
                cols,
                slots,
                matrices,
            },
        ) => {
            if slots > 65535 || !(1..=2).contains(&matrices) {
                return Err(BackendError::InferenceFailed(format!(
                    "{slots} (token, expert) pairs of {matrices} matrices exceed one launch"
                )));
            }
            let (per_block, threads) = match k {
                Kernel::MatVecExperts(_) => (MV1_ROWS, MV1_THREADS),
                _ => (mv8_rows_per_block(cols) as u32, MV8_THREADS),
            };
            Ok(LaunchConfig {
                grid_dim: (
                    (rows as u32).div_ceil(per_block),
                    slots as u32,
                    matrices as u32,
                ),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        (
            Kernel::MatVec8(_) | Kernel::MatVec8Many(_) | Kernel::MatVec8Qkv(_),
            Work::MatVec { rows, cols },
        ) => {
            let per_block = mv8_rows_per_block(cols) as u32;
            Ok(blocks(((rows as u32).div_ceil(per_block), 1), MV8_THREADS))
        }
        // Groups of MV8_MAX_TOKENS rows of x along y.
        (Kernel::MatVec8N(_), Work::Matrix { rows, n }) => {
            let groups = n.div_ceil(MV8_MAX_TOKENS);
            if groups > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{n} rows exceed one mv8n launch"
                )));
            }
            Ok(blocks(
                ((rows as u32).div_ceil(MV8N_ROWS), groups as u32),
                MV8_THREADS,
            ))
        }
        // 16 weight rows a block.
        (Kernel::Mmq(_), Work::Matrix { rows, .. }) => {
            Ok(blocks(((rows as u32).div_ceil(16), 1), MMQ_WARPS * 32))
        }
        (Kernel::GemmTc(_), Work::Matrix { rows, n }) => gemm_tc_config(rows, n, 1),
        (Kernel::GemmTcSplit(_), Work::SplitMatrix { rows, n, splits }) => {
            gemm_tc_config(rows, n, splits)
        }
        (Kernel::GemmExperts(_), Work::ExpertTiles { rows, tiles }) => {
            if tiles > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{tiles} expert tiles exceed one launch"
                )));
            }
            Ok(LaunchConfig {
                grid_dim: ((rows as u32).div_ceil(GTC_BR), tiles as u32, 1),
                block_dim: (GTC_THREADS, 1, 1),
                shared_mem_bytes: GTC_SMEM_BYTES,
            })
        }
        // 32 weight rows a warp, all rows of x, a column range along z.
        (Kernel::GemmFew(_), Work::SplitMatrix { rows, n, splits }) => {
            if n > GF_MAX_TOKENS || splits > 64 {
                return Err(BackendError::InferenceFailed(format!(
                    "{n} rows in {splits} column ranges exceed one gemm_few launch"
                )));
            }
            Ok(LaunchConfig {
                grid_dim: ((rows as u32).div_ceil(GF_WARPS * 32), 1, splits as u32),
                block_dim: (GF_WARPS * 32, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        (
            Kernel::AttentionSplit(..) | Kernel::AttentionSplitTc(_),
            Work::Chunks { n_head_kv, nsplit },
        ) => {
            if nsplit > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{nsplit} context chunks exceed one launch"
                )));
            }
            Ok(blocks((n_head_kv as u32, nsplit as u32), ATS_THREADS))
        }
        (
            Kernel::AttentionSplitRows(..) | Kernel::AttentionSplitTcRows(_),
            Work::RowChunks {
                n_head_kv,
                nsplit,
                rows,
            },
        ) => {
            if nsplit > 65535 || rows > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{nsplit} context chunks of {rows} rows exceed one launch"
                )));
            }
            Ok(LaunchConfig {
                grid_dim: (n_head_kv as u32, nsplit as u32, rows as u32),
                block_dim: (ATS_THREADS, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        // Chunks of a row along x, rows along y.
        (Kernel::KeepRows, Work::Rows { rows, cols }) => {
            if rows > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{rows} rows exceed one launch"
                )));
            }
            Ok(blocks(
                ((cols as u32).div_ceil(ELEMENT_THREADS), rows as u32),
                ELEMENT_THREADS,
            ))
        }
        // One block per (head, row).
        (Kernel::AttentionCombineRows, Work::Heads { n, n_head }) => {
            if n > 65535 {
                return Err(BackendError::InferenceFailed(format!(
                    "{n} rows exceed one launch"
                )));
            }
            Ok(blocks((n_head as u32, n as u32), ATSC_THREADS))
        }
        // A warp per row.
        (Kernel::MoeRoute, Work::Rows { rows, .. }) => Ok(blocks(
            ((rows as u32).div_ceil(MOE_ROUTE_ROWS), 1),
            MOE_ROUTE_ROWS * 32,
        )),
        // One block per head.
        (Kernel::AttentionCombine, Work::Rows { rows, .. }) => {
            Ok(blocks((rows as u32, 1), ATSC_THREADS))
        }
        (Kernel::RmsNorm | Kernel::AddRmsNorm | Kernel::LayerNorm, Work::Rows { rows, cols }) => {
            Ok(blocks((rows as u32, 1), norm_threads(cols)))
        }
        (Kernel::AddRmsNormCluster, Work::ClusterRow { cols, blocks: b }) => {
            Ok(blocks((b as u32, 1), (cols / b) as u32))
        }
        (
            Kernel::Rope
            | Kernel::KvStore
            | Kernel::Swiglu
            | Kernel::SwigluOai
            | Kernel::MoeSum
            | Kernel::MoeGatherF16
            | Kernel::Geglu
            | Kernel::Gelu
            | Kernel::AddAssign
            | Kernel::Scale
            | Kernel::CopyCols
            | Kernel::QuantizeX8
            | Kernel::GemmSplitsSum
            | Kernel::DequantF16(_)
            | Kernel::ToF16
            | Kernel::AddBias,
            Work::Elements(n),
        ) => grid_1d(n as u64, ELEMENT_THREADS),
        (Kernel::Attention, Work::Heads { n, n_head }) => {
            if n > 65535 * 1024 || n_head > 65535 {
                return Err(BackendError::InferenceFailed(
                    "attention shape exceeds one launch".into(),
                ));
            }
            Ok(blocks((n as u32, n_head as u32), ATT_THREADS))
        }
        (Kernel::QkRopeStore | Kernel::QkRopeStoreRows, Work::HeadRows { n, heads, head_dim }) => {
            if n > i32::MAX as usize || heads > 65535 {
                return Err(BackendError::InferenceFailed(
                    "attention shape exceeds one launch".into(),
                ));
            }
            Ok(blocks((n as u32, heads as u32), norm_threads(head_dim)))
        }
        (Kernel::AttentionTc, Work::Heads { n, n_head }) => {
            let tiles = (n as u32).div_ceil(ATC_BQ);
            if n_head > 65535 {
                return Err(BackendError::InferenceFailed(
                    "attention shape exceeds one launch".into(),
                ));
            }
            Ok(LaunchConfig {
                shared_mem_bytes: ATC_SMEM_BYTES,
                ..blocks((tiles, n_head as u32), ATC_THREADS)
            })
        }
        (Kernel::SampleArgmax, Work::Elements(n)) => {
            Ok(blocks((argmax_blocks(n), 1), SAMPLE_ARGMAX_THREADS))
        }
        (Kernel::SampleSelect | Kernel::SampleLogprobs, Work::Single) => {
            Ok(blocks((1, 1), SAMPLE_THREADS))
        }
        (Kernel::SampleSelectRows, Work::Rows { rows, .. }) if rows > 0 && rows <= 65535 => {
            Ok(blocks((rows as u32, 1), SAMPLE_THREADS))
        }
        (k, work) => Err(BackendError::KernelLaunchFailed(format!(
            "{} is not laid out over {work:?}",
            k.symbol()
        ))),
    }
}

/// A kernel's parameter values in its C signature's order, pushed one by one.
pub trait ParamList {
    fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>);
    /// The address of each value, in order: `cuLaunchKernelEx`'s `kernelParams`.
    fn addresses(&self, out: &mut Vec<*mut std::ffi::c_void>);
    /// The C types, in order, for comparing with the `.cu` source.
    #[cfg(test)]
    fn c_types() -> Vec<String>;
}

macro_rules! param_tuple {
    ($($p:ident . $i:tt),+) => {
        impl<$($p: Param),+> ParamList for ($($p,)+) {
            fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>) {
                $(b.arg(&self.$i);)+
            }
            fn addresses(&self, out: &mut Vec<*mut std::ffi::c_void>) {
                $(out.push(&self.$i as *const $p as *mut std::ffi::c_void);)+
            }
            #[cfg(test)]
            fn c_types() -> Vec<String> {
                vec![$($p::c_type()),+]
            }
        }
    };
}

param_tuple!(A.0);
param_tuple!(A.0, B.1);
param_tuple!(A.0, B.1, C.2);
param_tuple!(A.0, B.1, C.2, D.3);
param_tuple!(A.0, B.1, C.2, D.3, E.4);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14);
param_tuple!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15, Q.16
);
param_tuple!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15, Q.16,
    R.17
);
param_tuple!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15, Q.16,
    R.17, S.18, T.19
);

/// One kernel's parameters as two lists, the first pushed first: a kernel
/// that takes another's parameters and more (`mv8q_*` after `mv8m_*`'s).
pub struct Then<A, B>(pub A, pub B);

impl<A: ParamList, B: ParamList> ParamList for Then<A, B> {
    fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        self.0.push_all(b);
        self.1.push_all(b);
    }
    fn addresses(&self, out: &mut Vec<*mut std::ffi::c_void>) {
        self.0.addresses(out);
        self.1.addresses(out);
    }
    #[cfg(test)]
    fn c_types() -> Vec<String> {
        let mut v = A::c_types();
        v.extend(B::c_types());
        v
    }
}

/// A launch as the generic launcher sees it: which kernel, what
/// [`check_args`] checks, and the problem size the grid is laid over.
#[derive(Clone, Debug)]
pub struct Plan {
    pub kernel: Kernel,
    /// The `int` dimensions, each to lie in `1..=i32::MAX`.
    pub dims: Vec<(&'static str, usize)>,
    /// The buffers that must not be null.
    pub buffers: Vec<(&'static str, CUdeviceptr)>,
    pub work: Work,
}

/// One launch of one kernel with named, typed arguments. Implemented by
/// each kernel's argument struct in `args.rs`; `Kernels::launch` runs
/// [`KernelCall::check`], lays the grid out with [`launch_config`] and
/// pushes [`KernelCall::params`].
pub trait KernelCall {
    /// The kernel's parameters: exactly its C signature, in order (a test
    /// compares every one with the `.cu` source).
    type Params: ParamList;

    fn plan(&self) -> Plan;
    /// Checks between arguments beyond [`check_args`] (cache positions,
    /// head counts); none by default.
    fn validate(&self) -> Result<(), BackendError> {
        Ok(())
    }
    /// The values to push; called only after [`KernelCall::check`] passed,
    /// so every dimension converts to the kernel's `int` exactly.
    fn params(&self) -> Self::Params;

    /// Everything refused before a launch (M0-W-1431); the plan to launch.
    fn check(&self) -> Result<Plan, BackendError> {
        let plan = self.plan();
        check_args(plan.kernel, &plan.dims, &plan.buffers)?;
        self.validate()?;
        Ok(plan)
    }
}
