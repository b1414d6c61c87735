//! The kernels of `cuda/gemm.cu`: matrix products for many rows of x on
//! tensor cores (`gemm_tc_*` on 3xTF32 for the float formats; for the
//! quantized formats `gemm_tck_*` on weight tiles decoded to f16 against
//! x's two f16 parts, short prompts on `gemm_few_*`, a mixture of experts'
//! rows on `gemm_moe_*`), and `dequant_f16_*` for cuBLAS; which of them a
//! short prompt's product takes and over how many column ranges, and
//! when cuBLAS takes it instead, are chosen in `select.rs`
//! (`Kernels::gemm_splits`, `Kernels::blas_choice`) on the bounds here.

use cudarc::driver::LaunchConfig;
use half::f16;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    format_kernels, grid_1d, kernel_params, plan, refusal, Family, KernelCall, Plan, Work,
    ELEMENT_THREADS,
};
use crate::backend::cuda::kernels::matmul::MatmulArgs;
#[cfg(test)]
use crate::backend::cuda::kernels::matmul::MatmulCall;
use crate::backend::cuda::kernels::matvec::{check_stacked, expert_rows};
use crate::backend::cuda::kernels::operands::{Stored, StoredParams};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    f16_tiles, integer_gemm, Module, GF_MAX_TOKENS, GF_WARPS, GTC_BK, GTC_BR, GTC_BT,
    GTC_SMEM_BYTES, GTC_THREADS,
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
            Gemm::Tc(_) => pushed::<MatmulCall<Gemm>>(),
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

/// Blocks of a `gemm_tc_*` grid (per column range, for `gemm_tck_*`).
pub(crate) fn tc_tiles(rows: usize, n: usize) -> usize {
    rows.div_ceil(GTC_BR as usize) * n.div_ceil(GTC_BT as usize)
}

/// A matmul through `gemm_tck_*` or `gemm_few_*` (quantized formats): x
/// read as its two f16 parts, the columns split into `splits` ranges of
/// whole 32-column steps (`gemm_few_*`: 64-column chunks), range z's
/// products (no bias) written to `part + z * n * rows`;
/// [`GemmSplitsSumArgs`](crate::backend::cuda::kernels::elementwise::GemmSplitsSumArgs) adds them up.
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
    type Kernel = Gemm;
    fn plan(&self) -> Plan<Self::Kernel> {
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
    fn kernel(&self) -> Gemm {
        let t = self.args.w.ty;
        if self.few {
            Gemm::Few(t)
        } else {
            Gemm::Tck(t)
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
    type Kernel = Gemm;
    fn plan(&self) -> Plan<Self::Kernel> {
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
    type Kernel = Gemm;
    fn plan(&self) -> Plan<Self::Kernel> {
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
        let k = Gemm::Moe(self.w.ty);
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
