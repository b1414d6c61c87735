//! The argument structs of the kernels around a cuBLAS product (`blas.rs`):
//! the weights and x as f16 before it, the bias after it.

use half::f16;

use super::{plan, Stored};
use crate::backend::cuda::launch::{refusal, Kernel, KernelCall, Plan, Work};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;

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
    type Params = (DevPtr<u8>, i64, i32, i32, i32, i32, DevPtrMut<f16>);

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
            Kernel::DequantF16(w.ty),
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
            return Err(refusal(Kernel::DequantF16(w.ty), msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let (w, row_bytes, rows, cols) = self.w.params();
        let (r0, nrows) = (self.r0 as i32, self.nrows as i32);
        (w, row_bytes, rows, cols, r0, nrows, self.out)
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
    type Params = (DevPtr<f32>, i64, DevPtrMut<f16>, DevPtrMut<f16>);

    fn plan(&self) -> Plan {
        plan(
            Kernel::ToF16,
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
            return Err(refusal(Kernel::ToF16, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (self.x, (self.len / 8) as i64, self.hi, self.lo)
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
    type Params = (DevPtrMut<f32>, DevPtr<f32>, i64, i32);

    fn plan(&self) -> Plan {
        plan(
            Kernel::AddBias,
            [("len", self.len), ("rows", self.rows)],
            [("out", self.out.addr()), ("bias", self.bias.addr())],
            Work::Elements(self.len),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.len.is_multiple_of(self.rows.max(1)) {
            let msg = format!("{} values in rows of {}", self.len, self.rows);
            return Err(refusal(Kernel::AddBias, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (self.out, self.bias, self.len as i64, self.rows as i32)
    }
}
