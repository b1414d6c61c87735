//! Which kernel a product or an attention takes, among the variants of
//! one family and across families (a matmul on `matmul.cu`'s `mv_*`,
//! `matvec.cu`'s `mv1_*` or `gemm.cu`'s `gemm_tc_*`), on the switches
//! [`Kernels`] holds and the kernels it loaded. It sits above the family
//! files, which say what each kernel is and how it is launched, and above
//! `loader.rs`; the thresholds it compares with are written beside the
//! kernels they choose (`MV_WARP_MIN_ROWS` in `matmul.rs`, `MMQ_MAX_ROWS`
//! in `matvec/mod.rs`, ...).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::f16;

use super::attention_split::{
    AttentionCombineArgs, AttentionSplitArgs, ContextSplit, SPLIT_BLOCKS_PER_SM,
};
use super::attention_tc::AttentionTc;
use super::elementwise::{Elementwise, GemmSplitsSumArgs};
use super::gemm::{tc_tiles, Gemm, GemmSplit, GemmTcSplitCall, GEMM_SPLIT_MIN_STEPS};
use super::kernel::Kernel;
use super::launch::KernelCall;
use super::loader::Kernels;
use super::matmul::{Matmul, MatmulArgs, MV_LOOP_MAX_TOKENS, MV_LOOP_SMALL_GRID_MAX_TOKENS};
#[cfg(test)]
use super::matvec::qkv_rope_max_blocks;
use super::matvec::{
    mv8_rows_per_block, MatVec8Call, MatVec8ManyCall, MatVec8NCall, Matvec, MmqCall, Mv8Plan,
    MMQ_MAX_ROWS, MV8_LOOP_MAX_TOKENS,
};
use super::operands::X8Bufs;
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    integer_gemm, ATC_HEAD_DIMS, ATS_MAX_SPLITS, GEMM_BM, GEMM_BN, GF_BLOCKS_PER_SM, GF_MAX_TOKENS,
    GF_WARPS, MV8_MAX_TOKENS, MV_MAX_TOKENS,
};
use crate::backend::{BackendError, KvType};
use crate::quant::GgmlType;

