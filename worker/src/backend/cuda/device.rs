//! The GPU: context, stream, device facts, and every byte of device memory.
//!
//! Set-up follows M0-W-1400/1010: the ordinal is checked against the device
//! count, the device's primary context is bound (through cudarc's driver API,
//! loaded at run time), the device malloc heap is set as low as the driver
//! allows, L1 is preferred over shared memory, and a probe allocation is
//! confirmed to be plain device memory. One non-blocking stream carries all
//! work, so everything is ordered without events.
//!
//! Memory is only ever taken with `cuMemAlloc` (weights, KV cache) or
//! `cuMemAllocFromPoolAsync` on the device's default pool (activations), each
//! block starting on a 256-byte boundary. [`DevBuf`] owns one block and frees
//! it on drop; [`Accounting`] counts the bytes held by purpose (M0-W-1011)
//! and applies the test-only cap `WORKER_ORCD_VRAM_CAP_BYTES`.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::result::{self as drv, DriverError};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::cuda::kernels::Kernels;
use crate::backend::cuda::source::KernelSet;
use crate::backend::{BackendError, BackendKind, DeviceInfo, MemoryUse};

/// Test-only cap on the device memory this process may take, in bytes
/// (M0-W-1020/1021/1825): allocations beyond it fail as if the GPU were full.
pub const VRAM_CAP_ENV: &str = "WORKER_ORCD_VRAM_CAP_BYTES";

/// Every device block starts on this boundary (M0-W-1220).
pub const DEVICE_ALIGN: u64 = 256;

/// Rounds `bytes` up to the allocation granule.
pub fn align_up(bytes: u64) -> u64 {
    bytes.div_ceil(DEVICE_ALIGN).max(1) * DEVICE_ALIGN
}

/// M0-W-1220: every device block, and so every tensor, starts on a 256-byte
/// boundary; an address that does not is an error, never used. (The driver
/// aligns `cuMemAlloc` blocks far more coarsely, so this fails only if that
/// promise or our own offset arithmetic breaks.)
pub fn check_aligned(what: &str, ptr: CUdeviceptr) -> Result<(), BackendError> {
    if ptr.is_multiple_of(DEVICE_ALIGN) {
        Ok(())
    } else {
        Err(BackendError::Unknown(format!(
            "{what} is at {ptr:#x}, not on a {DEVICE_ALIGN}-byte boundary"
        )))
    }
}

/// What a block of device memory is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Weights,
    KvCache,
    Scratch,
}

/// Bytes held on the device by purpose, and the optional test cap.
#[derive(Debug, Default)]
pub struct Accounting {
    weights: AtomicU64,
    kv_cache: AtomicU64,
    scratch: AtomicU64,
    cap: Option<u64>,
}

impl Accounting {
    fn counter(&self, p: Purpose) -> &AtomicU64 {
        match p {
            Purpose::Weights => &self.weights,
            Purpose::KvCache => &self.kv_cache,
            Purpose::Scratch => &self.scratch,
        }
    }

    pub fn snapshot(&self) -> MemoryUse {
        MemoryUse {
            weights: self.weights.load(Ordering::Relaxed),
            kv_cache: self.kv_cache.load(Ordering::Relaxed),
            scratch: self.scratch.load(Ordering::Relaxed),
        }
    }

    /// Bytes the cap still allows, or `None` without a cap.
    pub fn cap_left(&self) -> Option<u64> {
        self.cap.map(|c| c.saturating_sub(self.snapshot().total()))
    }

