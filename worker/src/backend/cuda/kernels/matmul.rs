//! The kernels of `cuda/matmul.cu`: a matrix product over f32 tiles for
//! any number of rows of x (`mv_*` and `mvw_*` for up to `MV_MAX_TOKENS`,
//! `gemm_*` for more), and which kernel a product of f32 x takes
//! (`select.rs`'s `Kernels::matmul`, which also picks `matvec.cu`'s
//! `mv1_*` and `gemm.cu`'s `gemm_tc_*`).

use cudarc::driver::LaunchConfig;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    blocks, format_kernels, kernel_params, plan, Family, KernelCall, Named, Plan, Work,
};
use crate::backend::cuda::kernels::operands::{Stored, StoredParams};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{Module, GEMM_BM, GEMM_BN, GEMM_THREADS, MV_THREADS};
use crate::backend::BackendError;
use crate::quant::GgmlType;

format_kernels! {
    /// The kernels of `matmul.cu`.
    pub enum Matmul {
        /// `mv_<type>`: matrix product for up to `MV_MAX_TOKENS` rows of x, a block per weight row.
        Mv = "mv",
        /// `mvw_<type>`: the same with a warp per weight row, for matrices of many rows.
        Mvw = "mvw",
        /// `gemm_<type>`: tiled matrix product for any number of rows of x.
        Gemm = "gemm",
    }
}

impl Family for Matmul {
    const MODULE: Module = Module::Matmul;

    fn all() -> Vec<Matmul> {
        GgmlType::ALL
            .into_iter()
            .flat_map(|t| [Matmul::Mv(t), Matmul::Mvw(t), Matmul::Gemm(t)])
            .collect()
    }
    fn symbol(self) -> String {
        self.name()
    }
    fn format(self) -> Option<GgmlType> {
        Some(self.weight_format())
    }
    fn part(self) -> Option<u8> {
        match self {
            Matmul::Mv(_) | Matmul::Gemm(_) => Some(0),
            Matmul::Mvw(_) => Some(1),
        }
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        let Work::Matrix { rows, n } = work else {
            return None;
        };
        Some(match self {
            Matmul::Mv(_) => Ok(blocks((rows as u32, 1), MV_THREADS)),
            // A warp per weight row.
            Matmul::Mvw(_) => Ok(blocks(
                ((rows as u32).div_ceil(MV_THREADS / 32), 1),
                MV_THREADS,
            )),
            Matmul::Gemm(_) => {
                let tiles_n = (n as u32).div_ceil(GEMM_BN);
                if tiles_n > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{n} rows exceed one matmul launch"
                    ))));
                }
                Ok(blocks(
                    ((rows as u32).div_ceil(GEMM_BM), tiles_n),
                    GEMM_THREADS,
                ))
            }
        })
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        pushed::<MatmulCall<Matmul>>()
    }
}

/// Up to this many rows of x, `matmul` runs `mv_*` once per group of
/// [`MV_MAX_TOKENS`](crate::backend::cuda::source::MV_MAX_TOKENS) instead of `gemm_*`.
pub const MV_LOOP_MAX_TOKENS: usize = 32;

/// Up to this many rows of x, `mv_*` groups are also used when `gemm_*`
/// would have fewer tiles than the GPU has multiprocessors.
pub const MV_LOOP_SMALL_GRID_MAX_TOKENS: usize = 128;

/// From this many weight rows on, `matmul` uses `mvw_*` (a warp per row)
/// rather than `mv_*` (a block per row) for short x.
pub const MV_WARP_MIN_ROWS: usize = 4096;

/// For float formats, `gemm_tc_*` (3xTF32) is used when its grid has at
/// least this many blocks per SM (fewer blocks than SMs leave tensor cores
/// idle, and `gemm_*` is faster). The quantized formats' `gemm_tc_*`
/// (integers on bf16 tensor cores) beat `gemm_*` at every grid size
/// measured (`benches/results/kernel-choices.md`), so they take it wherever
/// a GEMM runs.
pub const TC_MIN_BLOCKS_PER_SM: usize = 1;

/// `out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r])` through `mv_<ty>`,
/// `mvw_<ty>` or `gemm_<ty>` (`Kernels::matmul` in `select.rs` chooses).
#[derive(Clone, Copy, Debug)]
pub struct MatmulArgs {
    pub w: Stored,
    /// `[n, w.cols]` f32.
    pub x: DevPtr<f32>,
    pub n: usize,
    /// `[w.rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[n, w.rows]` f32, not overlapping `x`.
    pub out: DevPtrMut<f32>,
}

impl MatmulArgs {
    /// The same product for rows `t0..t0 + n` of x only.
    pub fn rows_of_x(&self, t0: usize, n: usize) -> MatmulArgs {
        MatmulArgs {
            x: self.x.offset(t0 * self.w.cols),
            n,
            out: self.out.offset(t0 * self.w.rows),
            ..*self
        }
    }

    /// As run by `kernel`: one of the three matmul kernels of `w.ty`
    /// (`Matmul`), or `gemm_tc_*` (`gemm.rs`'s `Gemm::Tc`).
    pub(crate) fn with_kernel<K: Named>(self, kernel: K) -> MatmulCall<K> {
        MatmulCall { kernel, args: self }
    }

    /// The launch checks (M0-W-1431), made once before the kernel is chosen
    /// and any group is launched; named after `gemm_*`.
    pub fn check(&self) -> Result<(), BackendError> {
        self.with_kernel(Matmul::Gemm(self.w.ty))
            .check()
            .map(|_| ())
    }
}

/// A matmul with its kernel chosen (only `Kernels::matmul` chooses):
/// `mv_*`, `mvw_*`, `gemm_*` and `gemm_tc_*` share one signature.
#[derive(Clone, Copy, Debug)]
pub struct MatmulCall<K> {
    kernel: K,
    args: MatmulArgs,
}

impl<K: Named> KernelCall for MatmulCall<K> {
    type Kernel = K;
    fn plan(&self) -> Plan<Self::Kernel> {
        let a = &self.args;
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("x", a.x.addr()),
            ("out", a.out.addr()),
        ];
        plan(
            self.kernel,
            a.w.dims(a.n),
            buffers,
            Work::Matrix {
                rows: a.w.rows,
                n: a.n,
            },
        )
    }
    kernel_params! { self =>
        let a = &self.args;
        ..StoredParams = a.w.params(),
        DevPtr<f32> = a.x,
        i32 = a.n as i32,
        DevPtr<f32> = DevPtr::or_null(a.bias),
        DevPtrMut<f32> = a.out,
    }
}