impl Kernels {
    /// Changes the row count from which `mvw_*` is used (for tests and benchmarks).
    pub fn set_mv_warp_min_rows(&self, rows: usize) {
        self.mv_warp_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Changes the row count from which `mv1_*` is used (for tests and
    /// benchmarks; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_mv1_min_rows(&self, rows: usize) {
        self.mv1_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Changes the grid size from which `gemm_tc_*` is used (for tests and
    /// benchmarks; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_tc_min_blocks(&self, blocks: usize) {
        self.tc_min_blocks.store(blocks, Ordering::Relaxed);
    }

    /// A batched decode step's product (`CudaOps` rows mode) in a format
    /// without `mv8_*`: `mv_<ty>` (`mvw_<ty>` from [`MV_WARP_MIN_ROWS`](super::matmul::MV_WARP_MIN_ROWS)
    /// weight rows on) over groups of up to [`MV_MAX_TOKENS`] rows of x,
    /// whatever `n` is, so that a row's result does not depend on how many
    /// rows share the step (`matmul` takes `mv1_*` for one row).
    pub fn matmul_rows(&self, s: &Arc<CudaStream>, m: &MatmulArgs) -> Result<(), BackendError> {
        m.check()?;
        let kernel = if m.w.rows >= self.mv_warp_min_rows.load(Ordering::Relaxed) {
            Matmul::Mvw(m.w.ty)
        } else {
            Matmul::Mv(m.w.ty)
        };
        for t0 in (0..m.n).step_by(MV_MAX_TOKENS) {
            let group = m.rows_of_x(t0, MV_MAX_TOKENS.min(m.n - t0));
            self.launch(s, &group.with_kernel(kernel))?;
        }
        Ok(())
    }

    /// `out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r])`. One row of x from
    /// [`MV1_MIN_ROWS`](super::matvec::MV1_MIN_ROWS) weight rows on: `mv1_<ty>`. Otherwise `mv_<ty>` (or
    /// `mvw_<ty>` from [`MV_WARP_MIN_ROWS`](super::matmul::MV_WARP_MIN_ROWS) rows on) over groups of up to
    /// [`MV_MAX_TOKENS`] rows of x when `n <= MV_LOOP_MAX_TOKENS`, or
    /// `n <= MV_LOOP_SMALL_GRID_MAX_TOKENS` and `gemm_<ty>` would not fill
    /// the GPU (short prompts: a block per weight row keeps every SM busy,
    /// and the weights stay in L2 between groups); else, float formats,
    /// `gemm_tc_<ty>` on tensor cores when its grid fills the GPU, or
    /// `gemm_<ty>`.
    pub fn matmul(&self, s: &Arc<CudaStream>, m: &MatmulArgs) -> Result<(), BackendError> {
        m.check()?;
        let (n, rows) = (m.n, m.w.rows);
        if n == 1 && rows >= self.mv1_min_rows.load(Ordering::Relaxed) {
            return self.launch(s, &m.one_row());
        }
        let gemm_blocks = rows.div_ceil(GEMM_BM as usize) * n.div_ceil(GEMM_BN as usize);
        let few_tiles = n <= MV_LOOP_SMALL_GRID_MAX_TOKENS && gemm_blocks < self.sm_count;
        if n > MV_MAX_TOKENS && (n <= MV_LOOP_MAX_TOKENS || few_tiles) {
            for t0 in (0..n).step_by(MV_MAX_TOKENS) {
                self.matmul(s, &m.rows_of_x(t0, MV_MAX_TOKENS.min(n - t0)))?;
            }
            return Ok(());
        }
        let tc_blocks = tc_tiles(rows, n);
        // The quantized formats' tensor-core GEMM (`gemm_tck_*`) takes x's
        // f16 parts: `CudaOps::matmul` runs it (`gemm_splits`).
        if n > MV_MAX_TOKENS
            && tc_blocks >= self.tc_min_blocks.load(Ordering::Relaxed)
            && !integer_gemm(m.w.ty)
        {
            return self.launch(s, &m.with_kernel(Gemm::Tc(m.w.ty)));
        }
        let kernel = if n > MV_MAX_TOKENS {
            Matmul::Gemm(m.w.ty)
        } else if rows >= self.mv_warp_min_rows.load(Ordering::Relaxed) {
            Matmul::Mvw(m.w.ty)
        } else {
            Matmul::Mv(m.w.ty)
        };
        self.launch(s, &m.with_kernel(kernel))
    }
}

impl Kernels {
    /// Turns `mv8_*` on or off (for tests and benchmarks).
    #[cfg(test)]
    pub fn set_mv8(&self, on: bool) {
        self.mv8.store(on, Ordering::Relaxed);
    }

    /// Whether one row of x may go through `mv8_*` at all.
    pub fn mv8_enabled(&self) -> bool {
        self.mv8.load(Ordering::Relaxed)
    }

    /// Whether chosen experts' products in format `t` may take `mv8e_*`:
    /// the integer mat-vec on (and not turned off for experts by
    /// [`MV8_EXPERTS_ENV`](super::matvec::MV8_EXPERTS_ENV)), the kernel compiled.
    pub fn mv8_experts_ready(&self, t: GgmlType) -> bool {
        self.mv8_experts
            && self.mv8.load(Ordering::Relaxed)
            && self
                .funcs
                .contains_key(&Kernel::Matvec(Matvec::MatVec8Experts(t)))
    }

    /// Whether a short prompt's matmul in format `t` takes `mmq_*`: the
    /// kernel compiled, and the short-prompt kernels on (`set_gemm_split`,
    /// which switches `gemm_tck_*` and this alike).
    pub(super) fn mmq_ready(&self, t: GgmlType) -> bool {
        self.gemm_split.load(Ordering::Relaxed)
            && self.funcs.contains_key(&Kernel::Matvec(Matvec::Mmq(t)))
    }

    /// Whether this matmul runs on `mv8_*` from a quantized x, and how: one
    /// row (`mv8_*`), a short prompt's rows in a format with `mmq_*`, or up
    /// to [`MV8_LOOP_MAX_TOKENS`] rows of x (`mv8n_*`) in a format that has
    /// such a kernel compiled.
    pub fn mv8_choice(&self, m: &MatmulArgs) -> Option<Mv8Plan> {
        let w = &m.w;
        if !self.mv8_applies(m) {
            return None;
        }
        match m.n {
            1 => Some(Mv8Plan::One),
            n if n > MV8_MAX_TOKENS
                && n <= MMQ_MAX_ROWS
                && self.mmq_ready(w.ty)
                && !(self.few_ready(m) && self.few_fills(w.rows, w.cols)) =>
            {
                Some(Mv8Plan::Mma)
            }
            n if n <= MV8_LOOP_MAX_TOKENS => Some(Mv8Plan::Rows),
            _ => None,
        }
    }

    /// Whether the integer mat-vec kernels take this product: on, whole
    /// 32-column groups, compiled for the format.
    pub fn mv8_applies(&self, m: &MatmulArgs) -> bool {
        self.mv8.load(Ordering::Relaxed)
            && m.w.cols.is_multiple_of(32)
            && self
                .funcs
                .contains_key(&Kernel::Matvec(Matvec::MatVec8(m.w.ty)))
    }

    /// `out = x W^T (+ bias)` on `mv8_*` as `plan` says, from x split into `x8`.
    pub fn matvec8(
        &self,
        s: &Arc<CudaStream>,
        m: &MatmulArgs,
        plan: Mv8Plan,
        x8: X8Bufs,
    ) -> Result<(), BackendError> {
        match plan {
            Mv8Plan::One => self.launch(s, &MatVec8Call { args: *m, x8 }),
            Mv8Plan::Mma => self.launch(s, &MmqCall { args: *m, x8 }),
            Mv8Plan::Rows => self.launch(s, &MatVec8NCall { args: *m, x8 }),
        }
    }

    /// Two or three products of one row of x (`products`, of one format
    /// with `mv8_*` and one width) in one `mv8m_*` launch, from x split into
    /// `x8`; each output as `matvec8` would write it.
    pub fn matvec8_many(
        &self,
        s: &Arc<CudaStream>,
        products: &[MatmulArgs],
        x8: X8Bufs,
    ) -> Result<(), BackendError> {
        let (Some(&first), 2..=3) = (products.first(), products.len()) else {
            return Err(BackendError::KernelLaunchFailed(format!(
                "mv8m takes 2 or 3 products, not {}",
                products.len()
            )));
        };
        let mut args = [first; 3];
        args[..products.len()].copy_from_slice(products);
        self.launch(
            s,
            &MatVec8ManyCall {
                args,
                count: products.len(),
                x8,
            },
        )
    }

    /// Whether Q, K and V of one row of x (`q`, `k`, `v`) take one
    /// `mv8q_*` launch: each on `mv8_*` alone, of one format and width, the
    /// kernel compiled, no more blocks than [`QKV_ROPE_ENV`](super::matvec::QKV_ROPE_ENV) allows,
    /// and an f16 KV cache (it stores values one at a time; a quantized
    /// cache's blocks are stored by `qk_rope_store`).
    /// (With the RoPE's angle taken after the products, each block's life
    /// grew and a launch of more than a wave lost speed; the angle is now
    /// taken while the weights load.)
    pub fn qkv_rope_ready(&self, q: &MatmulArgs, k: &MatmulArgs, v: &MatmulArgs) -> bool {
        let same = |a: &MatmulArgs| {
            self.mv8_choice(a) == Some(Mv8Plan::One)
                && (a.w.ty, a.w.cols, a.w.row_bytes) == (q.w.ty, q.w.cols, q.w.row_bytes)
        };
        let per_block = mv8_rows_per_block(q.w.cols);
        let blocks: usize = [q, k, v].iter().map(|a| a.w.rows.div_ceil(per_block)).sum();
        self.kv_type == KvType::F16
            && same(q)
            && same(k)
            && same(v)
            && blocks <= self.qkv_rope_max_blocks.load(Ordering::Relaxed)
            && self
                .funcs
                .contains_key(&Kernel::Matvec(Matvec::MatVec8Qkv(q.w.ty)))
    }

    /// Sets the most blocks a `mv8q_*` launch may take (0: none; `None`:
    /// as the environment says), for tests.
    #[cfg(test)]
    pub fn set_qkv_rope(&self, max_blocks: Option<usize>) {
        let max = max_blocks.unwrap_or_else(|| qkv_rope_max_blocks(self.sm_count));
        self.qkv_rope_max_blocks.store(max, Ordering::Relaxed);
    }
}

/// `gemm_few_*` blocks along the weight rows (32 a warp).
fn few_row_blocks(rows: usize) -> usize {
    rows.div_ceil(GF_WARPS as usize * 32)
}

/// `splits` ranges of `steps` as the kernels cut them (ceil(steps /
/// splits) long), fewer where that leaves the last ones empty.
fn even_ranges(steps: usize, splits: usize) -> usize {
    steps.div_ceil(steps.div_ceil(splits.max(1)))
}

impl Kernels {
    /// Whether `gemm_few_*` takes this matmul: short-prompt kernels on, few
    /// enough rows of x, whole 64-column chunks, the kernel compiled.
    pub(super) fn few_ready(&self, m: &MatmulArgs) -> bool {
        m.n <= GF_MAX_TOKENS && self.few_takes(m)
    }

    /// Whether `gemm_few_*` takes this matrix, in groups of up to
    /// `GF_MAX_TOKENS` rows of x: on, whole 64-column chunks, compiled for
    /// the format.
    pub(super) fn few_takes(&self, m: &MatmulArgs) -> bool {
        self.gemm_split.load(Ordering::Relaxed)
            && self.gemm_few.load(Ordering::Relaxed)
            && m.w.cols.is_multiple_of(64)
            && self.funcs.contains_key(&Kernel::Gemm(Gemm::Few(m.w.ty)))
    }

    /// Which short-prompt kernel takes this matmul and into how many column
    /// ranges it splits it, or none: it takes more rows of x than one
    /// `mv8n_*` launch, in a quantized format with the kernel.
    /// `gemm_few_*` where it applies (see [`Kernels::few_splits`]), else
    /// `gemm_tck_*`: one range when the tiles alone give every SM a block,
    /// else as many as fit two blocks per SM (the kernel's occupancy) in
    /// one wave, each of at least [`GEMM_SPLIT_MIN_STEPS`] steps of 32
    /// columns. Depends on the shape only, so a row's result never depends
    /// on the other rows.
    pub fn gemm_splits(&self, m: &MatmulArgs) -> Option<GemmSplit> {
        let w = &m.w;
        if !self.gemm_split.load(Ordering::Relaxed)
            || m.n <= MV8_MAX_TOKENS
            || self.mv8_choice(m) == Some(Mv8Plan::Mma)
            || !w.cols.is_multiple_of(32)
        {
            return None;
        }
        if self.few_ready(m) {
            return Some(GemmSplit {
                few: true,
                splits: self.few_splits(w.rows, w.cols),
            });
        }
        if !self.funcs.contains_key(&Kernel::Gemm(Gemm::Tck(w.ty))) {
            return None;
        }
        let tiles = tc_tiles(w.rows, m.n);
        let splits = if tiles >= self.sm_count {
            1
        } else {
            // Rounded down: a grid of one wave (a second, partial wave had
            // the 8B shape's matrices wait for its few blocks).
            (2 * self.sm_count / tiles)
                .min(w.cols / 32 / GEMM_SPLIT_MIN_STEPS)
                .max(1)
        };
        Some(GemmSplit {
            few: false,
            splits: even_ranges(w.cols / 32, splits),
        })
    }

    /// A batched decode step's product (`CudaOps` rows mode) on
    /// `gemm_few_*`, where the format has it: its column ranges depend on
    /// the matrix alone and a row's sums not on the others, so a row's
    /// result is the same bits in a batch of any size, one row included
    /// (groups of up to `GF_MAX_TOKENS` rows, a launch each).
    pub fn rows_few_plan(&self, m: &MatmulArgs) -> Option<GemmSplit> {
        self.few_takes(m).then(|| GemmSplit {
            few: true,
            splits: self.few_splits(m.w.rows, m.w.cols),
        })
    }

    /// Floats of `gemm_few_*`'s column-range products for one row of x by a
    /// `rows` x `cols` matrix (its `part`).
    pub fn few_part_floats(&self, rows: usize, cols: usize) -> usize {
        self.few_splits(rows, cols) * rows
    }

    /// `gemm_few_*`'s column ranges for a `rows` x `cols` matrix: as many as
    /// fill the SMs with [`GF_BLOCKS_PER_SM`] blocks each in one wave, down
    /// to ranges of one 64-column chunk (the 0.5B shape's 896 columns are
    /// 14). The number of rows of x plays no part: a row's result is the
    /// same in any batch.
    pub(super) fn few_splits(&self, rows: usize, cols: usize) -> usize {
        let splits = (GF_BLOCKS_PER_SM * self.sm_count / few_row_blocks(rows))
            .min(cols / 64)
            .clamp(1, 64);
        even_ranges(cols / 64, splits)
    }

    /// Whether `gemm_few_*`'s grid for this matrix gives every SM a block.
    pub(super) fn few_fills(&self, rows: usize, cols: usize) -> bool {
        few_row_blocks(rows) * self.few_splits(rows, cols) >= self.sm_count
    }

    /// `out = x W^T (+ bias)` on `gemm_tck_*` over `splits` column ranges
    /// into `part` (`[splits, n, rows]` f32), then `gemm_splits_sum`; `xh`
    /// holds x's two f16 parts (`to_f16`).
    pub fn gemm_split(
        &self,
        s: &Arc<CudaStream>,
        m: &MatmulArgs,
        xh: DevPtr<f16>,
        plan: GemmSplit,
        part: DevPtrMut<f32>,
    ) -> Result<(), BackendError> {
        let splits = plan.splits;
        self.launch(
            s,
            &GemmTcSplitCall {
                args: *m,
                few: plan.few,
                xh,
                splits,
                part,
            },
        )?;
        let sum = GemmSplitsSumArgs {
            part: part.as_const(),
            splits,
            len: m.n * m.w.rows,
            rows: m.w.rows,
            bias: m.bias,
            out: m.out,
        };
        self.launch(s, &sum)
    }

    /// Whether this matmul runs on cuBLAS over f16 (`blas.rs`): from the
    /// threshold's rows of x on, weights in F16 or a quantized format
    /// whose `dequant_f16_*` is compiled, rows of whole 8-value chunks.
    pub fn blas_choice(&self, m: &MatmulArgs) -> bool {
        let ty = m.w.ty;
        m.n >= self.blas_min_rows.load(Ordering::Relaxed)
            && m.w.cols.is_multiple_of(8)
            && self
                .funcs
                .contains_key(&Kernel::Elementwise(Elementwise::ToF16))
            && (ty == GgmlType::F16
                || (ty.block_len() > 1
                    && self.funcs.contains_key(&Kernel::Gemm(Gemm::DequantF16(ty)))))
    }

    /// Changes the fewest rows of x that run on cuBLAS (for tests;
    /// `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_blas_min_rows(&self, rows: usize) {
        self.blas_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Turns the short-prompt kernels, `gemm_tck_*` and `mmq_*`, on or off
    /// (for tests and benchmarks).
    #[cfg(test)]
    pub fn set_gemm_split(&self, on: bool) {
        self.gemm_split.store(on, Ordering::Relaxed);
    }

    /// Turns `gemm_few_*` on or off (off: `gemm_tck_*` and `mmq_*` take
    /// the short prompts; for tests).
    #[cfg(test)]
    pub fn set_gemm_few(&self, on: bool) {
        self.gemm_few.store(on, Ordering::Relaxed);
    }
}

impl Kernels {
    /// Changes the context length from which decode attention is split (for
    /// tests and benchmarks; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_split_min_context(&self, positions: usize) {
        self.split_min_context.store(positions, Ordering::Relaxed);
    }

    /// Whether a decode step at a context of `positions` splits its attention.
    pub fn splits_attention_at(&self, positions: usize) -> bool {
        positions >= self.split_min_context.load(Ordering::Relaxed)
    }

    /// How a context of up to `capacity` positions is split for `n_head_kv`
    /// KV heads: [`SPLIT_BLOCKS_PER_SM`] blocks per SM (the kernel cuts the
    /// filled context into that many chunks at run time).
    pub fn context_split(&self, n_head_kv: usize, capacity: usize) -> ContextSplit {
        let nsplit = (SPLIT_BLOCKS_PER_SM * self.sm_count)
            .div_ceil(n_head_kv.max(1))
            .min(capacity)
            .clamp(1, ATS_MAX_SPLITS);
        ContextSplit { nsplit }
    }

    /// Decode attention split over the context: `attention_split`, then
    /// `attention_combine` from `split.part` into `out`.
    pub fn attention_split(
        &self,
        s: &Arc<CudaStream>,
        split: &AttentionSplitArgs,
        combine: &AttentionCombineArgs,
    ) -> Result<(), BackendError> {
        combine.check()?;
        self.launch(s, split)?;
        self.launch(s, combine)
    }
}

impl Kernels {
    /// Whether `n` query rows of heads of `head_dim` dims take `attention_tc`.
    pub fn attention_on_tensor_cores(&self, n: usize, head_dim: usize) -> bool {
        n >= self.attention_tc_min_rows.load(Ordering::Relaxed)
            && ATC_HEAD_DIMS.contains(&head_dim)
            && self
                .funcs
                .contains_key(&Kernel::AttentionTc(AttentionTc::AttentionTc))
    }

    /// Tests: the fewest query rows that take `attention_tc`
    /// ([`ATC_MIN_ROWS`](super::attention_tc::ATC_MIN_ROWS) by default; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_attention_tc_min_rows(&self, rows: usize) {
        self.attention_tc_min_rows.store(rows, Ordering::Relaxed);
    }
}