    pub(crate) fn reserve(&self, p: Purpose, bytes: u64) -> Result<(), BackendError> {
        if let Some(left) = self.cap_left() {
            if bytes > left {
                return Err(BackendError::OutOfMemory {
                    needed: bytes,
                    available: left,
                });
            }
        }
        self.counter(p).fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn release(&self, p: Purpose, bytes: u64) {
        self.counter(p).fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A driver error as the backend's error kind.
pub(crate) use super::fault::driver_error;

fn is_oom(e: &DriverError) -> bool {
    e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Settings read back from the context (M0-W-1010).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextLimits {
    /// `CU_LIMIT_MALLOC_HEAP_SIZE` in bytes.
    pub malloc_heap_bytes: usize,
    /// `cuCtxGetCacheConfig` prefers L1.
    pub prefers_l1: bool,
}

/// One GPU with its context, stream, compiled kernels and memory accounting.
pub struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// The default memory pool, or `None` when the device has none (then
    /// activations come from `cuMemAlloc` as well).
    pool: Option<sys::CUmemoryPool>,
    pub(crate) kernels: Kernels,
    pub(crate) acct: Accounting,
    info: DeviceInfo,
    arch: (i32, i32),
    limits: ContextLimits,
}

// SAFETY: the pool handle is a plain driver handle, valid for the context's
// lifetime and usable from any thread once the context is bound.
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

/// Compute capability `(major, minor)` of GPU `ordinal`, read before its
/// context exists.
fn device_arch(ordinal: usize) -> Result<(i32, i32), BackendError> {
    let dev =
        drv::device::get(ordinal as i32).map_err(|e| driver_error("getting the device", e))?;
    let attr = |a| {
        // SAFETY: `dev` came from cuDeviceGet just above.
        unsafe { drv::device::get_attribute(dev, a) }
            .map_err(|e| driver_error("reading the compute capability", e))
    };
    Ok((
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

impl CudaDevice {
    /// Sets up GPU `ordinal` (M0-W-1400) and compiles or loads every kernel,
    /// of every weight format. The memory cap comes from
    /// `WORKER_ORCD_VRAM_CAP_BYTES`, if set.
    pub fn new(ordinal: usize) -> Result<Arc<CudaDevice>, BackendError> {
        Self::with_cap(ordinal, None, None)
    }

    /// As [`CudaDevice::new`], with the memory cap given (`None`: from the
    /// environment) and only the kernels of a model of `set` (`None`: every
    /// format and head size).
    pub fn with_cap(
        ordinal: usize,
        cap: Option<u64>,
        set: Option<KernelSet<'_>>,
    ) -> Result<Arc<CudaDevice>, BackendError> {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::DeviceNotFound(
                "the NVIDIA driver library (libcuda) could not be loaded; use --backend cpu".into(),
            ));
        }
        drv::init().map_err(|e| {
            BackendError::DeviceNotFound(format!("cuInit failed: {e:?}; use --backend cpu"))
        })?;
        let count = drv::device::get_count()
            .map_err(|e| BackendError::DeviceNotFound(format!("cannot count GPUs: {e:?}")))?
            as usize;
        if count == 0 {
            return Err(BackendError::DeviceNotFound(
                "no CUDA GPU found; use --backend cpu".into(),
            ));
        }
        if ordinal >= count {
            return Err(BackendError::InvalidDevice(format!(
                "GPU {ordinal} does not exist: {count} device(s), numbered 0 to {}",
                count - 1
            )));
        }
        // The kernels compile (NVRTC needs no context) while the context is
        // made: on a first start the two took 1.3-1.6 s and 0.3 s one after
        // the other.
        let arch = device_arch(ordinal)?;
        if arch.0 < 7 {
            return Err(BackendError::DeviceNotFound(format!(
                "GPU {ordinal} has compute capability {}.{}; 7.0 or newer is needed",
                arch.0, arch.1
            )));
        }
        let compiling = Kernels::compile_in_background(arch, set);
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| driver_error("binding the primary context", e))?;
        // One stream orders everything; cudarc's per-buffer events are not used.
        // SAFETY: no CudaSlice is ever made with this context.
        unsafe { ctx.disable_event_tracking() };

        // M0-W-1010: the device heap (for in-kernel malloc, which no kernel
        // uses) as small as the driver allows, and L1 preferred.
        let _ = ctx.set_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, 0);
        ctx.set_cache_config(sys::CUfunc_cache::CU_FUNC_CACHE_PREFER_L1)
            .map_err(|e| driver_error("setting the cache configuration", e))?;
        let limits = ContextLimits {
            malloc_heap_bytes: ctx
                .get_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE)
                .map_err(|e| driver_error("reading the heap limit", e))?,
            prefers_l1: ctx
                .get_cache_config()
                .map_err(|e| driver_error("reading the cache configuration", e))?
                == sys::CUfunc_cache::CU_FUNC_CACHE_PREFER_L1,
        };

        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        let name = ctx
            .name()
            .map_err(|e| driver_error("reading the device name", e))?;
        let total = ctx
            .total_mem()
            .map_err(|e| driver_error("reading the memory size", e))?;
        let mut version = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| driver_error("reading the driver version", e))?;

        let pool = if ctx.has_async_alloc() {
            // SAFETY: the device handle comes from the bound context; the
            // attribute is a u64. Freed activation memory stays in the pool
            // between steps and is trimmed when a sequence ends.
            unsafe {
                let pool = drv::device::get_default_mem_pool(ctx.cu_device())
                    .map_err(|e| driver_error("getting the memory pool", e))?;
                let mut keep = u64::MAX;
                drv::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut keep as *mut u64 as *mut c_void,
                )
                .map_err(|e| driver_error("configuring the memory pool", e))?;
                Some(pool)
            }
        } else {
            None
        };

