//! The kernel sources (M0-W-1430): the `cuda/*.cu` modules and `cuda/*.cuh`
//! headers embedded in the binary, and the constants Rust and CUDA share.
//!
//! The shared constants are defined here only. NVRTC gets each of them as a
//! `-D NAME=value` option ([`defines`]), so a kernel's block size or tile
//! and the launch geometry the host computes from it cannot drift apart; the
//! `.cu` files refuse to compile without them (`#error`). The defines are
//! part of the compile options and so of the disk cache key: a changed
//! constant never loads a stale image.
//!
//! This module is the bottom of `backend::cuda`'s kernel stack: `nvrtc`
//! compiles what it lists, `launch` and `kernels` launch what it names.

/// Defines each constant and lists it in [`SHARED_CONSTANTS`], so that no
/// constant can be shared without reaching NVRTC.
macro_rules! shared_constants {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[$doc])* pub const $name: $ty = $value;)*

        /// Every constant shared with the kernels, by its CUDA name.
        pub const SHARED_CONSTANTS: &[(&str, u64)] = &[$((stringify!($name), $name as u64)),*];
    };
}

shared_constants! {
    /// Largest number of activation rows `mv_*` / `mvw_*` take per launch.
    MV_MAX_TOKENS: usize = 8;
    /// Threads per `mv_*` / `mvw_*` block: one weight row per block (`mv_*`),
    /// or one per warp (`mvw_*`).
    MV_THREADS: u32 = 128;
    /// Output tile of `gemm_*`: `GEMM_BM` weight rows by `GEMM_BN` rows of x,
    /// over slices of `GEMM_BK` columns, with `GEMM_THREADS` threads a block.
    /// `matmul.cu` asserts the values its thread layout assumes.
    GEMM_BM: u32 = 64;
    GEMM_BN: u32 = 64;
    GEMM_BK: u32 = 32;
    GEMM_THREADS: u32 = 256;
    /// Threads of the one block of `sample_select` and `sample_logprobs`.
    SAMPLE_THREADS: u32 = 1024;
    /// Most log-probabilities `sample_logprobs` returns.
    SAMPLE_MAX_LOGPROBS: usize = 20;
    /// u32 words of the sampling kernels' result block: `[0]` id, `[1]` count,
    /// `[2]` max, `[4..6)` log-sum-exp, then (id, value) pairs from `[8]`.
    SAMPLE_OUT_WORDS: usize = 8 + 2 * SAMPLE_MAX_LOGPROBS;
    /// Threads per `attention` block, and the largest head size it takes (its
    /// shared memory is sized for it; a multiple of 64, see attention.cu).
    ATT_THREADS: u32 = 256;
    ATT_MAX_HEAD_DIM: usize = 256;
}

/// The NVRTC options that define [`SHARED_CONSTANTS`] for every module.
pub fn defines() -> Vec<String> {
    SHARED_CONSTANTS.iter().map(|(name, v)| format!("-D{name}={v}")).collect()
}

/// Headers every module may include, by the name used in `#include "..."`.
pub const HEADERS: [(&str, &str); 2] = [
    ("common.cuh", include_str!("../../../../cuda/common.cuh")),
    ("dequant.cuh", include_str!("../../../../cuda/dequant.cuh")),
];

/// One `cuda/*.cu` file, compiled as one CUDA module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    Embed,
    Matmul,
    Norm,
    Rope,
    Attention,
    Elementwise,
    Sample,
}

impl Module {
    pub const ALL: [Module; 7] = [
        Module::Embed,
        Module::Matmul,
        Module::Norm,
        Module::Rope,
        Module::Attention,
        Module::Elementwise,
        Module::Sample,
    ];

    pub fn file_name(self) -> &'static str {
        match self {
            Module::Embed => "embed.cu",
            Module::Matmul => "matmul.cu",
            Module::Norm => "norm.cu",
            Module::Rope => "rope.cu",
            Module::Attention => "attention.cu",
            Module::Elementwise => "elementwise.cu",
            Module::Sample => "sample.cu",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Module::Embed => include_str!("../../../../cuda/embed.cu"),
            Module::Matmul => include_str!("../../../../cuda/matmul.cu"),
            Module::Norm => include_str!("../../../../cuda/norm.cu"),
            Module::Rope => include_str!("../../../../cuda/rope.cu"),
            Module::Attention => include_str!("../../../../cuda/attention.cu"),
            Module::Elementwise => include_str!("../../../../cuda/elementwise.cu"),
            Module::Sample => include_str!("../../../../cuda/sample.cu"),
        }
    }
}
