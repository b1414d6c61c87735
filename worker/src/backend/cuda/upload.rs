//! Chunked host-to-device upload (M0-W-1222).
//!
//! Bytes go from the GGUF memory map into one of two pinned staging buffers
//! and from there to the device with `cuMemcpyHtoDAsync`; while the GPU copies
//! one buffer the host fills the other. An event per buffer says when it may
//! be refilled. No copy is larger than the chunk size (1 MiB by default), and
//! progress is reported per chunk copied. A copy the driver refuses ends the
//! upload with `ModelLoadFailed` (`MODEL_LOAD_FAILED`); test builds can make
//! one fail on purpose (`fail_copy_for_test`).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys::{self, CUdeviceptr, CUevent};

use crate::backend::cuda::device::{driver_error, CudaDevice};
use crate::backend::BackendError;

#[cfg(test)]
thread_local! {
    /// Test hook: the index (from 0) of the copy, within each load's upload
    /// made on this thread, that fails as if the driver had refused it.
    static FAIL_COPY: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Test hook (M0-W-1222): makes copy `n` (counting from 0) of every load's
/// upload on the calling thread fail through the same path as a driver
/// error, until called with `None`. Only in test builds; loads on other
/// threads (other tests) are not affected.
#[cfg(test)]
pub(crate) fn fail_copy_for_test(n: Option<u64>) {
    FAIL_COPY.with(|c| c.set(n));
}

/// What an upload did, for tests of M0-W-1222.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadStats {
    /// Host-to-device copies issued.
    pub copies: u64,
    /// The largest single copy, in bytes.
    pub max_copy_bytes: u64,
    /// Bytes copied in all.
    pub total_bytes: u64,
}

struct Staging {
    host: *mut u8,
    event: CUevent,
    /// A copy out of this buffer has been queued since it was last waited on.
    in_flight: bool,
}

/// Double-buffered pinned staging for one load.
pub struct Uploader {
    dev: Arc<CudaDevice>,
    chunk: usize,
    bufs: Vec<Staging>,
    next: usize,
    stats: UploadStats,
}

impl Uploader {
    /// Allocates two pinned buffers of `chunk` bytes.
    pub fn new(dev: Arc<CudaDevice>, chunk: usize) -> Result<Self, BackendError> {
        if chunk == 0 {
            return Err(BackendError::ModelLoadFailed(
                "the upload chunk size must be positive".into(),
            ));
        }
        dev.bind()?;
        let mut up = Uploader {
            dev,
            chunk,
            bufs: Vec::with_capacity(2),
            next: 0,
            stats: UploadStats::default(),
        };
        for _ in 0..2 {
            // SAFETY: plain pinned allocation and event creation on the bound
            // context; both are released in Drop.
            let host = unsafe { drv::malloc_host(chunk, 0) }
                .map_err(|e| driver_error("allocating pinned staging memory", e))?
                as *mut u8;
            let event = match drv::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
                Ok(ev) => ev,
                Err(e) => {
                    // SAFETY: allocated just above, not yet recorded anywhere.
                    unsafe { drv::free_host(host as *mut c_void) }.ok();
                    return Err(driver_error("creating an event", e));
                }
            };
            up.bufs.push(Staging {
                host,
                event,
                in_flight: false,
            });
        }
        Ok(up)
    }

    /// Copies `src` to device address `dst` in chunks, calling `on_bytes`
    /// with each chunk's size once it is queued.
    pub fn upload(
        &mut self,
        src: &[u8],
        dst: CUdeviceptr,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<(), BackendError> {
        self.dev.bind()?;
        let stream = self.dev.cu_stream();
        for (i, piece) in src.chunks(self.chunk).enumerate() {
            let b = &mut self.bufs[self.next];
            if b.in_flight {
                // SAFETY: the event was recorded after the last copy out of `b`.
                unsafe { drv::event::synchronize(b.event) }
                    .map_err(|e| upload_error("waiting for a copy", e))?;
                b.in_flight = false;
            }
            // SAFETY: `b.host` holds `self.chunk >= piece.len()` bytes and no
            // queued copy reads it (waited on above).
            let staged = unsafe {
                std::ptr::copy_nonoverlapping(piece.as_ptr(), b.host, piece.len());
                std::slice::from_raw_parts(b.host as *const u8, piece.len())
            };
            let at = dst + (i * self.chunk) as u64;
            #[cfg(test)]
            if FAIL_COPY.with(|c| c.get()) == Some(self.stats.copies) {
                return Err(upload_error(
                    "copying a chunk",
                    drv::DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE),
                ));
            }
            // SAFETY: the destination range lies in the block the caller
            // allocated for `src`; the pinned source outlives the copy (it is
            // waited on before reuse and before it is freed).
            unsafe {
                drv::memcpy_htod_async(at, staged, stream)
                    .map_err(|e| upload_error("copying a chunk", e))?;
                drv::event::record(b.event, stream)
                    .map_err(|e| upload_error("recording an event", e))?;
            }
            b.in_flight = true;
            self.next = (self.next + 1) % self.bufs.len();
            self.stats.copies += 1;
            self.stats.max_copy_bytes = self.stats.max_copy_bytes.max(piece.len() as u64);
            self.stats.total_bytes += piece.len() as u64;
            on_bytes(piece.len() as u64);
        }
        Ok(())
    }

    /// Waits for every copy and releases the staging buffers.
    pub fn finish(self) -> Result<UploadStats, BackendError> {
        self.dev.synchronize()?;
        Ok(self.stats)
    }
}

fn upload_error(what: &str, e: drv::DriverError) -> BackendError {
    BackendError::ModelLoadFailed(format!("uploading weights: {what}: {e:?}"))
}

impl Drop for Uploader {
    fn drop(&mut self) {
        if self.dev.bind().is_err() {
            return;
        }
        for b in self.bufs.drain(..) {
            // SAFETY: wait for any copy still reading the buffer, then free
            // the buffer and event created in `new`.
            unsafe {
                if b.in_flight {
                    drv::event::synchronize(b.event).ok();
                }
                drv::event::destroy(b.event).ok();
                drv::free_host(b.host as *mut c_void).ok();
            }
        }
    }
}