        let cap = match (cap, std::env::var(VRAM_CAP_ENV)) {
            (Some(c), _) => Some(c),
            (None, Err(_)) => None,
            (None, Ok(v)) => Some(v.trim().parse::<u64>().map_err(|_| {
                BackendError::InvalidDevice(format!(
                    "{VRAM_CAP_ENV}={v:?} is not a number of bytes"
                ))
            })?),
        };

        let kernels = Kernels::load(&ctx, arch, set, compiling)?;
        let info = DeviceInfo {
            backend: BackendKind::Cuda,
            name,
            gpu_device: Some(ordinal),
            sm: Some(format!("{}.{}", arch.0, arch.1)),
            cuda_runtime_version: Some(format!("{}.{}", version / 1000, (version % 1000) / 10)),
            total_memory_bytes: Some(total as u64),
        };
        let dev = Arc::new(CudaDevice {
            ctx,
            stream,
            pool,
            kernels,
            acct: Accounting {
                cap,
                ..Default::default()
            },
            info,
            arch,
            limits,
        });
        dev.probe()?;
        Ok(dev)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The driver's device handle (the id in memory locations).
    pub(crate) fn cu_device(&self) -> sys::CUdevice {
        self.ctx.cu_device()
    }

    /// Compute capability `(major, minor)`.
    pub fn arch(&self) -> (i32, i32) {
        self.arch
    }

    pub fn limits(&self) -> ContextLimits {
        self.limits
    }

    pub fn memory_use(&self) -> MemoryUse {
        self.acct.snapshot()
    }

    /// Changes the weight-row count from which decode matmuls use a warp per
    /// row instead of a block per row (for tests and benchmarks).
    pub fn set_mv_warp_min_rows(&self, rows: usize) {
        self.kernels.set_mv_warp_min_rows(rows);
    }

    pub(crate) fn bind(&self) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the context", e))
    }

    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Free device memory as the driver reports it, limited by the test cap.
    pub fn available_bytes(&self) -> Result<u64, BackendError> {
        self.bind()?;
        let (free, _) = drv::mem_get_info().map_err(|e| driver_error("reading free memory", e))?;
        Ok(match self.acct.cap_left() {
            Some(left) => left.min(free as u64),
            None => free as u64,
        })
    }

    /// Waits for all queued work; asynchronous kernel faults surface here.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("synchronizing the stream", e))
    }

    /// Allocates `bytes` (rounded up to 256) with `cuMemAlloc`.
    pub(crate) fn alloc(
        self: &Arc<Self>,
        purpose: Purpose,
        bytes: u64,
    ) -> Result<DevBuf, BackendError> {
        self.alloc_impl(purpose, bytes, false)
    }

    /// Allocates `bytes` (rounded up to 256) from the stream-ordered pool
    /// (falls back to `cuMemAlloc` without one). The block is freed in stream
    /// order on drop.
    pub(crate) fn alloc_async(
        self: &Arc<Self>,
        purpose: Purpose,
        bytes: u64,
    ) -> Result<DevBuf, BackendError> {
        self.alloc_impl(purpose, bytes, self.pool.is_some())
    }

    fn alloc_impl(
        self: &Arc<Self>,
        purpose: Purpose,
        bytes: u64,
        pooled: bool,
    ) -> Result<DevBuf, BackendError> {
        let size = align_up(bytes);
        self.acct.reserve(purpose, size)?;
        let got = self.bind().and_then(|()| {
            // SAFETY: plain allocations on the bound context; the memory is
            // owned by the returned DevBuf.
            let r = unsafe {
                match (pooled, self.pool) {
                    (true, Some(pool)) => {
                        drv::mem_pool::alloc_async(pool, size as usize, self.cu_stream())
                    }
                    _ => drv::malloc_sync(size as usize),
                }
            };
            r.map_err(|e| {
                if is_oom(&e) {
                    let free = drv::mem_get_info().map(|(f, _)| f as u64).unwrap_or(0);
                    BackendError::OutOfMemory {
                        needed: size,
                        available: free,
                    }
                } else {
                    driver_error("allocating device memory", e)
                }
            })
        });
        let ptr = match got {
            Ok(p) => p,
            Err(e) => {
                self.acct.release(purpose, size);
                return Err(e);
            }
        };
        // Owned from here on, so a misaligned block is freed as the error returns.
        let buf = DevBuf {
            ptr,
            bytes: size,
            purpose,
            pooled: pooled && self.pool.is_some(),
            dev: self.clone(),
        };
        check_aligned("a block from the driver", ptr)?;
        Ok(buf)
    }

    /// Gives pooled memory that no buffer holds back to the driver.
    pub(crate) fn trim_pool(&self) -> Result<(), BackendError> {
        if let Some(pool) = self.pool {
            self.bind()?;
            self.synchronize()?;
            // SAFETY: the pool belongs to this device.
            unsafe { drv::mem_pool::trim_to(pool, 0) }
                .map_err(|e| driver_error("trimming the memory pool", e))?;
        }
        Ok(())
    }

    /// Allocates and frees a probe block, checking that the driver calls it
    /// plain device memory (M0-W-1010).
    fn probe(self: &Arc<Self>) -> Result<(), BackendError> {
        let buf = self.alloc(Purpose::Scratch, DEVICE_ALIGN)?;
        if memory_type(buf.ptr())? != MemoryKind::Device {
            return Err(BackendError::VramResidencyFailed(
                "a probe allocation is not device memory".into(),
            ));
        }
        Ok(())
    }
}

