//! The loaded kernel set of one context (M0-W-1430) and the one launcher.
//!
//! [`Kernels::load`] compiles (or takes from the disk cache) the compile
//! units a model needs (`source::Unit`: every module, the per-format ones
//! for the model's formats) and looks up their [`Kernel`]s. [`Kernels::launch`]
//! launches any kernel from its argument struct: it refuses zero or
//! out-of-range dimensions, null buffers and inconsistent arguments before
//! it queues anything (M0-W-1431), lays the grid out (the kernel family's
//! `Family::config`) and checks the launch result. Callers (`ops.rs`,
//! `sample.rs`) check shapes and buffer sizes before that. Which kernel a
//! product or an attention takes is decided in `select.rs`, on the
//! switches held here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUfunction_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use super::attention_split::SPLIT_MIN_CONTEXT;
use super::attention_tc::ATC_MIN_ROWS;
use super::gemm::{blas_min_rows_from_env, GEMM_FEW_ENV};
use super::kernel::{launch_config, Kernel};
use super::launch::{KernelCall, ParamList};
use super::matmul::{MV_WARP_MIN_ROWS, TC_MIN_BLOCKS_PER_SM};
use super::matvec::{qkv_rope_max_blocks, MV1_MIN_ROWS, MV8_EXPERTS_ENV};
use crate::backend::cuda::fault::driver_error;
use crate::backend::cuda::nvrtc::{compile_unit, KernelCache};
use crate::backend::cuda::source::{head_pairs, KernelSet, Unit};
use crate::backend::{BackendError, KvType};
use crate::quant::GgmlType;

/// Sets the context's per-thread stack to what the largest of its kernels
/// needs. The driver keeps that much local memory for every thread the GPU
/// can hold (the default 1 KiB, none of it used by the worker's kernels,
/// which need 0 bytes); it grows the limit by itself for a launch that
/// needs more (a library's kernel). The memory saved, at the same speed:
/// `benches/results/kernel-choices.md`.
fn set_stack_limit(ctx: &Arc<CudaContext>, bytes: usize) -> Result<(), BackendError> {
    ctx.set_limit(cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE, bytes)
        .map_err(|e| BackendError::driver("setting the stack limit", e))?;
    tracing::debug!(stack_bytes = bytes, "per-thread stack limit");
    Ok(())
}

/// The loaded kernels of one context.
pub struct Kernels {
    pub(super) funcs: HashMap<Kernel, CudaFunction>,
    /// The weight formats compiled (`None`: every format).
    pub(super) formats: Option<Vec<GgmlType>>,
    /// The KV cache type the attention kernels were built for.
    pub(super) kv_type: KvType,
    pub(super) mv_warp_min_rows: AtomicUsize,
    pub(super) mv1_min_rows: AtomicUsize,
    pub(super) tc_min_blocks: AtomicUsize,
    pub(super) split_min_context: AtomicUsize,
    pub(super) attention_tc_min_rows: AtomicUsize,
    /// The fewest rows of x whose matmuls run on cuBLAS.
    pub(super) blas_min_rows: AtomicUsize,
    /// Whether short prompts' matmuls may run on `gemm_tck_*` or `mmq_*`.
    pub(super) gemm_split: AtomicBool,
    /// Whether they take `gemm_few_*` where it applies (unless
    /// [`GEMM_FEW_ENV`] is `0`).
    pub(super) gemm_few: AtomicBool,
    /// The most blocks a decode step's `mv8q_*` launch may have (0: none
    /// is made; [`QKV_ROPE_ENV`](super::matvec::QKV_ROPE_ENV)).
    pub(super) qkv_rope_max_blocks: AtomicUsize,
    /// Whether one row of x goes through `mv8_*` where the format has one.
    pub(super) mv8: AtomicBool,
    /// Kernel launches and copies into device memory so far: a buffer's
    /// contents are unchanged while this count is (see `CudaOps`'s x8 block).
    pub(super) writes: AtomicU64,
    pub(super) sm_count: usize,
    /// Whether kernels are launched with programmatic stream serialization
    /// (sm_90 on, unless [`PDL_ENV`] is `0`; see `pdl_start` in common.cuh).
    pub(super) pdl: AtomicBool,
    /// Whether kernels may run in thread block clusters (sm_90 on, unless
    /// [`CLUSTERS_ENV`] is `0`).
    pub(super) clusters: AtomicBool,
    /// Whether chosen experts' products may take `mv8e_*` (unless
    /// [`MV8_EXPERTS_ENV`] is `0`).
    pub(super) mv8_experts: bool,
}

