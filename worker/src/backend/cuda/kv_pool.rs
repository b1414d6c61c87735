//! The paged KV cache behind `--parallel N` (issue 18): one pool of
//! fixed-size blocks of device memory, taken at start-up from the VRAM
//! budget, that the slots' sequences share whatever their lengths.
//!
//! The blocks are physical pages of the driver's virtual memory management
//! (`cuMemCreate`, one page = the allocation granularity, 2 MiB on current
//! GPUs). A sequence's cache gets the pages it needs, wherever they lie in the
//! pool, mapped one after another into an address range of its own
//! (`cuMemAddressReserve` + `cuMemMap`): the kernels see the contiguous cache
//! they always saw (`attention.cuh`'s layout), so no kernel changes, while the
//! memory is paged (as vAttention does, rather than PagedAttention's block
//! tables). No device memory is allocated or freed while jobs run: the pool's
//! size is fixed at start-up, a job that cannot get its pages waits in the
//! queue (`Backend::has_room`), and its pages come back when its sequence
//! ends, however the job ended.
//!
//! Pages are handed out lowest first, so a sequence's pages are mostly
//! consecutive within one physical allocation and map in a few calls.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr};

use crate::backend::cuda::device::{driver_error, CudaDevice, Purpose};
use crate::backend::{BackendError, KvBlocks};

/// Physical memory is created in allocations of at most this many bytes (a
/// multiple of the page size), so start-up makes a few driver calls rather
/// than one per page.
const CHUNK_BYTES: u64 = 1 << 30;

/// Device memory left outside the pool by default: prompts' activations,
/// batched steps' arenas and graphs, cuBLAS's workspace.
const HEADROOM_MIN_BYTES: u64 = 1 << 30;
/// ... or this fraction of the free memory, whichever is larger.
const HEADROOM_FRACTION: u64 = 16;

/// One physical allocation.
struct Chunk {
    handle: sys::CUmemGenericAllocationHandle,
}

/// The pool's shared state: its chunks and which pages are free.
struct Inner {
    dev: Arc<CudaDevice>,
    page: u64,
    chunks: Vec<Chunk>,
    /// Global page numbers: chunk `c` holds pages `first[c] .. first[c] + pages`.
    first: Vec<u32>,
    free: Mutex<BTreeSet<u32>>,
    total: u32,
    /// Bytes counted as KV cache in the device's accounting.
    reserved: u64,
}

/// The pool of KV pages. Cheap to clone (shared).
#[derive(Clone)]
pub struct KvPool {
    inner: Arc<Inner>,
}

/// A sequence's pages, mapped at `ptr` for `bytes`; unmapped and returned to
/// the pool on drop.
pub struct PageLease {
    ptr: CUdeviceptr,
    bytes: u64,
    /// The mapped runs: (address, bytes), each within one chunk.
    runs: Vec<(CUdeviceptr, u64)>,
    pages: Vec<u32>,
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

    /// The pool's size: `want` bytes (rounded up to whole pages) or what the
    /// device has free beside the headroom, whichever is less.
    pub fn plan_bytes(dev: &CudaDevice, want: u64) -> Result<u64, BackendError> {
        let page = Self::granularity(dev)?;
        let free = dev.available_bytes()?;
        let headroom = HEADROOM_MIN_BYTES.max(free / HEADROOM_FRACTION);
        let room = free.saturating_sub(headroom);
        Ok(want.div_ceil(page).min(room / page) * page)
    }

