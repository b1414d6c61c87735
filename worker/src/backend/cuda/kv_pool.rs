//! The paged KV cache behind `--parallel N` (issue 18): one pool of
//! fixed-size blocks of device memory, taken at start-up from the VRAM
//! budget, that the slots' sequences share whatever their lengths.
//!
//! The blocks are physical allocations of the driver's virtual memory
//! management (`cuMemCreate`), each one page of the allocation granularity
//! (2 MiB on current GPUs) or, in a pool of more than [`MAX_BLOCKS`] pages,
//! a few pages (the driver maps an allocation whole, so a block is one). A
//! sequence's cache gets the blocks it needs, wherever they lie in the pool,
//! mapped one after another into an address range of its own
//! (`cuMemAddressReserve` + `cuMemMap`): the kernels see the contiguous cache
//! they always saw (`attention.cuh`'s layout), so no kernel changes, while
//! the memory is paged (as vAttention does, rather than PagedAttention's
//! block tables). No device memory is allocated or freed while jobs run: the
//! pool's size is fixed at start-up, a job that cannot get its blocks waits
//! in the queue (`Backend::has_room`), and its blocks come back when its
//! sequence ends, however the job ended.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr};

use crate::backend::cuda::device::{driver_error, CudaDevice, Purpose};
use crate::backend::{BackendError, KvBlocks};

/// Blocks in a pool at most: a larger pool takes larger blocks, so that
/// start-up's driver calls (one a block) stay few.
const MAX_BLOCKS: u64 = 16_384;

/// Device memory left outside the pool by default: prompts' activations,
/// batched steps' arenas and graphs, cuBLAS's workspace.
const HEADROOM_MIN_BYTES: u64 = 1 << 30;
/// ... or this fraction of the free memory, whichever is larger.
const HEADROOM_FRACTION: u64 = 16;

/// The pool's shared state: its blocks and which are free.
struct Inner {
    dev: Arc<CudaDevice>,
    /// Bytes of one block.
    block: u64,
    /// Block `i`'s physical allocation.
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    free: Mutex<BTreeSet<u32>>,
    /// Blocks the pool is made of (and counted as KV cache in the device's
    /// accounting: `total * block` bytes).
    total: u32,
}

/// The pool of KV blocks. Cheap to clone (shared).
#[derive(Clone)]
pub struct KvPool {
    inner: Arc<Inner>,
}

/// A sequence's blocks, mapped one after another at `ptr` for `bytes`;
/// unmapped and returned to the pool on drop.
pub struct BlockLease {
    ptr: CUdeviceptr,
    bytes: u64,
    /// Blocks mapped so far (the first `mapped` of `blocks`).
    mapped: usize,
    blocks: Vec<u32>,
    inner: Arc<Inner>,
}

impl KvPool {
    /// The driver's page size for device memory on `dev`.
    fn granularity(dev: &CudaDevice) -> Result<u64, BackendError> {
        let prop = allocation_prop(dev);
        let mut g: usize = 0;
        // SAFETY: writes one usize; `prop` is a valid description.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
            .result()
        }
        .map_err(|e| driver_error("reading the memory page size", e))?;
        Ok((g as u64).max(1))
    }

    /// Bytes of one block in a pool of about `bytes`.
    pub fn block_bytes(dev: &CudaDevice, bytes: u64) -> Result<u64, BackendError> {
        let g = Self::granularity(dev)?;
        Ok(g * bytes.div_ceil(g * MAX_BLOCKS).max(1))
    }

    /// Bytes the device can give a pool: what it has free beside the headroom.
    pub fn room(dev: &CudaDevice) -> Result<u64, BackendError> {
        let free = dev.available_bytes()?;
        let headroom = HEADROOM_MIN_BYTES.max(free / HEADROOM_FRACTION);
        Ok(free.saturating_sub(headroom))
    }

    /// Creates a pool of `bytes` (whole blocks of `block` bytes, a multiple of
    /// the page size; at least one) on `dev`.
    pub fn new(dev: &Arc<CudaDevice>, bytes: u64, block: u64) -> Result<KvPool, BackendError> {
        let g = Self::granularity(dev)?;
        if block == 0 || !block.is_multiple_of(g) {
            return Err(BackendError::InferenceFailed(format!(
                "a KV block of {block} bytes is not whole pages of {g}"
            )));
        }
        let n = bytes.div_ceil(block).max(1);
        let total = u32::try_from(n).map_err(|_| {
            BackendError::InferenceFailed(format!("a KV pool of {n} blocks is too many"))
        })?;
        dev.bind()?;
        dev.acct.reserve(Purpose::KvCache, n * block)?;
        let mut inner = Inner {
            dev: dev.clone(),
            block,
            handles: Vec::with_capacity(total as usize),
            free: Mutex::new((0..total).collect()),
            total,
        };
        let prop = allocation_prop(dev);
        while inner.handles.len() < total as usize {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: creates one physical allocation; released in Inner's drop.
            let r = unsafe { sys::cuMemCreate(&mut handle, block as usize, &prop, 0) }.result();
            if let Err(e) = r {
                // Inner's drop releases the blocks made so far and the count.
                let made = inner.handles.len() as u64;
                return Err(if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    BackendError::OutOfMemory {
                        needed: n * block,
                        available: made * block,
                    }
                } else {
                    driver_error("creating the KV pool", e)
                });
            }
            inner.handles.push(handle);
        }
        Ok(KvPool {
            inner: Arc::new(inner),
        })
    }

    /// Blocks a cache of `bytes` takes.
    pub fn blocks_for(&self, bytes: u64) -> usize {
        bytes.div_ceil(self.inner.block).max(1) as usize
    }

    /// Blocks in the pool and blocks held by sequences.
    pub fn blocks(&self) -> KvBlocks {
        let free = self.inner.free.lock().expect("pool lock").len();
        KvBlocks {
            block_bytes: self.inner.block,
            total: self.inner.total as usize,
            used: self.inner.total as usize - free,
        }
    }

    /// Whether `bytes` of cache could be leased now.
    pub fn has_room(&self, bytes: u64) -> bool {
        self.blocks_for(bytes) <= self.inner.free.lock().expect("pool lock").len()
    }

    /// Leases blocks for `bytes` of cache and maps them contiguously; the
    /// memory is not cleared.
    pub fn lease(&self, bytes: u64) -> Result<BlockLease, BackendError> {
        let n = self.blocks_for(bytes);
        let blocks: Vec<u32> = {
            let mut free = self.inner.free.lock().expect("pool lock");
            if n > free.len() {
                return Err(BackendError::OutOfMemory {
                    needed: n as u64 * self.inner.block,
                    available: free.len() as u64 * self.inner.block,
                });
            }
            // The lowest free blocks.
            (0..n)
                .map(|_| free.pop_first().expect("counted above"))
                .collect()
        };
        let mut lease = BlockLease {
            ptr: 0,
            bytes: n as u64 * self.inner.block,
            mapped: 0,
            blocks,
            inner: self.inner.clone(),
        };
        lease.map()?;
        Ok(lease)
    }
}

