//! Operands several families' argument structs share: a matrix in its
//! stored format ([`Stored`]), where rows go in a KV cache
//! ([`CacheWindow`]), x split for the integer mat-vec kernels ([`X8Bufs`],
//! which several kernels also write: [`SplitsOutput`]) and a batched step's
//! table of sequences ([`RowSeq`]). Dimensions are `usize` here and `int` in CUDA:
//! `KernelCall::check` has refused anything outside `1..=i32::MAX` before
//! `params` converts them.

use cudarc::driver::sys::CUdeviceptr;

use super::launch::{param_group, refusal, KernelCall, Named};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// Where rows go in (or come from) a KV cache of `capacity` positions: row
/// `t` at `start_pos + t`, unless `pos_ptr` is given, a device i32 that
/// replaces `start_pos` when a decode graph replays.
#[derive(Clone, Copy, Debug)]
pub struct CacheWindow {
    pub start_pos: usize,
    pub pos_ptr: Option<DevPtr<i32>>,
    pub capacity: usize,
}

impl CacheWindow {
    /// `n` rows fit (checked only when the position is known on the host).
    pub(crate) fn check(&self, k: impl Named, n: usize) -> Result<(), BackendError> {
        if self.pos_ptr.is_none() && self.start_pos + n > self.capacity {
            let end = self.start_pos + n;
            return Err(refusal(
                k,
                format!("positions {}..{end} of {}", self.start_pos, self.capacity),
            ));
        }
        Ok(())
    }
}

param_group! {
    /// `(int start_pos, const int* pos_ptr, int capacity)`.
    pub type WindowParams;
    impl CacheWindow {
        pub(crate) fn params(&self) {
            i32 = self.start_pos as i32,
            DevPtr<i32> = DevPtr::or_null(self.pos_ptr),
            i32 = self.capacity as i32,
        }
    }
}

/// A matrix in its stored GGUF format on the device: `rows` rows of
/// `row_bytes` bytes, each `cols` values of `ty` (an embedding table, a
/// weight matrix).
#[derive(Clone, Copy, Debug)]
pub struct Stored {
    pub ty: GgmlType,
    pub ptr: DevPtr<u8>,
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Stored {
    /// The checked dimensions of a kernel over `n` rows of input and this matrix.
    pub(crate) fn dims(&self, n: usize) -> [(&'static str, usize); 4] {
        [
            ("rows", self.rows),
            ("cols", self.cols),
            ("n", n),
            ("row_bytes", self.row_bytes),
        ]
    }
}

param_group! {
    /// `(const u8* table, i64 row_bytes, int rows, int cols)`, as every
    /// kernel over a stored matrix takes them.
    pub type StoredParams;
    impl Stored {
        pub(crate) fn params(&self) {
            DevPtr<u8> = self.ptr,
            i64 = self.row_bytes as i64,
            i32 = self.rows as i32,
            i32 = self.cols as i32,
        }
    }
}

/// Rows of x split for `mv8_*` by `quantize_x8`, in one scratch block: for
/// `len` values (rows of `cols` one after another), `[len]` i8 high parts,
/// `[len]` i8 low parts, `[len / 32]` f32 scales, `[len / 16]` f32 sums of
/// 16 values.
#[derive(Clone, Copy, Debug)]
pub struct X8Bufs {
    pub hi: DevPtrMut<i8>,
    pub lo: DevPtrMut<i8>,
    pub d: DevPtrMut<f32>,
    pub sums: DevPtrMut<f32>,
}

impl X8Bufs {
    /// Bytes of the block for `len` values.
    pub fn bytes(len: usize) -> usize {
        2 * len + len / 32 * 4 + len / 16 * 4
    }

    /// The parts of the block at `base` for `len` values (a multiple of
    /// 32, so that each part stays 16-byte aligned for the kernels' vector
    /// loads).
    pub fn at(base: CUdeviceptr, len: usize) -> X8Bufs {
        let d = base + 2 * len as u64;
        X8Bufs {
            hi: DevPtrMut::new(base),
            lo: DevPtrMut::new(base + len as u64),
            d: DevPtrMut::new(d),
            sums: DevPtrMut::new(d + (len / 32 * 4) as u64),
        }
    }

    pub(crate) fn addrs(&self) -> [(&'static str, CUdeviceptr); 4] {
        [
            ("x8 hi", self.hi.addr()),
            ("x8 lo", self.lo.addr()),
            ("x8 d", self.d.addr()),
            ("x8 sums", self.sums.addr()),
        ]
    }
}

param_group! {
    /// `(i8* hi, i8* lo, float* d, float* sums)`: x's parts as a kernel
    /// that also splits its output writes them.
    pub type X8Writes;
    impl X8Bufs {
        /// All null when there is no block (the kernel then skips the split).
        pub(crate) fn writes_or_null(x8: Option<X8Bufs>) {
            DevPtrMut<i8> = DevPtrMut::or_null(x8.map(|b| b.hi)),
            DevPtrMut<i8> = DevPtrMut::or_null(x8.map(|b| b.lo)),
            DevPtrMut<f32> = DevPtrMut::or_null(x8.map(|b| b.d)),
            DevPtrMut<f32> = DevPtrMut::or_null(x8.map(|b| b.sums)),
        }
    }
}

param_group! {
    /// `(const i8* hi, const i8* lo, const float* d, const float* sums)`:
    /// x's parts as the `mv8*` kernels read them.
    pub type X8Reads;
    impl X8Bufs {
        pub(crate) fn reads(&self) {
            DevPtr<i8> = self.hi.as_const(),
            DevPtr<i8> = self.lo.as_const(),
            DevPtr<f32> = self.d.as_const(),
            DevPtr<f32> = self.sums.as_const(),
        }
    }
}

/// A kernel that may also split its output for `mv8_*`.
pub trait SplitsOutput: KernelCall {
    /// Where it splits its output, if it does.
    fn x8(&self) -> Option<X8Bufs>;
}

/// A kernel splits its output for `mv8_*` only for one row of whole
/// 32-value groups (its warps each take one group).
pub(crate) fn validate_x8_output(
    k: impl Named,
    x8: Option<X8Bufs>,
    rows: usize,
    cols: usize,
) -> Result<(), BackendError> {
    if x8.is_some() && (rows != 1 || !cols.is_multiple_of(32)) {
        return Err(refusal(
            k,
            format!("splitting {rows} rows of {cols} values"),
        ));
    }
    Ok(())
}

/// One row's sequence in a batched step's table (common.cuh's `RowSeq`:
/// the same fields in the same order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowSeq {
    /// The sequence's KV cache: per layer a K plane then a V plane of
    /// `[n_head_kv, capacity, head_dim]` f16.
    pub cache: u64,
    /// `[vocab]` f32: where the row's logits go (the sequence's sampler).
    pub logits: u64,
    /// The row's position (the sequence's length before the step).
    pub pos: i32,
    pub capacity: i32,
}

impl crate::backend::cuda::ptr::Elem for RowSeq {
    #[cfg(test)]
    const C_NAME: &'static str = "RowSeq";
}
