//! The kernels of `cuda/gemm.cu`: matrix products for many rows of x on
//! tensor cores (`gemm_tc_*` on 3xTF32 for the float formats; for the
//! quantized formats `gemm_tck_*` on weight tiles decoded to f16 against
//! x's two f16 parts, short prompts on `gemm_few_*`, a mixture of experts'
//! rows on `gemm_moe_*`), and `dequant_f16_*` for cuBLAS; which of them a
//! short prompt's product takes and over how many column ranges
//! (`Kernels::gemm_splits`), and when cuBLAS takes it instead.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig};
use half::f16;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    format_kernels, grid_1d, kernel_params, plan, refusal, Family, KernelCall, Plan, Work,
    ELEMENT_THREADS,
};
#[cfg(test)]
use crate::backend::cuda::kernels::MatmulCall;
use crate::backend::cuda::kernels::StoredParams;
use crate::backend::cuda::kernels::{
    check_stacked, expert_rows, Elementwise, GemmSplitsSumArgs, Kernel, Kernels, MatmulArgs,
    Mv8Plan, Stored,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    f16_tiles, integer_gemm, Module, GF_BLOCKS_PER_SM, GF_MAX_TOKENS, GF_WARPS, GTC_BK, GTC_BR,
    GTC_BT, GTC_SMEM_BYTES, GTC_THREADS, MV8_MAX_TOKENS,
};
use crate::backend::BackendError;
use crate::quant::GgmlType;

format_kernels! {
    /// The kernels of `gemm.cu`.
    pub enum Gemm {
        /// `gemm_tc_<type>`: matrix product for many rows of x on tensor cores,
        /// float formats (3xTF32).
        Tc = "gemm_tc",
        /// `gemm_tck_<type>`: the quantized formats' matrix product for many
        /// rows of x on tensor cores (weight tiles decoded into f16, x in two
        /// f16 parts from `to_f16`), the columns split across blocks (short
        /// prompts leave SMs idle otherwise); `gemm_splits_sum` adds the parts.
        Tck = "gemm_tck",
        /// `gemm_few_<type>`: the same product for up to `GF_MAX_TOKENS` rows
        /// of x (short prompts), weights decoded straight into the tensor
        /// cores' fragments: the weights' stream, no shared-memory tiles.
        Few = "gemm_few",
        /// `gemm_moe_<type>`: `gemm_tck_*`'s product for a mixture of experts'
        /// rows of x gathered by expert, every expert in one launch (prefill).
        Moe = "gemm_moe",
        /// `dequant_f16_<type>`: rows of a stored matrix as f16, for cuBLAS
        /// (`blas.rs`).
        DequantF16 = "dequant_f16",
    }
}

impl Family for Gemm {
    const MODULE: Module = Module::GemmTc;