/// `WORKER_ORCD_PDL=0`: every kernel waits for the one ahead of it to end
/// before it is launched (programmatic dependent launch off).
pub const PDL_ENV: &str = "WORKER_ORCD_PDL";

/// `0` keeps the decode norm on one block (`add_rms_norm`) on sm_90 too.
pub const CLUSTERS_ENV: &str = "WORKER_ORCD_CLUSTERS";

fn load_error(u: Unit, e: impl std::fmt::Debug) -> BackendError {
    BackendError::KernelLaunchFailed(format!("loading {}: {e:?}", u.label()))
}

/// Every unit's image for `arch`, compiled in parallel where not cached;
/// the flag says whether it came from the cache. Logs how many were
/// compiled, the slowest and the wall time: most of a first start.
fn unit_images(
    cache: &KernelCache,
    arch: (i32, i32),
    units: &[Unit],
) -> Result<Vec<(Unit, Vec<u8>, bool)>, BackendError> {
    let start = Instant::now();
    let timed: Vec<(Unit, Vec<u8>, bool, f64)> = std::thread::scope(|s| {
        let handles: Vec<_> = units
            .iter()
            .map(|&u| {
                s.spawn(move || {
                    let t = Instant::now();
                    cache
                        .load_or_compile(u, arch)
                        .map(|(img, hit)| (u, img, hit, t.elapsed().as_secs_f64()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("compile thread panicked"))
            .collect::<Result<_, _>>()
    })?;
    let compiled = timed.iter().filter(|t| !t.2).count();
    let slowest = timed
        .iter()
        .filter(|t| !t.2)
        .max_by(|a, b| a.3.total_cmp(&b.3));
    crate::narrate!(
        info,
        "kernels_ready",
        units = timed.len(),
        compiled,
        slowest_unit = %slowest.map(|t| t.0.label()).unwrap_or_default(),
        slowest_ms = slowest.map_or(0, |t| (t.3 * 1e3) as u64),
        wall_ms = start.elapsed().as_millis() as u64,
        "kernel images ready"
    );
    Ok(timed
        .into_iter()
        .map(|(u, img, hit, _)| (u, img, hit))
        .collect())
}

/// Loads unit `u` from `image`; a cached image that does not load (stale
/// or damaged) is compiled afresh and replaced.
fn load_module(
    ctx: &Arc<CudaContext>,
    cache: &KernelCache,
    arch: (i32, i32),
    (u, image, from_cache): (Unit, Vec<u8>, bool),
) -> Result<Arc<CudaModule>, BackendError> {
    match ctx.load_module(Ptx::from_binary(image)) {
        Ok(module) => Ok(module),
        Err(e) if from_cache => {
            tracing::warn!(module = %u.label(), error = ?e, "cached kernels did not load; recompiling");
            let image = compile_unit(u, arch)?;
            cache.put(u, arch, &image);
            ctx.load_module(Ptx::from_binary(image))
                .map_err(|e| load_error(u, e))
        }
        Err(e) => Err(load_error(u, e)),
    }
}

/// The unit images of [`Kernels::compile_in_background`], being made.
pub type Compiling = std::thread::JoinHandle<Result<Vec<(Unit, Vec<u8>, bool)>, BackendError>>;

impl Kernels {
    /// Starts compiling (or taking from the disk cache) the units for
    /// `arch` that a model of `set` needs, on a thread of their own: NVRTC
    /// needs no CUDA context, so the caller makes one meanwhile.
    pub fn compile_in_background(arch: (i32, i32), set: Option<KernelSet<'_>>) -> Compiling {
        let units = Unit::for_model(set);
        std::thread::spawn(move || unit_images(&KernelCache::from_env(), arch, &units))
    }

    /// Waits for the images of [`Kernels::compile_in_background`] (the
    /// units for `arch` that hold the kernels of a model of `set`; `None`:
    /// every format and head size), loads them into `ctx` and looks up
    /// their kernels.
    pub fn load(
        ctx: &Arc<CudaContext>,
        arch: (i32, i32),
        set: Option<KernelSet<'_>>,
        compiling: Compiling,
    ) -> Result<Kernels, BackendError> {
        let cache = KernelCache::from_env();
        let images = compiling
            .join()
            .map_err(|_| BackendError::Compile("the compile thread panicked".into()))??;
        let mut modules = HashMap::new();
        for image in images {
            let u = image.0;
            modules.insert(u, load_module(ctx, &cache, arch, image)?);
        }
        let formats = set.map(|s| s.formats);
        let pairs = set.map(|s| head_pairs(s.head_dim));
        let kv_type = set.map_or(KvType::F16, |s| s.kv_type);
        let mut funcs = HashMap::new();
        let mut stack_bytes = 0usize;
        for k in Kernel::all() {
            let module = k.module();
            let unit = Unit {
                module,
                format: if formats.is_some() && module.per_format() {
                    k.format()
                } else {
                    None
                },
                head_pairs: if module.per_head_size() { pairs } else { None },
                part: if formats.is_some() { k.part() } else { None },
                kv: Unit::kv_of(module, kv_type),
            };
            // A kernel of a format or head size the model does not use was
            // not compiled.
            let Some(module) = modules.get(&unit) else {
                continue;
            };
            if let (Some(p), Some(want)) = (k.head_pairs(), pairs) {
                if p != want {
                    continue;
                }
            }
            let f = module.load_function(&k.symbol()).map_err(|e| {
                BackendError::driver(format!("{} has no kernel {}", unit.label(), k.symbol()), e)
            })?;
            let set = |attr: Attr, value: i32| {
                f.set_attribute(attr, value).map_err(|e| {
                    BackendError::driver(format!("setting {}'s {attr:?}", k.symbol()), e)
                })
            };
            if let Some(bytes) = k.dynamic_smem() {
                set(
                    Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )?;
            }
            if k.prefers_shared_memory() {
                // Percent of the unified L1/shared memory (100: the most).
                set(
                    Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    100,
                )?;
            }
            let local = f
                .get_attribute(Attr::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
                .map_err(|e| {
                    BackendError::driver(format!("reading {}'s local memory size", k.symbol()), e)
                })?;
            stack_bytes = stack_bytes.max(local.max(0) as usize);
            funcs.insert(k, f);
        }
        set_stack_limit(ctx, stack_bytes)?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| BackendError::driver("reading the multiprocessor count", e))?
            as usize;
        Ok(Kernels {
            funcs,
            formats: formats.map(Unit::formats_compiled),
            kv_type,
            mv_warp_min_rows: AtomicUsize::new(MV_WARP_MIN_ROWS),
            mv1_min_rows: AtomicUsize::new(MV1_MIN_ROWS),
            tc_min_blocks: AtomicUsize::new(TC_MIN_BLOCKS_PER_SM * sm_count),
            split_min_context: AtomicUsize::new(SPLIT_MIN_CONTEXT),
            attention_tc_min_rows: AtomicUsize::new(ATC_MIN_ROWS),
            blas_min_rows: AtomicUsize::new(blas_min_rows_from_env()?),
            gemm_split: AtomicBool::new(true),
            gemm_few: AtomicBool::new(std::env::var(GEMM_FEW_ENV).map_or(true, |v| v != "0")),
            qkv_rope_max_blocks: AtomicUsize::new(qkv_rope_max_blocks(sm_count)),
            mv8: AtomicBool::new(true),
            writes: AtomicU64::new(0),
            sm_count,
            pdl: AtomicBool::new(arch.0 >= 9 && std::env::var(PDL_ENV).map_or(true, |v| v != "0")),
            clusters: AtomicBool::new(
                arch.0 >= 9 && std::env::var(CLUSTERS_ENV).map_or(true, |v| v != "0"),
            ),
            mv8_experts: std::env::var(MV8_EXPERTS_ENV).map_or(true, |v| v != "0"),
        })
    }

    /// The KV cache type the attention kernels read and write.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// Whether kernel `k` was compiled and loaded for this model.
    pub fn has(&self, k: impl Into<Kernel>) -> bool {
        self.funcs.contains_key(&k.into())
    }

    /// The GPU's multiprocessor count.
    #[cfg(test)]
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Counts a write into device memory made outside [`Kernels::launch`]
    /// (a copy or a fill).
    pub fn note_write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Kernel launches and noted writes so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Launches one kernel on `s`: checks the arguments (M0-W-1431), lays
    /// out the grid, pushes the parameters in the kernel's order.
    pub fn launch<C>(&self, s: &Arc<CudaStream>, call: &C) -> Result<(), BackendError>
    where
        C: KernelCall,
        C::Kernel: Into<Kernel>,
    {
        let plan = call.check()?;
        let k: Kernel = plan.kernel.into();
        #[cfg(feature = "fault-injection")]
        crate::backend::cuda::fault::injected(&k.symbol())?;
        let cfg = launch_config(k, plan.work)?;
        let params = call.params();
        let f = self.funcs.get(&k).ok_or_else(|| {
            BackendError::KernelLaunchFailed(format!(
                "{} was not compiled: this context holds the kernels of {:?} weights only",
                k.symbol(),
                self.formats
            ))
        })?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        let failed = |e| driver_error(&format!("launching {}", k.symbol()), e);
        let pdl = self.pdl.load(Ordering::Relaxed);
        let cluster = plan.work.cluster();
        if pdl || cluster.is_some() {
            return launch_ex(s, f, cfg, &params, pdl, cluster).map_err(failed);
        }
        let mut b = s.launch_builder(f);
        params.push_all(&mut b);
        // SAFETY: `C::Params` is the kernel's C signature (compared with the
        // sources by a test), every dimension was checked to fit its `int`,
        // no required buffer is null, and the caller checked buffer sizes.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(failed)
    }

    /// Whether the decode norm runs over a cluster of blocks
    /// (`add_rms_norm_cluster`).
    pub fn clusters(&self) -> bool {
        self.clusters.load(Ordering::Relaxed)
    }

    /// Turns cluster kernels on or off (for tests).
    #[cfg(test)]
    pub fn set_clusters(&self, on: bool) {
        self.clusters.store(on, Ordering::Relaxed);
    }

    /// Turns programmatic dependent launch on or off (for tests).
    #[cfg(test)]
    pub fn set_pdl(&self, on: bool) {
        self.pdl.store(on, Ordering::Relaxed);
    }

    /// Whether kernels are launched with programmatic stream serialization.
    #[cfg(test)]
    pub fn pdl(&self) -> bool {
        self.pdl.load(Ordering::Relaxed)
    }
}

/// One launch through `cuLaunchKernelEx`, with programmatic stream
/// serialization when `pdl` (the kernel may be scheduled before the one
/// ahead of it on `s` has ended: every kernel opens with `pdl_start`, which
/// waits for it; inside a stream capture this becomes a programmatic edge
/// of the graph) and in clusters of `cluster` blocks when given.
fn launch_ex<P: ParamList>(
    s: &Arc<CudaStream>,
    f: &CudaFunction,
    cfg: cudarc::driver::LaunchConfig,
    params: &P,
    pdl: bool,
    cluster: Option<u32>,
) -> Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    s.context().bind_to_thread()?;
    let mut addresses = Vec::with_capacity(24);
    params.addresses(&mut addresses);
    // SAFETY: plain C structs for which all zeros is a valid value.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    if pdl {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if let Some(blocks) = cluster {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim.x = blocks;
        attrs[n].value.clusterDim.y = 1;
        attrs[n].value.clusterDim.z = 1;
        n += 1;
    }
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: s.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: n as u32,
    };
    // SAFETY: as for `LaunchArgs::launch` in `Kernels::launch`: `addresses`
    // points at each parameter of the kernel's C signature in order, and
    // `params` outlives the call (the driver copies the values).
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            addresses.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}
