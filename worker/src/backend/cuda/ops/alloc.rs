//! `CudaOps`'s buffers: uploads from the host, and activation matrices from
//! the stream-ordered pool or, inside a graph capture, from its arena.

use cudarc::driver::result as drv;

use crate::backend::cuda::device::{driver_error, Purpose};
use crate::backend::cuda::ops::buffers::{
    shape_check, shape_error, weight_block_bytes, BufMem, CudaBuf, CudaWeight,
};
use crate::backend::cuda::ops::CudaOps;
use crate::backend::BackendError;
use crate::quant::GgmlType;

impl CudaOps {
    /// Uploads an f32 host matrix (for tests and small inputs).
    pub fn upload(
        &mut self,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<CudaBuf, BackendError> {
        self.upload_values(rows, cols, data)
    }

    /// `rows x cols` 4-byte values in a new buffer.
    pub(super) fn upload_values<T: cudarc::driver::DeviceRepr>(
        &mut self,
        rows: usize,
        cols: usize,
        data: &[T],
    ) -> Result<CudaBuf, BackendError> {
        shape_check(
            data.len() != rows * cols || std::mem::size_of::<T>() != 4,
            || format!("upload: {} values for {rows}x{cols}", data.len()),
        )?;
        let b = self.alloc_buf(rows, cols)?;
        // SAFETY: the block holds `data.len()` 4-byte values; pageable host
        // memory is staged before the call returns.
        unsafe { drv::memcpy_htod_async(b.ptr(), data, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying to the device", e))?;
        self.dev.kernels.note_write();
        Ok(b)
    }

    /// Uploads a weight from its stored bytes (`rows` rows of `cols` values
    /// of `ty`), synchronously. Vectors must be F32 with one row.
    pub fn upload_weight(
        &mut self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<CudaWeight, BackendError> {
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| {
            shape_error(format!(
                "upload_weight: {cols} values are not whole {ty} blocks"
            ))
        })? as usize;
        shape_check(
            row_bytes * rows != bytes.len() || rows == 0 || (rows == 1 && ty != GgmlType::F32),
            || {
                format!(
                    "upload_weight: {} bytes for {rows}x{cols} {ty}",
                    bytes.len()
                )
            },
        )?;
        self.dev.bind()?;
        let mem = self
            .dev
            .alloc(Purpose::Weights, weight_block_bytes(bytes.len()))?;
        // SAFETY: the block holds `bytes.len()` bytes.
        unsafe { drv::memcpy_htod_async(mem.ptr(), bytes, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying a weight", e))?;
        self.dev.synchronize()?;
        Ok(CudaWeight {
            mem,
            ty,
            rows,
            cols,
            row_bytes,
        })
    }

    pub(super) fn alloc_buf(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        self.dev.bind()?;
        let bytes = (rows * cols * 4) as u64;
        if let Some(c) = &mut self.capture {
            let size = crate::backend::cuda::device::align_up(bytes);
            if c.arena_used + size > c.arena_bytes {
                return Err(BackendError::OutOfMemory {
                    needed: size,
                    available: c.arena_bytes - c.arena_used,
                });
            }
            let ptr = c.arena + c.arena_used;
            c.arena_used += size;
            return Ok(CudaBuf::new(BufMem::Arena(ptr), rows, cols));
        }
        let mem = self.dev.alloc_async(Purpose::Scratch, bytes)?;
        Ok(CudaBuf::new(BufMem::Owned(mem), rows, cols))
    }

    /// A buffer that lives until the next launch has read it (a product's
    /// column-range parts): inside a capture the arena block of the last
    /// such buffer when it is large enough (the launches run in stream
    /// order), otherwise a buffer of its own.
    pub(super) fn temp_buf(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        let bytes = (rows * cols * 4) as u64;
        if let Some((ptr, held)) = self.capture.as_ref().and_then(|c| c.temp) {
            if held >= bytes {
                return Ok(CudaBuf::new(BufMem::Arena(ptr), rows, cols));
            }
        }
        let b = self.alloc_buf(rows, cols)?;
        if let Some(c) = &mut self.capture {
            c.temp = Some((b.ptr(), bytes));
        }
        Ok(b)
    }

    /// Zeroes a buffer just made (no other buffer's contents change, so no
    /// write is counted for `mv8_*`'s block).
    pub(super) fn zero(&self, b: &CudaBuf) -> Result<(), BackendError> {
        // SAFETY: the range is the buffer's own.
        unsafe { drv::memset_d8_async(b.ptr(), 0, b.len() * 4, self.dev.cu_stream()) }
            .map_err(|e| driver_error("zeroing device memory", e))
    }

    /// `words` in a new buffer (index lists for kernels that read `int`s).
    pub(in crate::backend::cuda) fn upload_words(
        &mut self,
        words: &[u32],
    ) -> Result<CudaBuf, BackendError> {
        self.upload_values(1, words.len(), words)
    }
}
