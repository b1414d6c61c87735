//! Of `matvec.cu`'s family (`matvec/mod.rs` says what each file holds):
//! `mv1_*` and the family's enum (`Matvec`), with the bounds its
//! kernels are chosen by.

use crate::backend::cuda::kernels::launch::{
    format_kernels, kernel_params, plan, refusal, KernelCall, Plan, Work,
};
use crate::backend::cuda::kernels::matmul::{MatmulArgs, MV_LOOP_MAX_TOKENS};
use crate::backend::cuda::kernels::operands::StoredParams;
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{MMQ_MAX_TOKENS, MV8_MAX_TOKENS, MV8_ROWS, MV8_THREADS};
use crate::backend::BackendError;
use crate::quant::GgmlType;

format_kernels! {
    /// The kernels of `matvec.cu`.
    pub enum Matvec {
        /// `mv1_<type>`: matrix product for one row of x (decode), streaming
        /// tiles of `MV1_ROWS` weight rows through shared memory.
        MatVec1 = "mv1",
        /// `mv1e_<type>`: `mv1_<type>` over the experts a router chose, one
        /// grid row per (token, chosen expert), the expert read on the device.
        MatVecExperts = "mv1e",
        /// `mv8e_<type>`: `mv8_<type>` over the experts a router chose, laid
        /// out as `mv1e_<type>`, from x split by `quantize_x8` (or `swiglu_oai`).
        MatVec8Experts = "mv8e",
        /// `mv8_<type>`: matrix product for one row of x (decode) on the integer
        /// units, from x split by `quantize_x8`; `MV8_ROWS` weight rows a block.
        MatVec8 = "mv8",
        /// `mv8m_<type>`: `mv8_<type>` for up to three matrices of one width
        /// and x in one launch (Q, K and V; gate and up).
        MatVec8Many = "mv8m",
        /// `mv8q_<type>`: `mv8m_<type>` of Q, K and V with Q's and K's heads
        /// turned (RoPE, adjacent pairs) and K and V stored in the cache, as
        /// `qk_rope_store` does them.
        MatVec8Qkv = "mv8q",
        /// `mv8n_<type>`: the same for several rows of x, in groups of
        /// `MV8_MAX_TOKENS` (the grid's y), `MV8N_ROWS` weight rows a block.
        MatVec8N = "mv8n",
        /// `mmq_<type>`: 9 to `MMQ_MAX_TOKENS` rows of x (short prompts) on the
        /// integer tensor cores, from x split by `quantize_x8` (Q8_0).
        Mmq = "mmq",
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

/// From this many weight rows on, one row of x goes through `mv1_*` (which
/// streams 8 rows a block: faster than `mvw_*` from 4096 rows on, and no
/// faster below ~2048; `benches/results/kernel-choices.md`).
pub const MV1_MIN_ROWS: usize = 2048;

/// Up to this many rows of x, quantized formats with `mv8n_*` run it over
/// groups of `MV8_MAX_TOKENS` rows (short prompts: each group reads the
/// weights once) instead of `mv_*` groups or a GEMM.
pub const MV8_LOOP_MAX_TOKENS: usize = MV_LOOP_MAX_TOKENS;

/// How a matmul runs on the integer mat-vec kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mv8Plan {
    /// One row of x: `mv8_*`.
    One,
    /// Several rows: `mv8n_*` per group of `MV8_MAX_TOKENS`.
    Rows,
    /// A short prompt's rows (more than `MV8_MAX_TOKENS`, up to
    /// [`MMQ_MAX_ROWS`]) in one `mmq_*` launch, where the format has it.
    Mma,
}

/// The most rows of x that go to `mmq_*` (the kernel takes up to
/// `MMQ_MAX_TOKENS`), and only for a matrix too small to fill the SMs with
/// `gemm_few_*` blocks (see `Kernels::few_fills`): there `mmq_*` was the
/// faster up to 16 rows and `gemm_few_*` from 20; a matrix that fills the
/// SMs runs faster on `gemm_few_*` from 9 rows
/// (`benches/results/kernel-choices.md`).
pub const MMQ_MAX_ROWS: usize = 16;
const _: () = assert!(MMQ_MAX_ROWS <= MMQ_MAX_TOKENS && MMQ_MAX_ROWS > MV8_MAX_TOKENS);

/// Where a decode step's RoPE and KV store run with the Q, K and V
/// products (`mv8q_*`): `0` never (`qk_rope_store` after `mv8m_*`), `all`
/// wherever the products allow it, otherwise (the default) only for
/// launches of one wave of blocks ([`MV8Q_BLOCKS_PER_SM`] an SM): a
/// launch of more waves gained little or nothing, one of a wave gained
/// most (`benches/results/kernel-choices.md`).
pub const QKV_ROPE_ENV: &str = "WORKER_ORCD_QKV_ROPE";

/// Blocks of `mv8q_*` an SM holds at once (128 threads a block: 16 fill an
/// SM's 2,048 threads).
pub const MV8Q_BLOCKS_PER_SM: usize = 16;

/// The most blocks of a `mv8q_*` launch by the environment
/// ([`QKV_ROPE_ENV`]) on a GPU of `sm_count` SMs.
pub fn qkv_rope_max_blocks(sm_count: usize) -> usize {
    match std::env::var(QKV_ROPE_ENV).as_deref() {
        Ok("0") => 0,
        Ok("all") => usize::MAX,
        _ => MV8Q_BLOCKS_PER_SM * sm_count,
    }
}

/// `0` keeps a mixture of experts' decode products on `mv1e_*` (f32 x)
/// rather than `mv8e_*`.
pub const MV8_EXPERTS_ENV: &str = "WORKER_ORCD_MV8_EXPERTS";

/// A matmul of one row of x through `mv1_*`, whose signature has no row count.
#[derive(Clone, Copy, Debug)]
pub struct MatVec1Call {
    args: MatmulArgs,
}

impl MatmulArgs {
    /// As run by `mv1_*`; `n` must be 1.
    pub(crate) fn one_row(self) -> MatVec1Call {
        MatVec1Call { args: self }
    }
}

impl KernelCall for MatVec1Call {
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        let a = &self.args;
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("x", a.x.addr()),
            ("out", a.out.addr()),
        ];
        plan(
            Matvec::MatVec1(a.w.ty),
            a.w.dims(a.n),
            buffers,
            Work::Matrix {
                rows: a.w.rows,
                n: a.n,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.args.n != 1 {
            return Err(refusal(
                Matvec::MatVec1(self.args.w.ty),
                format!("{} rows of x, not 1", self.args.n),
            ));
        }
        Ok(())
    }
    kernel_params! { self =>
        let a = &self.args;
        ..StoredParams = a.w.params(),
        DevPtr<f32> = a.x,
        DevPtr<f32> = DevPtr::or_null(a.bias),
        DevPtrMut<f32> = a.out,
    }
}
