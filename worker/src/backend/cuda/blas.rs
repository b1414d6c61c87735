//! Prefill matrix products on cuBLAS (M0-W-1430 lets cuBLAS do dense GEMM).
//!
//! For many rows of x, `CudaOps::matmul` decodes the weight matrix into
//! f16 a chunk of rows at a time (`dequant_f16_*`, into a scratch block of
//! at most [`BLAS_SCRATCH_MAX_BYTES`]: never a full-precision copy of all
//! the weights), splits x into two f16 parts (`to_f16`: x rounded, and the
//! rounding of the rest) and multiplies both on the tensor cores with
//! `cublasGemmEx`, f32 accumulation into one f32 result. The weights keep
//! 11 significant bits, x about 22; values beyond f16's range are clamped
//! to it. With x in one f16 part (half the tensor-core work) the real
//! SmolLM2's logits strayed 1.15e-2 from the CPU's at one decode position
//! after a 64-token prefill, past the 1e-2 the GPU is held to.
//!
//! cuBLAS is loaded at run time like the driver; without the library, or
//! when its handle cannot be made, products stay on `gemm_tc_*`.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::result::CublasError;
use cudarc::cublas::{sys, CudaBlas};
use half::f16;

use crate::backend::cuda::device::{CudaDevice, DevBuf, Purpose};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;

/// cuBLAS's workspace, given to it so that it never allocates by itself
/// (NVIDIA's advice for Hopper is 32 MiB).
pub const BLAS_WORKSPACE_BYTES: u64 = 32 << 20;

/// Most bytes of f16 weights decoded at a time (a matrix larger than this
/// is multiplied in chunks of rows).
pub const BLAS_SCRATCH_MAX_BYTES: usize = 64 << 20;

/// Row chunks are multiples of this many rows (whole tensor-core tiles,
/// and 256-byte aligned f32 output columns).
const CHUNK_ROW_ALIGN: usize = 128;

fn blas_error(what: &'static str) -> impl Fn(CublasError) -> BackendError {
    move |e| BackendError::driver(what, e)
}

/// `out[t][r] (+)= sum_c x[t][c] * w[r][c]` for `r < rows`, `t < n`.
#[derive(Clone, Copy, Debug)]
pub struct F16Product {
    /// `[rows, cols]` f16.
    pub w: DevPtr<f16>,
    pub rows: usize,
    pub cols: usize,
    /// `[n, cols]` f16.
    pub x: DevPtr<f16>,
    pub n: usize,
    /// The first `rows` columns of an `[n, ld_out]` f32 matrix.
    pub out: DevPtrMut<f32>,
    pub ld_out: usize,
    /// Add the product to `out` rather than overwrite it.
    pub accumulate: bool,
}

/// One cuBLAS handle on the device's stream, with its workspace.
pub(crate) struct Blas {
    /// Declared before the workspace, so the handle is destroyed first.
    handle: CudaBlas,
    _workspace: DevBuf,
}

impl Blas {
    /// A handle on `dev`'s stream, or `None` when libcublas cannot be loaded.
    pub fn new(dev: &Arc<CudaDevice>) -> Result<Option<Blas>, BackendError> {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            tracing::warn!("libcublas not found: prefill runs on the worker's own GEMM kernels");
            return Ok(None);
        }
        dev.bind()?;
        let handle =
            CudaBlas::new(dev.stream.clone()).map_err(blas_error("creating a cuBLAS handle"))?;
        // Held for the model's lifetime: counted with the weights, as the
        // sampler's buffers are (scratch is a step's activations).
        let workspace = dev.alloc(Purpose::Weights, BLAS_WORKSPACE_BYTES)?;
        // SAFETY: the workspace outlives the handle (field order) and is
        // used by nothing else.
        unsafe {
            sys::cublasSetWorkspace_v2(
                *handle.handle(),
                workspace.ptr() as *mut c_void,
                workspace.bytes() as usize,
            )
        }
        .result()
        .map_err(blas_error("giving cuBLAS its workspace"))?;
        Ok(Some(Blas {
            handle,
            _workspace: workspace,
        }))
    }

    /// The product `p` on this handle's stream.
    ///
    /// # Safety
    /// The three buffers of `p` hold its shapes, on this handle's device.
    pub unsafe fn gemm_f16(&self, p: &F16Product) -> Result<(), BackendError> {
        let int = |v: usize| {
            i32::try_from(v).map_err(|_| {
                BackendError::InferenceFailed(format!("{v} exceeds cuBLAS's int range"))
            })
        };
        let (m, nn, k, ldc) = (int(p.rows)?, int(p.n)?, int(p.cols)?, int(p.ld_out)?);
        let (w, x, out) = (p.w, p.x, p.out);
        let (alpha, beta) = (1.0f32, if p.accumulate { 1.0f32 } else { 0.0 });
        // cuBLAS is column-major, so it sees the three row-major matrices
        // transposed: w as cols x rows, x as cols x n, out as ld_out x n.
        // out^T = w x^T is then C = A^T B with A = w and B = x.
        sys::cublasGemmEx(
            *self.handle.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            m,
            nn,
            k,
            &alpha as *const f32 as *const c_void,
            w.addr() as *const c_void,
            sys::cudaDataType::CUDA_R_16F,
            k,
            x.addr() as *const c_void,
            sys::cudaDataType::CUDA_R_16F,
            k,
            &beta as *const f32 as *const c_void,
            out.addr() as *mut c_void,
            sys::cudaDataType::CUDA_R_32F,
            ldc,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
        .result()
        .map_err(blas_error("cublasGemmEx"))
    }
}

/// How a matrix of `rows` x `cols` is cut for the f16 scratch: rows per
/// chunk (a multiple of [`CHUNK_ROW_ALIGN`] unless it is the whole
/// matrix), chunks as even as that allows, each at most
/// [`BLAS_SCRATCH_MAX_BYTES`] unless one aligned chunk is larger.
pub fn chunk_rows(rows: usize, cols: usize) -> usize {
    let row_bytes = 2 * cols;
    if rows * row_bytes <= BLAS_SCRATCH_MAX_BYTES {
        return rows;
    }
    let most = (BLAS_SCRATCH_MAX_BYTES / row_bytes / CHUNK_ROW_ALIGN).max(1) * CHUNK_ROW_ALIGN;
    let chunks = rows.div_ceil(most);
    rows.div_ceil(chunks)
        .next_multiple_of(CHUNK_ROW_ALIGN)
        .min(most)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_matrix_within_the_scratch() {
        for (rows, cols) in [
            (14336, 4096),
            (4096, 14336),
            (128256, 4096),
            (151936, 896),
            (4864, 896),
            (1536, 576),
            (1000, 100_000),
            (3, 4_000_000),
        ] {
            let c = chunk_rows(rows, cols);
            assert!(c >= 1 && c <= rows, "{rows}x{cols}: {c}");
            if c < rows {
                assert!(c.is_multiple_of(CHUNK_ROW_ALIGN), "{rows}x{cols}: {c}");
                assert!(
                    c * cols * 2 <= BLAS_SCRATCH_MAX_BYTES.max(CHUNK_ROW_ALIGN * cols * 2),
                    "{rows}x{cols}: {c}"
                );
            }
        }
        assert_eq!(chunk_rows(14336, 4096), 7168);
        assert_eq!(chunk_rows(1536, 576), 1536);
    }
}
