//! The loaded kernel set of one context (M0-W-1430) and the one launcher.
//!
//! [`Kernels::load`] compiles (or takes from the disk cache) every module
//! listed in `source.rs` and looks up every [`Kernel`]. [`Kernels::launch`]
//! launches any kernel from its argument struct (`args.rs`): it refuses zero
//! or out-of-range dimensions, null buffers and inconsistent arguments
//! before it queues anything (M0-W-1431), lays the grid out
//! (`launch::launch_config`) and checks the launch result. Callers
//! (`ops.rs`, `sample.rs`) check shapes and buffer sizes before that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::backend::cuda::args::MatmulArgs;
use crate::backend::cuda::launch::{launch_config, Kernel, KernelCall, ParamList};
use crate::backend::cuda::nvrtc::{compile_module, KernelCache};
use crate::backend::cuda::source::{Module, GEMM_BM, GEMM_BN, MV_MAX_TOKENS};
use crate::backend::BackendError;

/// Up to this many rows of x, `matmul` runs `mv_*` once per group of
/// [`MV_MAX_TOKENS`] instead of `gemm_*`.
pub const MV_LOOP_MAX_TOKENS: usize = 32;
/// Up to this many rows of x, `mv_*` groups are also used when `gemm_*`
/// would have fewer tiles than the GPU has multiprocessors.
pub const MV_LOOP_SMALL_GRID_MAX_TOKENS: usize = 128;
/// From this many weight rows on, `matmul` uses `mvw_*` (a warp per row)
/// rather than `mv_*` (a block per row) for short x.
pub const MV_WARP_MIN_ROWS: usize = 4096;

/// The loaded kernels of one context.
pub struct Kernels {
    funcs: HashMap<Kernel, CudaFunction>,
    mv_warp_min_rows: AtomicUsize,
    sm_count: usize,
}

fn load_error(m: Module, e: impl std::fmt::Debug) -> BackendError {
    BackendError::KernelLaunchFailed(format!("loading {}: {e:?}", m.file_name()))
}

/// Every module's image for `arch`, compiled in parallel where not cached;
/// the flag says whether it came from the cache.
fn module_images(cache: &KernelCache, arch: (i32, i32)) -> Result<Vec<(Module, Vec<u8>, bool)>, BackendError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = Module::ALL
            .iter()
            .map(|&m| s.spawn(move || cache.load_or_compile(m, arch).map(|(img, hit)| (m, img, hit))))
            .collect();
        handles.into_iter().map(|h| h.join().expect("compile thread panicked")).collect()
    })
}

/// Loads module `m` from `image`; a cached image that does not load (stale
/// or damaged) is compiled afresh and replaced.
fn load_module(
    ctx: &Arc<CudaContext>,
    cache: &KernelCache,
    arch: (i32, i32),
    (m, image, from_cache): (Module, Vec<u8>, bool),
) -> Result<Arc<CudaModule>, BackendError> {
    match ctx.load_module(Ptx::from_binary(image)) {
        Ok(module) => Ok(module),
        Err(e) if from_cache => {
            tracing::warn!(module = m.file_name(), error = ?e, "cached kernels did not load; recompiling");
            let image = compile_module(m, arch)?;
            cache.put(m, arch, &image);
            ctx.load_module(Ptx::from_binary(image)).map_err(|e| load_error(m, e))
        }
        Err(e) => Err(load_error(m, e)),
    }
}

impl Kernels {
    /// Compiles (or takes from the disk cache) every module for `arch`, loads
    /// it into `ctx` and looks up every kernel. Modules compile in parallel.
    pub fn load(ctx: &Arc<CudaContext>, arch: (i32, i32)) -> Result<Kernels, BackendError> {
        let cache = KernelCache::from_env();
        let mut modules = HashMap::new();
        for image in module_images(&cache, arch)? {
            let m = image.0;
            modules.insert(m, load_module(ctx, &cache, arch, image)?);
        }
        let mut funcs = HashMap::new();
        for k in Kernel::all() {
            let f = modules[&k.module()].load_function(&k.symbol()).map_err(|e| {
                let file = k.module().file_name();
                BackendError::KernelLaunchFailed(format!("{file} has no kernel {}: {e:?}", k.symbol()))
            })?;
            funcs.insert(k, f);
        }
        let sm_count = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| BackendError::KernelLaunchFailed(format!("reading the multiprocessor count: {e:?}")))?
            as usize;
        Ok(Kernels { funcs, mv_warp_min_rows: AtomicUsize::new(MV_WARP_MIN_ROWS), sm_count })
    }

    /// Changes the row count from which `mvw_*` is used (for tests and benchmarks).
    pub fn set_mv_warp_min_rows(&self, rows: usize) {
        self.mv_warp_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Launches one kernel on `s`: checks the arguments (M0-W-1431), lays
    /// out the grid, pushes the parameters in the kernel's order.
    pub fn launch<C: KernelCall>(&self, s: &Arc<CudaStream>, call: &C) -> Result<(), BackendError> {
        let plan = call.check()?;
        let k = plan.kernel;
        let cfg = launch_config(k, plan.work)?;
        let params = call.params();
        let mut b = s.launch_builder(&self.funcs[&k]);
        params.push_all(&mut b);
        // SAFETY: `C::Params` is the kernel's C signature (compared with the
        // sources by a test), every dimension was checked to fit its `int`,
        // no required buffer is null, and the caller checked buffer sizes.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| BackendError::KernelLaunchFailed(format!("launching {}: {e:?}", k.symbol())))
    }

    /// `out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r])`: `mv_<ty>` (or
    /// `mvw_<ty>` from [`MV_WARP_MIN_ROWS`] rows on) over groups of up to
    /// [`MV_MAX_TOKENS`] rows of x when `n <= MV_LOOP_MAX_TOKENS`, or
    /// `n <= MV_LOOP_SMALL_GRID_MAX_TOKENS` and `gemm_<ty>` would not fill
    /// the GPU (short prompts: a block per weight row keeps every SM busy,
    /// and the weights stay in L2 between groups), else `gemm_<ty>`.
    pub fn matmul(&self, s: &Arc<CudaStream>, m: &MatmulArgs) -> Result<(), BackendError> {
        m.check()?;
        let (n, rows) = (m.n, m.w.rows);
        let gemm_blocks = rows.div_ceil(GEMM_BM as usize) * n.div_ceil(GEMM_BN as usize);
        let few_tiles = n <= MV_LOOP_SMALL_GRID_MAX_TOKENS && gemm_blocks < self.sm_count;
        if n > MV_MAX_TOKENS && (n <= MV_LOOP_MAX_TOKENS || few_tiles) {
            for t0 in (0..n).step_by(MV_MAX_TOKENS) {
                self.matmul(s, &m.rows_of_x(t0, MV_MAX_TOKENS.min(n - t0)))?;
            }
            return Ok(());
        }
        let kernel = if n > MV_MAX_TOKENS {
            Kernel::Gemm(m.w.ty)
        } else if rows >= self.mv_warp_min_rows.load(Ordering::Relaxed) {
            Kernel::MatVecWarp(m.w.ty)
        } else {
            Kernel::MatVec(m.w.ty)
        };
        self.launch(s, &m.with_kernel(kernel))
    }
}