/// Where the driver says a pointer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Plain device memory, not managed.
    Device,
    /// Host memory (pinned or mapped into the device's address space).
    Host,
    /// Managed (unified) memory.
    Managed,
    Other(u32),
}

/// Asks the driver (`cuPointerGetAttribute`) where `ptr` lives.
pub fn memory_type(ptr: CUdeviceptr) -> Result<MemoryKind, BackendError> {
    let mut ty: u32 = 0;
    let mut managed: u32 = 0;
    // SAFETY: each attribute writes one 32-bit value.
    unsafe {
        sys::cuPointerGetAttribute(
            &mut ty as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
        .result()
        .map_err(|e| BackendError::VramResidencyFailed(format!("querying {ptr:#x}: {e:?}")))?;
        sys::cuPointerGetAttribute(
            &mut managed as *mut u32 as *mut c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr,
        )
        .result()
        .map_err(|e| BackendError::VramResidencyFailed(format!("querying {ptr:#x}: {e:?}")))?;
    }
    Ok(if managed != 0 {
        MemoryKind::Managed
    } else if ty == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        MemoryKind::Device
    } else if ty == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        MemoryKind::Host
    } else {
        MemoryKind::Other(ty)
    })
}

/// One block of device memory, freed on drop.
pub struct DevBuf {
    ptr: CUdeviceptr,
    bytes: u64,
    purpose: Purpose,
    pooled: bool,
    dev: Arc<CudaDevice>,
}

impl DevBuf {
    /// The device address (a multiple of 256).
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Size in bytes, as allocated (a multiple of 256).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Fills the first `bytes` bytes with zeros, in stream order.
    pub(crate) fn zero(&self, bytes: u64) -> Result<(), BackendError> {
        debug_assert!(bytes <= self.bytes);
        // SAFETY: the range lies inside this block.
        unsafe { drv::memset_d8_async(self.ptr, 0, bytes as usize, self.dev.cu_stream()) }
            .map_err(|e| driver_error("zeroing device memory", e))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let r = self.dev.bind().and_then(|()| {
            // SAFETY: this block was allocated by `alloc_impl` and is freed once;
            // a pooled block is freed in stream order after the work using it.
            unsafe {
                if self.pooled {
                    drv::free_async(self.ptr, self.dev.cu_stream())
                } else {
                    drv::free_sync(self.ptr)
                }
            }
            .map_err(|e| driver_error("freeing device memory", e))
        });
        if let Err(e) = r {
            tracing::error!(error = %e, "freeing device memory failed");
        }
        self.dev.acct.release(self.purpose, self.bytes);
    }
}
