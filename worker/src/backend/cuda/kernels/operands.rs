//! Operands several families' argument structs share: a matrix in its
//! stored format ([`Stored`]) and where rows go in a KV cache
//! ([`CacheWindow`]). Dimensions are `usize` here and `int` in CUDA:
//! `KernelCall::check` has refused anything outside `1..=i32::MAX` before
//! `params` converts them.

use crate::backend::cuda::kernels::launch::{param_group, refusal};
use crate::backend::cuda::kernels::Kernel;
use crate::backend::cuda::ptr::DevPtr;
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
    pub(crate) fn check(&self, k: Kernel, n: usize) -> Result<(), BackendError> {
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
