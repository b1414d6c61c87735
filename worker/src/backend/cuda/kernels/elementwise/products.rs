//! The argument structs of `elementwise.cu`'s kernels around a matrix
//! product: x split for `mv8_*` (`quantize_x8`) or into two f16 parts
//! (`to_f16`, for cuBLAS and `gemm_tck_*`), a bias added to a cuBLAS
//! product (`add_bias`), and column-range parts added up
//! (`gemm_splits_sum`).

use half::f16;

use super::family::Elementwise;
use crate::backend::cuda::kernels::launch::{kernel_params, plan, refusal, KernelCall, Plan, Work};
use crate::backend::cuda::kernels::operands::X8Bufs;
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;

/// `quantize_x8`: `cols` values of x (whole rows) into [`X8Bufs`].
#[derive(Clone, Copy, Debug)]
pub struct QuantizeX8Args {
    /// `[cols]` f32.
    pub x: DevPtr<f32>,
    /// A multiple of 32 (rows of a multiple of 32 values, one after another).
    pub cols: usize,
    pub out: X8Bufs,
}

impl KernelCall for QuantizeX8Args {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        let [hi, lo, d, sums] = self.out.addrs();
        plan(
            Elementwise::QuantizeX8,
            [("cols", self.cols)],
            [("x", self.x.addr()), hi, lo, d, sums],
            Work::Elements(self.cols),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.cols.is_multiple_of(32) {
            return Err(refusal(
                Elementwise::QuantizeX8,
                format!("{} columns, not a multiple of 32", self.cols),
            ));
        }
        Ok(())
    }
    kernel_params! { self =>
        let o = &self.out;
        DevPtr<f32> = self.x,
        i32 = self.cols as i32,
        DevPtrMut<i8> = o.hi,
        DevPtrMut<i8> = o.lo,
        DevPtrMut<f32> = o.d,
        DevPtrMut<f32> = o.sums,
    }
}

/// `to_f16`: `out[i] = x[i]` as f16, `len` a multiple of 8.
#[derive(Clone, Copy, Debug)]
pub struct ToF16Args {
    /// `[len]` f32, 32-byte aligned.
    pub x: DevPtr<f32>,
    pub len: usize,
    /// `[len]` f16 each, 16-byte aligned: x rounded, and the rounding of
    /// what is left.
    pub hi: DevPtrMut<f16>,
    pub lo: DevPtrMut<f16>,
}

impl KernelCall for ToF16Args {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::ToF16,
            [("len", self.len)],
            [
                ("x", self.x.addr()),
                ("hi", self.hi.addr()),
                ("lo", self.lo.addr()),
            ],
            Work::Elements(self.len / 8),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.len.is_multiple_of(8)
            || !self.x.addr().is_multiple_of(32)
            || !self.hi.addr().is_multiple_of(16)
            || !self.lo.addr().is_multiple_of(16)
        {
            let msg = format!(
                "{} values from {:#x} to {:#x} and {:#x}",
                self.len,
                self.x.addr(),
                self.hi.addr(),
                self.lo.addr()
            );
            return Err(refusal(Elementwise::ToF16, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.x,
        i64 = (self.len / 8) as i64,
        DevPtrMut<f16> = self.hi,
        DevPtrMut<f16> = self.lo,
    }
}

/// `add_bias`: `out[i] += bias[i % rows]`.
#[derive(Clone, Copy, Debug)]
pub struct AddBiasArgs {
    /// `[len]` f32, `len` a multiple of `rows`.
    pub out: DevPtrMut<f32>,
    /// `[rows]` f32.
    pub bias: DevPtr<f32>,
    pub len: usize,
    pub rows: usize,
}

impl KernelCall for AddBiasArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::AddBias,
            [("len", self.len), ("rows", self.rows)],
            [("out", self.out.addr()), ("bias", self.bias.addr())],
            Work::Elements(self.len),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.len.is_multiple_of(self.rows.max(1)) {
            let msg = format!("{} values in rows of {}", self.len, self.rows);
            return Err(refusal(Elementwise::AddBias, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtrMut<f32> = self.out,
        DevPtr<f32> = self.bias,
        i64 = self.len as i64,
        i32 = self.rows as i32,
    }
}

/// `gemm_splits_sum`: `out[i] = sum_z part[z * len + i] (+ bias[i % rows])`.
#[derive(Clone, Copy, Debug)]
pub struct GemmSplitsSumArgs {
    /// `[splits, len]` f32.
    pub part: DevPtr<f32>,
    pub splits: usize,
    /// `n * rows`.
    pub len: usize,
    pub rows: usize,
    /// `[rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[len]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for GemmSplitsSumArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        let dims = [
            ("splits", self.splits),
            ("len", self.len),
            ("rows", self.rows),
        ];
        let buffers = [("part", self.part.addr()), ("out", self.out.addr())];
        plan(
            Elementwise::GemmSplitsSum,
            dims,
            buffers,
            Work::Elements(self.len),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.rows == 0 || !self.len.is_multiple_of(self.rows) {
            let msg = format!("{} values in rows of {}", self.len, self.rows);
            return Err(refusal(Elementwise::GemmSplitsSum, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.part,
        i32 = self.splits as i32,
        i64 = self.len as i64,
        i32 = self.rows as i32,
        DevPtr<f32> = DevPtr::or_null(self.bias),
        DevPtrMut<f32> = self.out,
    }
}