    /// Creates a pool of `bytes` (whole pages; at least one) on `dev`.
    pub fn new(dev: &Arc<CudaDevice>, bytes: u64) -> Result<KvPool, BackendError> {
        let page = Self::granularity(dev)?;
        let pages = bytes.div_ceil(page).max(1);
        let total = u32::try_from(pages).map_err(|_| {
            BackendError::InferenceFailed(format!("a KV pool of {pages} pages is too many"))
        })?;
        dev.bind()?;
        dev.acct.reserve(Purpose::KvCache, pages * page)?;
        let mut inner = Inner {
            dev: dev.clone(),
            page,
            chunks: Vec::new(),
            first: Vec::new(),
            free: Mutex::new((0..total).collect()),
            total,
            reserved: pages * page,
        };
        let per_chunk = (CHUNK_BYTES / page).max(1) as u32;
        let mut made = 0u32;
        while made < total {
            let n = per_chunk.min(total - made);
            let prop = allocation_prop(dev);
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: creates one physical allocation; released in Inner's drop.
            let r = unsafe { sys::cuMemCreate(&mut handle, n as usize * page as usize, &prop, 0) }
                .result();
            if let Err(e) = r {
                // Inner's drop releases the chunks made so far and the count.
                return Err(if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    BackendError::OutOfMemory {
                        needed: pages * page,
                        available: made as u64 * page,
                    }
                } else {
                    driver_error("creating the KV pool", e)
                });
            }
            inner.chunks.push(Chunk { handle });
            inner.first.push(made);
            made += n;
        }
        Ok(KvPool {
            inner: Arc::new(inner),
        })
    }

    /// Bytes of one block (page).
    pub fn page_bytes(&self) -> u64 {
        self.inner.page
    }

    /// Pages a cache of `bytes` takes.
    pub fn pages_for(&self, bytes: u64) -> usize {
        bytes.div_ceil(self.inner.page).max(1) as usize
    }

    /// Blocks in the pool and blocks held by sequences.
    pub fn blocks(&self) -> KvBlocks {
        let free = self.inner.free.lock().expect("pool lock").len();
        KvBlocks {
            block_bytes: self.inner.page,
            total: self.inner.total as usize,
            used: self.inner.total as usize - free,
        }
    }

    /// Whether `bytes` of cache could be leased now.
    pub fn has_room(&self, bytes: u64) -> bool {
        self.pages_for(bytes) <= self.inner.free.lock().expect("pool lock").len()
    }

    /// Leases pages for `bytes` of cache and maps them contiguously; the
    /// memory is not cleared.
    pub fn lease(&self, bytes: u64) -> Result<PageLease, BackendError> {
        let n = self.pages_for(bytes);
        let pages: Vec<u32> = {
            let mut free = self.inner.free.lock().expect("pool lock");
            if n > free.len() {
                return Err(BackendError::OutOfMemory {
                    needed: n as u64 * self.inner.page,
                    available: free.len() as u64 * self.inner.page,
                });
            }
            let taken: Vec<u32> = free.iter().take(n).copied().collect();
            for p in &taken {
                free.remove(p);
            }
            taken
        };
        let mut lease = PageLease {
            ptr: 0,
            bytes: n as u64 * self.inner.page,
            runs: Vec::new(),
            pages,
            inner: self.inner.clone(),
        };
        lease.map()?;
        Ok(lease)
    }
}

impl PageLease {
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Bytes mapped (whole pages).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reserves the address range and maps the pages into it, consecutive
    /// pages of one chunk in one call. On error, drop undoes what was done.
    fn map(&mut self) -> Result<(), BackendError> {
        let inner = self.inner.clone();
        let page = inner.page;
        inner.dev.bind()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: reserves address space only; freed in drop.
        unsafe { sys::cuMemAddressReserve(&mut ptr, self.bytes as usize, page as usize, 0, 0) }
            .result()
            .map_err(|e| driver_error("reserving a KV cache's addresses", e))?;
        self.ptr = ptr;
        let mut i = 0;
        while i < self.pages.len() {
            let (chunk, offset) = inner.locate(self.pages[i]);
            let mut n = 1;
            while i + n < self.pages.len()
                && self.pages[i + n] == self.pages[i] + n as u32
                && inner.locate(self.pages[i + n]).0 == chunk
            {
                n += 1;
            }
            let at = ptr + i as u64 * page;
            let len = n as u64 * page;
            // SAFETY: maps a range of one chunk into addresses reserved above.
            unsafe {
                sys::cuMemMap(
                    at,
                    len as usize,
                    offset as usize,
                    inner.chunks[chunk].handle,
                    0,
                )
            }
            .result()
            .map_err(|e| driver_error("mapping a KV cache's pages", e))?;
            self.runs.push((at, len));
            i += n;
        }
        let access = sys::CUmemAccessDesc {
            location: location(&inner.dev),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        for &(at, len) in &self.runs {
            // SAFETY: the range is mapped above.
            unsafe { sys::cuMemSetAccess(at, len as usize, &access, 1) }
                .result()
                .map_err(|e| driver_error("enabling access to a KV cache", e))?;
        }
        Ok(())
    }
}

impl Drop for PageLease {
    fn drop(&mut self) {
        let inner = &self.inner;
        // Work queued on the cache must finish before its pages go to another
        // sequence (cuMemFree would wait the same way).
        let r = inner.dev.bind().and_then(|()| inner.dev.synchronize());
        if let Err(e) = r {
            tracing::error!(error = %e, "waiting for a KV cache's last use failed");
        }
        for &(at, len) in &self.runs {
            // SAFETY: each run was mapped by `map` and is unmapped once.
            if let Err(e) = unsafe { sys::cuMemUnmap(at, len as usize) }.result() {
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
        free.extend(self.pages.drain(..));
    }
}

impl Inner {
    /// Chunk index and byte offset in it of global page `p`.
    fn locate(&self, p: u32) -> (usize, u64) {
        let c = self.first.partition_point(|&f| f <= p) - 1;
        (c, (p - self.first[c]) as u64 * self.page)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Leases hold the Arc, so none is mapped any more.
        for c in &self.chunks {
            // SAFETY: each handle was created by cuMemCreate and released once.
            if let Err(e) = unsafe { sys::cuMemRelease(c.handle) }.result() {
                tracing::error!(error = ?e, "releasing the KV pool failed");
            }
        }
        self.dev.acct.release(Purpose::KvCache, self.reserved);
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