impl BlockLease {
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Bytes mapped (whole blocks).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reserves the address range and maps the blocks into it, one after
    /// another, each readable and writable by the device. On error, drop
    /// undoes what was done.
    fn map(&mut self) -> Result<(), BackendError> {
        let inner = self.inner.clone();
        let block = inner.block;
        inner.dev.bind()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: reserves address space only; freed in drop. Alignment 0 is
        // the page size, which a block is a multiple of (a block of three
        // pages is no power of two, which an alignment may have to be).
        unsafe { sys::cuMemAddressReserve(&mut ptr, self.bytes as usize, 0, 0, 0) }
            .result()
            .map_err(|e| driver_error("reserving a KV cache's addresses", e))?;
        self.ptr = ptr;
        let access = sys::CUmemAccessDesc {
            location: location(&inner.dev),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        for (i, &b) in self.blocks.iter().enumerate() {
            let at = ptr + i as u64 * block;
            // SAFETY: maps one whole block into addresses reserved above.
            unsafe { sys::cuMemMap(at, block as usize, 0, inner.handles[b as usize], 0) }
                .result()
                .map_err(|e| driver_error("mapping a KV cache's blocks", e))?;
            self.mapped = i + 1;
            // SAFETY: the block is mapped just above.
            unsafe { sys::cuMemSetAccess(at, block as usize, &access, 1) }
                .result()
                .map_err(|e| driver_error("enabling access to a KV cache", e))?;
        }
        Ok(())
    }
}

impl Drop for BlockLease {
    fn drop(&mut self) {
        let inner = &self.inner;
        // Work queued on the cache must finish before its blocks go to another
        // sequence (cuMemFree would wait the same way).
        let r = inner.dev.bind().and_then(|()| inner.dev.synchronize());
        if let Err(e) = r {
            tracing::error!(error = %e, "waiting for a KV cache's last use failed");
        }
        for i in 0..self.mapped {
            let at = self.ptr + i as u64 * inner.block;
            // SAFETY: block `i` was mapped whole by `map`, and is unmapped once.
            if let Err(e) = unsafe { sys::cuMemUnmap(at, inner.block as usize) }.result() {
                tracing::error!(error = ?e, "unmapping a KV cache failed");
            }
        }
        if self.ptr != 0 {
            // SAFETY: the range was reserved by `map`; nothing is mapped in it now.
            if let Err(e) = unsafe { sys::cuMemAddressFree(self.ptr, self.bytes as usize) }.result()
            {
                tracing::error!(error = ?e, "freeing a KV cache's addresses failed");
            }
        }
        let mut free = inner.free.lock().expect("pool lock");
        free.extend(self.blocks.drain(..));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Leases hold the Arc, so none is mapped any more.
        for &handle in &self.handles {
            // SAFETY: each handle was created by cuMemCreate and released once.
            if let Err(e) = unsafe { sys::cuMemRelease(handle) }.result() {
                tracing::error!(error = ?e, "releasing the KV pool failed");
            }
        }
        self.dev
            .acct
            .release(Purpose::KvCache, self.total as u64 * self.block);
    }
}

fn location(dev: &CudaDevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev.cu_device(),
    }
}

/// Pinned device memory on `dev`, no exportable handle.
fn allocation_prop(dev: &CudaDevice) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all zeros is valid (no handle types,
    // no flags); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = location(dev);
    prop
}
