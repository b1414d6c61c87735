//! The device-side values `CudaOps` works on: weights in their stored
//! format, f32 activation matrices, one sequence's KV cache, and the checks
//! that a matrix's stated shape fits the memory behind it (M0-W-1431).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys::{self, CUdeviceptr};
use half::f16;

use crate::backend::cuda::device::{driver_error, CudaDevice, DevBuf, Purpose};
use crate::backend::cuda::kernels::Stored;
use crate::backend::cuda::kv_pool::{BlockLease, KvPool};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::{BackendError, KvType};
use crate::quant::GgmlType;

/// Bytes every weight matrix's device block holds past its data: the Q8_0
/// decode mat-vec and `gemm_tck_*` read 2-byte aligned blocks as whole
/// 16-byte aligned chunks (`ld_a16` in dequant.cuh), up to 16 bytes past the
/// last block of a tensor.
pub const WEIGHT_TAIL_BYTES: usize = 16;

/// The device block size asked for a weight matrix of `len` bytes.
pub fn weight_block_bytes(len: usize) -> u64 {
    (len + WEIGHT_TAIL_BYTES) as u64
}

/// A weight on the device: `rows` rows of `cols` values of `ty`, each row
/// `row_bytes` bytes, exactly as stored in the file. Vectors (norm weights,
/// biases) have one row and are f32.
pub struct CudaWeight {
    pub(crate) mem: DevBuf,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
}

impl CudaWeight {
    pub fn ptr(&self) -> CUdeviceptr {
        self.mem.ptr()
    }

    /// The stored rows, as a kernel reads them.
    pub(super) fn stored(&self) -> Stored {
        let (ty, row_bytes, rows, cols) = (self.ty, self.row_bytes, self.rows, self.cols);
        Stored {
            ty,
            ptr: DevPtr::new(self.ptr()),
            row_bytes,
            rows,
            cols,
        }
    }

    /// A vector weight's f32 values.
    pub(super) fn vector(&self) -> DevPtr<f32> {
        DevPtr::new(self.ptr())
    }
}

/// Where an activation matrix lives.
pub(crate) enum BufMem {
    /// Its own block from the stream-ordered pool, freed on drop.
    Owned(DevBuf),
    /// A slice of a decode graph's arena (see [`GraphCapture`]).
    Arena(CUdeviceptr),
}

/// An f32 activation matrix `[rows, cols]` on the device.
pub struct CudaBuf {
    pub(crate) mem: BufMem,
    pub rows: usize,
    pub cols: usize,
    id: u64,
}

impl CudaBuf {
    pub(crate) fn new(mem: BufMem, rows: usize, cols: usize) -> CudaBuf {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        CudaBuf {
            mem,
            rows,
            cols,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// This buffer among all made in the process: one made later at a freed
    /// buffer's address is another buffer.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn ptr(&self) -> CUdeviceptr {
        match &self.mem {
            BufMem::Owned(b) => b.ptr(),
            BufMem::Arena(p) => *p,
        }
    }

    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn row_ptr(&self, row: usize) -> CUdeviceptr {
        self.ptr() + (row * self.cols * 4) as u64
    }

    /// The matrix as a kernel input.
    pub(super) fn input(&self) -> DevPtr<f32> {
        DevPtr::new(self.ptr())
    }

    /// The matrix as a kernel output.
    pub(super) fn output(&mut self) -> DevPtrMut<f32> {
        DevPtrMut::new(self.ptr())
    }
}

/// The memory behind a KV cache.
pub(crate) enum CacheMem {
    /// Its own block (`--parallel 1`, tests).
    Block(DevBuf),
    /// Blocks of the paged pool mapped contiguously (`--parallel N`).
    Blocks(BlockLease),
}

impl CacheMem {
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        match self {
            CacheMem::Block(b) => b.ptr(),
            CacheMem::Blocks(p) => p.ptr(),
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        match self {
            CacheMem::Block(b) => b.bytes(),
            CacheMem::Blocks(p) => p.bytes(),
        }
    }
}

/// One sequence's KV cache: `[n_layer][2][n_head_kv]` parts of `capacity`
/// rows of `head_dim` values, in `kv_type`'s layout (cuda/common.cuh).
pub struct CudaCache {
    pub(super) mem: CacheMem,
    pub n_layer: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub kv_type: KvType,
}

impl CudaCache {
    /// Bytes an f16 cache of these dimensions takes.
    pub fn bytes_for(n_layer: usize, n_head_kv: usize, head_dim: usize, capacity: usize) -> u64 {
        Self::bytes_of(KvType::F16, n_layer, n_head_kv, head_dim, capacity)
    }