    fn all() -> Vec<Gemm> {
        let mut v = Vec::new();
        for t in GgmlType::ALL {
            v.push(Gemm::DequantF16(t));
            // The quantized formats' GEMM is gemm_tck_* (x split once into
            // f16 parts); the others' gemm_tc_* (3xTF32).
            if integer_gemm(t) {
                v.extend([Gemm::Tck(t), Gemm::Few(t)]);
            } else {
                v.push(Gemm::Tc(t));
            }
            if f16_tiles(t) {
                v.push(Gemm::Moe(t));
            }
        }
        v
    }
    fn symbol(self) -> String {
        self.name()
    }
    fn format(self) -> Option<GgmlType> {
        Some(self.weight_format())
    }
    fn part(self) -> Option<u8> {
        match self {
            Gemm::Tc(_) | Gemm::Tck(_) | Gemm::DequantF16(_) => Some(0),
            Gemm::Few(_) => Some(1),
            Gemm::Moe(_) => Some(2),
        }
    }
    fn dynamic_smem(self) -> Option<u32> {
        match self {
            Gemm::Tc(_) | Gemm::Tck(_) | Gemm::Moe(_) => Some(GTC_SMEM_BYTES),
            Gemm::Few(_) | Gemm::DequantF16(_) => None,
        }
    }
    fn prefers_shared_memory(self) -> bool {
        matches!(self, Gemm::Tc(_) | Gemm::Tck(_) | Gemm::Moe(_))
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        Some(match (self, work) {
            (Gemm::Tc(_), Work::Matrix { rows, n }) => gemm_tc_config(rows, n, 1),
            (Gemm::Tck(_), Work::SplitMatrix { rows, n, splits }) => {
                gemm_tc_config(rows, n, splits)
            }
            (Gemm::Moe(_), Work::ExpertTiles { rows, tiles }) => {
                if tiles > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{tiles} expert tiles exceed one launch"
                    ))));
                }
                Ok(LaunchConfig {
                    grid_dim: ((rows as u32).div_ceil(GTC_BR), tiles as u32, 1),
                    block_dim: (GTC_THREADS, 1, 1),
                    shared_mem_bytes: GTC_SMEM_BYTES,
                })
            }
            // 32 weight rows a warp, all rows of x, a column range along z.
            (Gemm::Few(_), Work::SplitMatrix { rows, n, splits }) => {
                if n > GF_MAX_TOKENS || splits > 64 {
                    return Some(Err(BackendError::Shape(format!(
                        "{n} rows in {splits} column ranges exceed one gemm_few launch"
                    ))));
                }
                Ok(LaunchConfig {
                    grid_dim: ((rows as u32).div_ceil(GF_WARPS * 32), 1, splits as u32),
                    block_dim: (GF_WARPS * 32, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            (Gemm::DequantF16(_), Work::Elements(n)) => grid_1d(n as u64, ELEMENT_THREADS),
            _ => return None,
        })
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            Gemm::Tc(_) => pushed::<MatmulCall>(),
            Gemm::Tck(_) | Gemm::Few(_) => pushed::<GemmTcSplitCall>(),
            Gemm::Moe(_) => pushed::<ExpertGemmArgs>(),
            Gemm::DequantF16(_) => pushed::<DequantF16Args>(),
        }
    }
}

/// `gemm_tc_*` (`splits` = 1) and `gemm_tck_*`: a block per tile of `GTC_BR`
/// weight rows by `GTC_BT` rows of x, for each column range along z.
fn gemm_tc_config(rows: usize, n: usize, splits: usize) -> Result<LaunchConfig, BackendError> {
    let tiles_n = (n as u32).div_ceil(GTC_BT);
    if tiles_n > 65535 || splits > 64 {
        return Err(BackendError::Shape(format!(
            "{n} rows in {splits} column ranges exceed one matmul launch"
        )));
    }
    Ok(LaunchConfig {
        grid_dim: ((rows as u32).div_ceil(GTC_BR), tiles_n, splits as u32),
        block_dim: (GTC_THREADS, 1, 1),
        shared_mem_bytes: GTC_SMEM_BYTES,
    })
}

/// From this many rows of x on, matmuls in a quantized format or F16 run
/// on cuBLAS over f16 (`blas.rs`) rather than `gemm_tc_*`/`gemm_tck_*`.
pub const BLAS_MIN_ROWS: usize = 64;

/// Overrides [`BLAS_MIN_ROWS`] (a row count; `off`: never), for measuring.
pub const BLAS_MIN_ROWS_ENV: &str = "WORKER_ORCD_BLAS_MIN_ROWS";

/// The fewest 32-column steps a `gemm_tck_*` column range holds (so that
/// each block's loads have work to hide behind).
pub const GEMM_SPLIT_MIN_STEPS: usize = 8;

/// `0` keeps short prompts' matmuls on `gemm_tck_*` and `mmq_*` rather than
/// `gemm_few_*`.
pub const GEMM_FEW_ENV: &str = "WORKER_ORCD_GEMM_FEW";