    /// Bytes a cache of `kv_type` and these dimensions takes.
    pub fn bytes_of(
        kv_type: KvType,
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
        capacity: usize,
    ) -> u64 {
        (n_layer * 2 * n_head_kv) as u64 * kv_type.head_bytes(capacity, head_dim)
    }

    /// Allocates a zeroed f16 cache of its own.
    pub fn new(
        dev: &Arc<CudaDevice>,
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<Self, BackendError> {
        Self::new_in(
            dev,
            None,
            KvType::F16,
            n_layer,
            n_head_kv,
            head_dim,
            capacity,
        )
    }

    /// A zeroed cache of `kv_type` on blocks of `pool` (an error when too
    /// few are free), or of its own without one.
    pub fn new_in(
        dev: &Arc<CudaDevice>,
        pool: Option<&KvPool>,
        kv_type: KvType,
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<Self, BackendError> {
        kv_type.check_head_dim(head_dim)?;
        let bytes = Self::bytes_of(kv_type, n_layer, n_head_kv, head_dim, capacity);
        let mem = match pool {
            Some(pool) => CacheMem::Blocks(pool.lease(bytes)?),
            None => CacheMem::Block(dev.alloc(Purpose::KvCache, bytes)?),
        };
        // SAFETY: the memory behind `mem` holds at least `bytes` bytes.
        unsafe { drv::memset_d8_async(mem.ptr(), 0, bytes as usize, dev.cu_stream()) }
            .map_err(|e| driver_error("zeroing a KV cache", e))?;
        Ok(CudaCache {
            mem,
            n_layer,
            n_head_kv,
            head_dim,
            capacity,
            kv_type,
        })
    }

    pub(super) fn plane_bytes(&self) -> u64 {
        self.n_head_kv as u64 * self.head_bytes()
    }

    /// Bytes of one KV head's part of a plane.
    fn head_bytes(&self) -> u64 {
        self.kv_type.head_bytes(self.capacity, self.head_dim)
    }

    /// Device addresses of layer `layer`'s K and V planes.
    pub fn planes(&self, layer: usize) -> (CUdeviceptr, CUdeviceptr) {
        let k = self.mem.ptr() + 2 * layer as u64 * self.plane_bytes();
        (k, k + self.plane_bytes())
    }

    /// Layer `layer`'s K and V planes, for kernels that write them.
    pub(super) fn planes_mut(&mut self, layer: usize) -> (DevPtrMut<f16>, DevPtrMut<f16>) {
        let (k, v) = self.planes(layer);
        (DevPtrMut::new(k), DevPtrMut::new(v))
    }

    /// Bytes its memory takes (whole blocks of a pool).
    pub fn held_bytes(&self) -> u64 {
        self.mem.bytes()
    }

    /// Copies positions `from..from + n` of `src` to positions `to..to + n`
    /// of this cache, in every layer's K and V planes (a 2-D copy of levels
    /// and one of scales: a row per layer, K or V, and head), queued on
    /// `dev`'s stream. The prefix cache's copies of a chunk out of a
    /// sequence and into another.
    pub fn copy_positions(
        &mut self,
        dev: &CudaDevice,
        src: &CudaCache,
        from: usize,
        to: usize,
        n: usize,
    ) -> Result<(), BackendError> {
        let same_shape = (src.n_layer, src.n_head_kv, src.head_dim, src.kv_type)
            == (self.n_layer, self.n_head_kv, self.head_dim, self.kv_type);
        shape_check(
            !same_shape || from + n > src.capacity || to + n > self.capacity,
            || {
                format!(
                    "copy_positions {from}+{n} of a cache of {} positions to {to} of {}",
                    src.capacity, self.capacity
                )
            },
        )?;
        // A head's part is its levels, then its scales (quantized types):
        // each is a 2-D copy with a row per layer, K or V, and head.
        let (levels, scales) = (
            self.kv_type.level_bytes(self.head_dim),
            self.kv_type.scale_bytes(self.head_dim),
        );
        dev.bind()?;
        for (row, src_at, dst_at) in [
            (levels, 0, 0),
            (scales, src.capacity * levels, self.capacity * levels),
        ] {
            if row == 0 {
                continue;
            }
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: src_at + from * row,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: src.mem.ptr(),
                srcArray: std::ptr::null_mut(),
                srcPitch: src.head_bytes() as usize,
                dstXInBytes: dst_at + to * row,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: self.mem.ptr(),
                dstArray: std::ptr::null_mut(),
                dstPitch: self.head_bytes() as usize,
                WidthInBytes: n * row,
                Height: self.n_layer * 2 * self.n_head_kv,
            };
            // SAFETY: both ranges were checked above to lie inside their
            // caches, whose memory stays mapped until they drop (which waits
            // for the stream).
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, dev.cu_stream()) }
                .result()
                .map_err(|e| driver_error("copying KV positions", e))?;
        }
        Ok(())
    }