/// [`BLAS_MIN_ROWS`], or what [`BLAS_MIN_ROWS_ENV`] says.
pub(crate) fn blas_min_rows_from_env() -> Result<usize, BackendError> {
    match std::env::var(BLAS_MIN_ROWS_ENV) {
        Err(_) => Ok(BLAS_MIN_ROWS),
        Ok(v) if v.trim() == "off" => Ok(usize::MAX),
        Ok(v) => v.trim().parse::<usize>().map_err(|_| {
            BackendError::InvalidDevice(format!(
                "{BLAS_MIN_ROWS_ENV}={v:?} is neither a row count nor \"off\""
            ))
        }),
    }
}

/// A short prompt's matmul: `gemm_few_*` (`few`) or `gemm_tck_*`, over
/// `splits` column ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmSplit {
    pub few: bool,
    pub splits: usize,
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

/// Blocks of a `gemm_tc_*` grid (per column range, for `gemm_tck_*`).
pub(crate) fn tc_tiles(rows: usize, n: usize) -> usize {
    rows.div_ceil(GTC_BR as usize) * n.div_ceil(GTC_BT as usize)
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

/// A matmul through `gemm_tck_*` or `gemm_few_*` (quantized formats): x
/// read as its two f16 parts, the columns split into `splits` ranges of
/// whole 32-column steps (`gemm_few_*`: 64-column chunks), range z's
/// products (no bias) written to `part + z * n * rows`;
/// [`GemmSplitsSumArgs`] adds them up.
#[derive(Clone, Copy, Debug)]
pub struct GemmTcSplitCall {
    pub args: MatmulArgs,
    /// `gemm_few_*` (up to `GF_MAX_TOKENS` rows of x), not `gemm_tck_*`.
    pub few: bool,
    /// `[2, n, w.cols]` f16, 16-byte aligned: `args.x` split by `to_f16`
    /// (x rounded, then the rounding of the rest).
    pub xh: DevPtr<f16>,
    pub splits: usize,
    /// `[splits, n, w.rows]` f32.
    pub part: DevPtrMut<f32>,
}

impl KernelCall for GemmTcSplitCall {
    fn plan(&self) -> Plan {
        let a = &self.args;
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("xh", self.xh.addr()),
            ("part", self.part.addr()),
        ];
        let (rows, n, splits) = (a.w.rows, a.n, self.splits);
        plan(
            self.kernel(),
            a.w.dims(n),
            buffers,
            Work::SplitMatrix { rows, n, splits },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let cols = self.args.w.cols;
        let step = if self.few { 64 } else { 32 };
        let steps = cols / step;
        // Every range holds a step (the kernel's ranges are ceil(steps /
        // splits) long), and the f16 rows are whole 16-byte loads.
        let per = steps.div_ceil(self.splits.max(1));
        if self.splits == 0
            || !cols.is_multiple_of(step)
            || (self.splits - 1) * per >= steps
            || !self.xh.addr().is_multiple_of(16)
        {
            let msg = format!(
                "{} column ranges of {cols} columns, x's parts at {:#x}",
                self.splits,
                self.xh.addr()
            );
            return Err(refusal(self.kernel(), msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        let a = &self.args;
        ..StoredParams = a.w.params(),
        DevPtr<f16> = self.xh,
        i32 = a.n as i32,
        i32 = self.splits as i32,
        DevPtrMut<f32> = self.part,
    }
}

impl GemmTcSplitCall {
    fn kernel(&self) -> Kernel {
        let t = self.args.w.ty;
        if self.few {
            Kernel::Gemm(Gemm::Few(t))
        } else {
            Kernel::Gemm(Gemm::Tck(t))
        }
    }
}

/// `dequant_f16_<ty>`: rows `r0 .. r0 + nrows` of `w` decoded to f16.
#[derive(Clone, Copy, Debug)]
pub struct DequantF16Args {
    pub w: Stored,
    pub r0: usize,
    pub nrows: usize,
    /// `[nrows, w.cols]` f16, 16-byte aligned.
    pub out: DevPtrMut<f16>,
}

impl KernelCall for DequantF16Args {
    fn plan(&self) -> Plan {
        let w = &self.w;
        let dims = [
            ("rows", w.rows),
            ("cols", w.cols),
            ("nrows", self.nrows),
            ("row_bytes", w.row_bytes),
        ];
        let buffers = [("w", w.ptr.addr()), ("out", self.out.addr())];
        let chunks = self.nrows * (w.cols / 8);
        plan(
            Gemm::DequantF16(w.ty),
            dims,
            buffers,
            Work::Elements(chunks),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let w = &self.w;
        if !w.cols.is_multiple_of(8)
            || self.r0 + self.nrows > w.rows
            || !self.out.addr().is_multiple_of(16)
        {
            let msg = format!(
                "rows {}..{} of {} rows of {} columns into {:#x}",
                self.r0,
                self.r0 + self.nrows,
                w.rows,
                w.cols,
                self.out.addr()
            );
            return Err(refusal(Gemm::DequantF16(w.ty), msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        ..StoredParams = self.w.params(),
        i32 = self.r0 as i32,
        i32 = self.nrows as i32,
        DevPtrMut<f16> = self.out,
    }
}

/// `gemm_moe_<ty>`: for each tile `y` of `tiles` (`[expert, first, rows,
/// 0]` i32), `out[first + i] = W_expert xh[first + i] (+ bias[expert])` for
/// `i < rows`, x in two f16 parts.
#[derive(Clone, Copy, Debug)]
pub struct ExpertGemmArgs {
    /// `[experts * rows, cols]` in a format with f16 tiles; `cols` a
    /// multiple of `GTC_BK`.
    pub w: Stored,
    pub experts: usize,
    /// `[n_tiles, 4]` i32, each tile's rows at most `GTC_BT`.
    pub tiles: DevPtr<i32>,
    pub n_tiles: usize,
    /// `[2, m, cols]` f16: the gathered rows' high parts, then their low.
    pub xh: DevPtr<f16>,
    pub m: usize,
    /// `[experts, rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[m, rows]` f32.
    pub out: DevPtrMut<f32>,
}

impl ExpertGemmArgs {
    fn rows(&self) -> usize {
        expert_rows(&self.w, self.experts)
    }
}

impl KernelCall for ExpertGemmArgs {
    fn plan(&self) -> Plan {
        let dims = [
            ("rows", self.rows()),
            ("cols", self.w.cols),
            ("row_bytes", self.w.row_bytes),
            ("experts", self.experts),
            ("n_tiles", self.n_tiles),
            ("m", self.m),
        ];
        let buffers = [
            ("w", self.w.ptr.addr()),
            ("tiles", self.tiles.addr()),
            ("xh", self.xh.addr()),
            ("out", self.out.addr()),
        ];
        let work = Work::ExpertTiles {
            rows: self.rows(),
            tiles: self.n_tiles,
        };
        plan(Gemm::Moe(self.w.ty), dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Kernel::Gemm(Gemm::Moe(self.w.ty));
        if !f16_tiles(self.w.ty) {
            return Err(refusal(k, format!("{} has no f16 tiles", self.w.ty)));
        }
        check_stacked(k, &self.w, self.experts)?;
        if !self.w.cols.is_multiple_of(GTC_BK as usize) || !self.xh.addr().is_multiple_of(16) {
            let msg = format!("rows of {} values, x at {:#x}", self.w.cols, self.xh.addr());
            return Err(refusal(k, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<u8> = self.w.ptr,
        i64 = self.w.row_bytes as i64,
        i32 = self.rows() as i32,
        i32 = self.w.cols as i32,
        i32 = self.experts as i32,
        DevPtr<i32> = self.tiles,
        DevPtr<f16> = self.xh,
        i32 = self.m as i32,
        DevPtr<f32> = DevPtr::or_null(self.bias),
        DevPtrMut<f32> = self.out,
    }
}