    /// Copies position `pos` of layer `layer`, KV head `head`, to the host
    /// as f16 bits `(k, v)` (for tests).
    pub fn read_entry(
        &self,
        dev: &CudaDevice,
        layer: usize,
        head: usize,
        pos: usize,
    ) -> Result<(Vec<u16>, Vec<u16>), BackendError> {
        shape_check(self.kv_type != KvType::F16, || {
            format!("read_entry of a {} cache", self.kv_type)
        })?;
        let (kp, vp) = self.planes(layer);
        let off = ((head * self.capacity + pos) * self.head_dim * 2) as u64;
        let mut k = vec![0u16; self.head_dim];
        let mut v = vec![0u16; self.head_dim];
        dev.bind()?;
        // SAFETY: the ranges lie inside the cache block.
        unsafe {
            drv::memcpy_dtoh_async(&mut k, kp + off, dev.cu_stream())
                .map_err(|e| driver_error("copying K", e))?;
            drv::memcpy_dtoh_async(&mut v, vp + off, dev.cu_stream())
                .map_err(|e| driver_error("copying V", e))?;
        }
        dev.synchronize()?;
        Ok((k, v))
    }
}

pub(super) fn shape_error(what: String) -> BackendError {
    BackendError::Shape(what)
}

/// Refuses an operation whose operands' shapes do not fit (`mismatch`)
/// with [`shape_error`]; `what` (the operation and its shapes) is only
/// formatted then.
pub(super) fn shape_check(
    mismatch: bool,
    what: impl FnOnce() -> String,
) -> Result<(), BackendError> {
    if mismatch {
        Err(shape_error(what()))
    } else {
        Ok(())
    }
}

/// M0-W-1431: every matrix an operation touches must be backed by enough
/// device memory for its stated shape (the shape fields are public, so a
/// caller can make them disagree with the block). A buffer carved from a
/// graph arena was sized from its shape when it was carved.
pub(super) fn check_bufs(what: &str, bufs: &[&CudaBuf]) -> Result<(), BackendError> {
    for b in bufs {
        let need = (b.rows * b.cols * 4) as u64;
        if let BufMem::Owned(m) = &b.mem {
            shape_check(m.bytes() < need, || {
                format!(
                    "{what}: a {}x{} matrix in a block of {} bytes",
                    b.rows,
                    b.cols,
                    m.bytes()
                )
            })?;
        }
    }
    Ok(())
}

/// As [`check_bufs`] for weights: rows of whole blocks of the stored type,
/// all inside the device block.
pub(super) fn check_weights(what: &str, ws: &[&CudaWeight]) -> Result<(), BackendError> {
    for w in ws {
        let need = w.rows as u64 * w.row_bytes as u64;
        shape_check(
            w.ty.bytes_for(w.cols as u64) != Some(w.row_bytes as u64) || w.mem.bytes() < need,
            || {
                format!(
                    "{what}: a {}x{} {} weight with rows of {} bytes in a block of {} bytes",
                    w.rows,
                    w.cols,
                    w.ty,
                    w.row_bytes,
                    w.mem.bytes()
                )
            },
        )?;
    }
    Ok(())
}

/// A vector weight (norm weight, bias) of `len` f32 values.
pub(super) fn is_f32_vector(w: &CudaWeight, len: usize) -> bool {
    w.ty == GgmlType::F32 && w.rows == 1 && w.cols == len
}
