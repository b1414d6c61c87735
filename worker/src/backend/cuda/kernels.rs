//! The loaded kernel set of one context (M0-W-1430) and the one launcher.
//!
//! [`Kernels::load`] compiles (or takes from the disk cache) the compile
//! units a model needs (`source::Unit`: every module, the per-format ones
//! for the model's formats) and looks up their [`Kernel`]s. [`Kernels::launch`]
//! launches any kernel from its argument struct (`args.rs`): it refuses zero
//! or out-of-range dimensions, null buffers and inconsistent arguments
//! before it queues anything (M0-W-1431), lays the grid out
//! (`launch::launch_config`) and checks the launch result. Callers
//! (`ops.rs`, `sample.rs`) check shapes and buffer sizes before that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::CUfunction_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use half::f16;

use crate::backend::cuda::args::{
    AttentionCombineArgs, AttentionSplitArgs, GemmSplitsSumArgs, GemmTcSplitCall, MatVec8Call,
    MatVec8ManyCall, MatVec8NCall, MatmulArgs, MmqCall, X8Bufs,
};
use crate::backend::cuda::launch::{
    integer_gemm, launch_config, mv8_rows_per_block, Kernel, KernelCall, ParamList,
};
use crate::backend::cuda::nvrtc::{compile_unit, KernelCache};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    head_pairs, KernelSet, Unit, ATC_HEAD_DIMS, ATS_MAX_SPLITS, GEMM_BM, GEMM_BN, GF_BLOCKS_PER_SM,
    GF_MAX_TOKENS, GF_WARPS, GTC_BR, GTC_BT, MMQ_MAX_TOKENS, MV8_MAX_TOKENS, MV_MAX_TOKENS,
};
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// Up to this many rows of x, `matmul` runs `mv_*` once per group of
/// [`MV_MAX_TOKENS`] instead of `gemm_*`.
pub const MV_LOOP_MAX_TOKENS: usize = 32;
/// Up to this many rows of x, `mv_*` groups are also used when `gemm_*`
/// would have fewer tiles than the GPU has multiprocessors.
pub const MV_LOOP_SMALL_GRID_MAX_TOKENS: usize = 128;
/// From this many weight rows on, `matmul` uses `mvw_*` (a warp per row)
/// rather than `mv_*` (a block per row) for short x.
pub const MV_WARP_MIN_ROWS: usize = 4096;

/// From this many weight rows on, one row of x goes through `mv1_*` (which
/// streams 8 rows a block; on the H100 1.5-2.6x `mvw_*` at 4096 rows and
/// more, and no faster below ~2048).
pub const MV1_MIN_ROWS: usize = 2048;
/// Up to this many rows of x, quantized formats with `mv8n_*` run it over
/// groups of `MV8_MAX_TOKENS` rows (short prompts: each group reads the
/// weights once) instead of `mv_*` groups or a GEMM.
pub const MV8_LOOP_MAX_TOKENS: usize = MV_LOOP_MAX_TOKENS;

/// How a matmul runs on the integer mat-vec kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mv8Plan {
    /// One row of x: `mv8_*`.
    One,
    /// Several rows: `mv8n_*` per group of `MV8_MAX_TOKENS`.
    Rows,
    /// A short prompt's rows (more than `MV8_MAX_TOKENS`, up to
    /// [`MMQ_MAX_ROWS`]) in one `mmq_*` launch, where the format has it.
    Mma,
}

/// For float formats, `gemm_tc_*` (3xTF32) is used when its grid has at
/// least this many blocks per SM (fewer blocks than SMs leave tensor cores
/// idle, and `gemm_*` is faster). The quantized formats' `gemm_tc_*`
/// (integers on bf16 tensor cores) beats `gemm_*` at every grid size (1.5-2x
/// on the H100 with 56 blocks), so they take it wherever a GEMM runs.
pub const TC_MIN_BLOCKS_PER_SM: usize = 1;
/// From this many context positions on, a decode step's attention is split
/// over the context (`attention_split`); below, one block per head is faster.
pub const SPLIT_MIN_CONTEXT: usize = 1024;

/// From this many rows of x on, matmuls in a quantized format or F16 run
/// on cuBLAS over f16 (`blas.rs`) rather than `gemm_tc_*`/`gemm_tck_*`.
pub const BLAS_MIN_ROWS: usize = 64;
/// Overrides [`BLAS_MIN_ROWS`] (a row count; `off`: never), for measuring.
pub const BLAS_MIN_ROWS_ENV: &str = "WORKER_ORCD_BLAS_MIN_ROWS";

/// The most rows of x that go to `mmq_*` (the kernel takes up to
/// `MMQ_MAX_TOKENS`), and only for a matrix too small to fill the SMs with
/// `gemm_few_*` blocks (see `Kernels::few_fills`): H200, `bench -p` on
/// synthetic files, `mmq_*` / `gemm_few_*` tok/s: 0.5B Q8_0 shape 9 rows
/// 4,200 / 3,377, 16 rows 7,178 / 6,366, 20 rows 7,611 / 7,948; the 8B
/// shape fills the SMs and `gemm_few_*` wins from 9 rows (823 / 1,223).
pub const MMQ_MAX_ROWS: usize = 16;
const _: () = assert!(MMQ_MAX_ROWS <= MMQ_MAX_TOKENS && MMQ_MAX_ROWS > MV8_MAX_TOKENS);

/// The fewest 32-column steps a `gemm_tck_*` column range holds (so that
/// each block's loads have work to hide behind).
pub const GEMM_SPLIT_MIN_STEPS: usize = 8;

/// The fewest query rows (prefill) that go to `attention_tc`: from two rows
/// on, one block reading each key once for 64 rows beats a block per row.
pub const ATC_MIN_ROWS: usize = 2;

/// `attention_split` blocks per SM. Measured on the H100 at depth 4096
/// (tok/s with 4 / 2 / 1 blocks an SM, before the instances for groups of
/// 4, which fit 5 an SM): 0.5B shape 630 / 608 / 515, 8B 198 / 204 / 169.
/// The tensor-core kernel (heads of 64 and 128 dims) takes chunks of at
/// least 128 keys, so at that depth fewer chunks are filled and 2 to 8
/// blocks an SM changed its tok/s by less than 4%; the bound matters for
/// longer contexts.
pub const SPLIT_BLOCKS_PER_SM: usize = 4;

/// How `attention_split` divides a context: into `nsplit` chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextSplit {
    pub nsplit: usize,
}

/// Sets the context's per-thread stack to what the largest of its kernels
/// needs. The driver keeps that much local memory for every thread the GPU
/// can hold (the default 1 KiB: 264 MiB on an H100, none of it used by the
/// worker's kernels, which need 0 bytes); it grows the limit by itself for
/// a launch that needs more (a library's kernel). On the H100 the 0.5B
/// shape's worker went from 1,049 to 785 MiB, with the same tok/s.
fn set_stack_limit(ctx: &Arc<CudaContext>, bytes: usize) -> Result<(), BackendError> {
    ctx.set_limit(cudarc::driver::sys::CUlimit::CU_LIMIT_STACK_SIZE, bytes)
        .map_err(|e| BackendError::KernelLaunchFailed(format!("setting the stack limit: {e:?}")))?;
    tracing::debug!(stack_bytes = bytes, "per-thread stack limit");
    Ok(())
}

/// The loaded kernels of one context.
pub struct Kernels {
    funcs: HashMap<Kernel, CudaFunction>,
    /// The weight formats compiled (`None`: every format).
    formats: Option<Vec<GgmlType>>,
    mv_warp_min_rows: AtomicUsize,
    mv1_min_rows: AtomicUsize,
    tc_min_blocks: AtomicUsize,
    split_min_context: AtomicUsize,
    attention_tc_min_rows: AtomicUsize,
    /// The fewest rows of x whose matmuls run on cuBLAS.
    blas_min_rows: AtomicUsize,
    /// Whether short prompts' matmuls may run on `gemm_tck_*` or `mmq_*`.
    gemm_split: AtomicBool,
    /// Whether they take `gemm_few_*` where it applies (unless
    /// [`GEMM_FEW_ENV`] is `0`).
    gemm_few: AtomicBool,
    /// The most blocks a decode step's `mv8q_*` launch may have (0: none
    /// is made; [`QKV_ROPE_ENV`]).
    qkv_rope_max_blocks: AtomicUsize,
    /// Whether one row of x goes through `mv8_*` where the format has one.
    mv8: AtomicBool,
    /// Kernel launches and copies into device memory so far: a buffer's
    /// contents are unchanged while this count is (see `CudaOps`'s x8 block).
    writes: AtomicU64,
    sm_count: usize,
    /// Whether kernels are launched with programmatic stream serialization
    /// (sm_90 on, unless [`PDL_ENV`] is `0`; see `pdl_start` in common.cuh).
    pdl: AtomicBool,
    /// Whether kernels may run in thread block clusters (sm_90 on, unless
    /// [`CLUSTERS_ENV`] is `0`).
    clusters: AtomicBool,
    /// Whether chosen experts' products may take `mv8e_*` (unless
    /// [`MV8_EXPERTS_ENV`] is `0`).
    mv8_experts: bool,
}

/// `WORKER_ORCD_PDL=0`: every kernel waits for the one ahead of it to end
/// before it is launched (programmatic dependent launch off).
pub const PDL_ENV: &str = "WORKER_ORCD_PDL";

/// `0` keeps short prompts' matmuls on `gemm_tck_*` and `mmq_*` rather than
/// `gemm_few_*`.
pub const GEMM_FEW_ENV: &str = "WORKER_ORCD_GEMM_FEW";

/// Where a decode step's RoPE and KV store run with the Q, K and V
/// products (`mv8q_*`): `0` never (`qk_rope_store` after `mv8m_*`), `all`
/// wherever the products allow it, otherwise (the default) only for
/// launches of one wave of blocks ([`MV8Q_BLOCKS_PER_SM`] an SM). On the
/// H100 (same lease, `worker-orcd bench -p 0 -n 128 -r 3`, two rounds) the
/// 8B shape's 3,072-block launch gained nothing in Q8_0 (277 / 276 ->
/// 275 / 274 tok/s) and 1-3% in Q4_K (355 / 352 -> 358 / 362), while
/// SmolLM2's 120 blocks gained 5% (1,330-1,349 -> 1,398-1,402).
pub const QKV_ROPE_ENV: &str = "WORKER_ORCD_QKV_ROPE";

/// Blocks of `mv8q_*` an SM holds at once (128 threads a block: 16 fill an
/// SM's 2,048 threads).
pub const MV8Q_BLOCKS_PER_SM: usize = 16;

/// The most blocks of a `mv8q_*` launch by the environment
/// ([`QKV_ROPE_ENV`]) on a GPU of `sm_count` SMs.
pub fn qkv_rope_max_blocks(sm_count: usize) -> usize {
    match std::env::var(QKV_ROPE_ENV).as_deref() {
        Ok("0") => 0,
        Ok("all") => usize::MAX,
        _ => MV8Q_BLOCKS_PER_SM * sm_count,
    }
}

/// `0` keeps the decode norm on one block (`add_rms_norm`) on sm_90 too.
pub const CLUSTERS_ENV: &str = "WORKER_ORCD_CLUSTERS";

/// `0` keeps a mixture of experts' decode products on `mv1e_*` (f32 x)
/// rather than `mv8e_*`.
pub const MV8_EXPERTS_ENV: &str = "WORKER_ORCD_MV8_EXPERTS";

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
        let images = compiling.join().map_err(|_| {
            BackendError::KernelLaunchFailed("the compile thread panicked".into())
        })??;
        let mut modules = HashMap::new();
        for image in images {
            let u = image.0;
            modules.insert(u, load_module(ctx, &cache, arch, image)?);
        }
        let formats = set.map(|s| s.formats);
        let pairs = set.map(|s| head_pairs(s.head_dim));
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
            };
            // A kernel of a format or head size the model does not use was
            // not compiled.
            let Some(module) = modules.get(&unit) else {
                continue;
            };
            if let (
                Kernel::AttentionSplit(p, _)
                | Kernel::AttentionSplitTc(p)
                | Kernel::AttentionSplitRows(p, _)
                | Kernel::AttentionSplitTcRows(p),
                Some(want),
            ) = (k, pairs)
            {
                if p != want {
                    continue;
                }
            }
            let f = module.load_function(&k.symbol()).map_err(|e| {
                BackendError::KernelLaunchFailed(format!(
                    "{} has no kernel {}: {e:?}",
                    unit.label(),
                    k.symbol()
                ))
            })?;
            let set = |attr: Attr, value: i32| {
                f.set_attribute(attr, value).map_err(|e| {
                    BackendError::KernelLaunchFailed(format!(
                        "setting {}'s {attr:?}: {e:?}",
                        k.symbol()
                    ))
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
                    BackendError::KernelLaunchFailed(format!(
                        "reading {}'s local memory size: {e:?}",
                        k.symbol()
                    ))
                })?;
            stack_bytes = stack_bytes.max(local.max(0) as usize);
            funcs.insert(k, f);
        }
        set_stack_limit(ctx, stack_bytes)?;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| {
                BackendError::KernelLaunchFailed(format!("reading the multiprocessor count: {e:?}"))
            })? as usize;
        Ok(Kernels {
            funcs,
            formats: formats.map(Unit::formats_compiled),
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

    /// Whether kernel `k` was compiled and loaded for this model.
    pub fn has(&self, k: Kernel) -> bool {
        self.funcs.contains_key(&k)
    }

    /// Changes the row count from which `mvw_*` is used (for tests and benchmarks).
    pub fn set_mv_warp_min_rows(&self, rows: usize) {
        self.mv_warp_min_rows.store(rows, Ordering::Relaxed);
    }

    /// The GPU's multiprocessor count.
    #[cfg(test)]
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Changes the row count from which `mv1_*` is used (for tests and
    /// benchmarks; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_mv1_min_rows(&self, rows: usize) {
        self.mv1_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Changes the grid size from which `gemm_tc_*` is used (for tests and
    /// benchmarks; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_tc_min_blocks(&self, blocks: usize) {
        self.tc_min_blocks.store(blocks, Ordering::Relaxed);
    }

    /// Changes the context length from which decode attention is split (for
    /// tests and benchmarks; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_split_min_context(&self, positions: usize) {
        self.split_min_context.store(positions, Ordering::Relaxed);
    }

    /// Turns `mv8_*` on or off (for tests and benchmarks).
    #[cfg(test)]
    pub fn set_mv8(&self, on: bool) {
        self.mv8.store(on, Ordering::Relaxed);
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

    /// Whether one row of x may go through `mv8_*` at all.
    pub fn mv8_enabled(&self) -> bool {
        self.mv8.load(Ordering::Relaxed)
    }

    /// Whether chosen experts' products in format `t` may take `mv8e_*`:
    /// the integer mat-vec on (and not turned off for experts by
    /// [`MV8_EXPERTS_ENV`]), the kernel compiled.
    pub fn mv8_experts_ready(&self, t: GgmlType) -> bool {
        self.mv8_experts
            && self.mv8.load(Ordering::Relaxed)
            && self.funcs.contains_key(&Kernel::MatVec8Experts(t))
    }

    /// Whether a short prompt's matmul in format `t` takes `mmq_*`: the
    /// kernel compiled, and the short-prompt kernels on (`set_gemm_split`,
    /// which switches `gemm_tck_*` and this alike).
    fn mmq_ready(&self, t: GgmlType) -> bool {
        self.gemm_split.load(Ordering::Relaxed) && self.funcs.contains_key(&Kernel::Mmq(t))
    }

    /// Whether `gemm_few_*` takes this matmul: short-prompt kernels on, few
    /// enough rows of x, whole 64-column chunks, the kernel compiled.
    fn few_ready(&self, m: &MatmulArgs) -> bool {
        m.n <= GF_MAX_TOKENS && self.few_takes(m)
    }

    /// Whether `gemm_few_*` takes this matrix, in groups of up to
    /// `GF_MAX_TOKENS` rows of x: on, whole 64-column chunks, compiled for
    /// the format.
    fn few_takes(&self, m: &MatmulArgs) -> bool {
        self.gemm_split.load(Ordering::Relaxed)
            && self.gemm_few.load(Ordering::Relaxed)
            && m.w.cols.is_multiple_of(64)
            && self.funcs.contains_key(&Kernel::GemmFew(m.w.ty))
    }

    /// Whether this matmul runs on `mv8_*` from a quantized x, and how: one
    /// row (`mv8_*`), a short prompt's rows in a format with `mmq_*`, or up
    /// to [`MV8_LOOP_MAX_TOKENS`] rows of x (`mv8n_*`) in a format that has
    /// such a kernel compiled.
    pub fn mv8_choice(&self, m: &MatmulArgs) -> Option<Mv8Plan> {
        let w = &m.w;
        if !self.mv8_applies(m) {
            return None;
        }
        match m.n {
            1 => Some(Mv8Plan::One),
            n if n > MV8_MAX_TOKENS
                && n <= MMQ_MAX_ROWS
                && self.mmq_ready(w.ty)
                && !(self.few_ready(m) && self.few_fills(w.rows, w.cols)) =>
            {
                Some(Mv8Plan::Mma)
            }
            n if n <= MV8_LOOP_MAX_TOKENS => Some(Mv8Plan::Rows),
            _ => None,
        }
    }

    /// Whether the integer mat-vec kernels take this product: on, whole
    /// 32-column groups, compiled for the format.
    pub fn mv8_applies(&self, m: &MatmulArgs) -> bool {
        self.mv8.load(Ordering::Relaxed)
            && m.w.cols.is_multiple_of(32)
            && self.funcs.contains_key(&Kernel::MatVec8(m.w.ty))
    }

    /// A batched decode step's product (`CudaOps` rows mode) in a format
    /// without `mv8_*`: `mv_<ty>` (`mvw_<ty>` from [`MV_WARP_MIN_ROWS`]
    /// weight rows on) over groups of up to [`MV_MAX_TOKENS`] rows of x,
    /// whatever `n` is, so that a row's result does not depend on how many
    /// rows share the step (`matmul` takes `mv1_*` for one row).
    pub fn matmul_rows(&self, s: &Arc<CudaStream>, m: &MatmulArgs) -> Result<(), BackendError> {
        m.check()?;
        let kernel = if m.w.rows >= self.mv_warp_min_rows.load(Ordering::Relaxed) {
            Kernel::MatVecWarp(m.w.ty)
        } else {
            Kernel::MatVec(m.w.ty)
        };
        for t0 in (0..m.n).step_by(MV_MAX_TOKENS) {
            let group = m.rows_of_x(t0, MV_MAX_TOKENS.min(m.n - t0));
            self.launch(s, &group.with_kernel(kernel))?;
        }
        Ok(())
    }

    /// `out = x W^T (+ bias)` on `mv8_*` as `plan` says, from x split into `x8`.
    pub fn matvec8(
        &self,
        s: &Arc<CudaStream>,
        m: &MatmulArgs,
        plan: Mv8Plan,
        x8: X8Bufs,
    ) -> Result<(), BackendError> {
        match plan {
            Mv8Plan::One => self.launch(s, &MatVec8Call { args: *m, x8 }),
            Mv8Plan::Mma => self.launch(s, &MmqCall { args: *m, x8 }),
            Mv8Plan::Rows => self.launch(s, &MatVec8NCall { args: *m, x8 }),
        }
    }

    /// Two or three products of one row of x (`products`, of one format
    /// with `mv8_*` and one width) in one `mv8m_*` launch, from x split into
    /// `x8`; each output as `matvec8` would write it.
    pub fn matvec8_many(
        &self,
        s: &Arc<CudaStream>,
        products: &[MatmulArgs],
        x8: X8Bufs,
    ) -> Result<(), BackendError> {
        let (Some(&first), 2..=3) = (products.first(), products.len()) else {
            return Err(BackendError::KernelLaunchFailed(format!(
                "mv8m takes 2 or 3 products, not {}",
                products.len()
            )));
        };
        let mut args = [first; 3];
        args[..products.len()].copy_from_slice(products);
        self.launch(
            s,
            &MatVec8ManyCall {
                args,
                count: products.len(),
                x8,
            },
        )
    }

    /// Which short-prompt kernel takes this matmul and into how many column
    /// ranges it splits it, or none: it takes more rows of x than one
    /// `mv8n_*` launch, in a quantized format with the kernel.
    /// `gemm_few_*` where it applies (see [`Kernels::few_splits`]), else
    /// `gemm_tck_*`: one range when the tiles alone give every SM a block,
    /// else as many as fit two blocks per SM (the kernel's occupancy) in
    /// one wave, each of at least [`GEMM_SPLIT_MIN_STEPS`] steps of 32
    /// columns. Depends on the shape only, so a row's result never depends
    /// on the other rows.
    pub fn gemm_splits(&self, m: &MatmulArgs) -> Option<GemmSplit> {
        let w = &m.w;
        if !self.gemm_split.load(Ordering::Relaxed)
            || m.n <= MV8_MAX_TOKENS
            || self.mv8_choice(m) == Some(Mv8Plan::Mma)
            || !w.cols.is_multiple_of(32)
        {
            return None;
        }
        if self.few_ready(m) {
            return Some(GemmSplit {
                few: true,
                splits: self.few_splits(w.rows, w.cols),
            });
        }
        if !self.funcs.contains_key(&Kernel::GemmTcSplit(w.ty)) {
            return None;
        }
        let tiles = tc_tiles(w.rows, m.n);
        let splits = if tiles >= self.sm_count {
            1
        } else {
            // Rounded down: a grid of one wave (a second, partial wave had
            // the 8B shape's matrices wait for its few blocks).
            (2 * self.sm_count / tiles)
                .min(w.cols / 32 / GEMM_SPLIT_MIN_STEPS)
                .max(1)
        };
        Some(GemmSplit {
            few: false,
            splits: even_ranges(w.cols / 32, splits),
        })
    }

    /// A batched decode step's product (`CudaOps` rows mode) on
    /// `gemm_few_*`, where the format has it: its column ranges depend on
    /// the matrix alone and a row's sums not on the others, so a row's
    /// result is the same bits in a batch of any size, one row included
    /// (groups of up to `GF_MAX_TOKENS` rows, a launch each).
    pub fn rows_few_plan(&self, m: &MatmulArgs) -> Option<GemmSplit> {
        self.few_takes(m).then(|| GemmSplit {
            few: true,
            splits: self.few_splits(m.w.rows, m.w.cols),
        })
    }

    /// Floats of `gemm_few_*`'s column-range products for one row of x by a
    /// `rows` x `cols` matrix (its `part`).
    pub fn few_part_floats(&self, rows: usize, cols: usize) -> usize {
        self.few_splits(rows, cols) * rows
    }

    /// `gemm_few_*`'s column ranges for a `rows` x `cols` matrix: as many as
    /// fill the SMs with [`GF_BLOCKS_PER_SM`] blocks each in one wave, down
    /// to ranges of one 64-column chunk (the 0.5B shape's 896 columns are
    /// 14). The number of rows of x plays no part: a row's result is the
    /// same in any batch.
    fn few_splits(&self, rows: usize, cols: usize) -> usize {
        let splits = (GF_BLOCKS_PER_SM * self.sm_count / few_row_blocks(rows))
            .min(cols / 64)
            .clamp(1, 64);
        even_ranges(cols / 64, splits)
    }

    /// Whether `gemm_few_*`'s grid for this matrix gives every SM a block.
    fn few_fills(&self, rows: usize, cols: usize) -> bool {
        few_row_blocks(rows) * self.few_splits(rows, cols) >= self.sm_count
    }

    /// `out = x W^T (+ bias)` on `gemm_tck_*` over `splits` column ranges
    /// into `part` (`[splits, n, rows]` f32), then `gemm_splits_sum`; `xh`
    /// holds x's two f16 parts (`to_f16`).
    pub fn gemm_split(
        &self,
        s: &Arc<CudaStream>,
        m: &MatmulArgs,
        xh: DevPtr<f16>,
        plan: GemmSplit,
        part: DevPtrMut<f32>,
    ) -> Result<(), BackendError> {
        let splits = plan.splits;
        self.launch(
            s,
            &GemmTcSplitCall {
                args: *m,
                few: plan.few,
                xh,
                splits,
                part,
            },
        )?;
        let sum = GemmSplitsSumArgs {
            part: part.as_const(),
            splits,
            len: m.n * m.w.rows,
            rows: m.w.rows,
            bias: m.bias,
            out: m.out,
        };
        self.launch(s, &sum)
    }

    /// Whether this matmul runs on cuBLAS over f16 (`blas.rs`): from the
    /// threshold's rows of x on, weights in F16 or a quantized format
    /// whose `dequant_f16_*` is compiled, rows of whole 8-value chunks.
    pub fn blas_choice(&self, m: &MatmulArgs) -> bool {
        let ty = m.w.ty;
        m.n >= self.blas_min_rows.load(Ordering::Relaxed)
            && m.w.cols.is_multiple_of(8)
            && self.funcs.contains_key(&Kernel::ToF16)
            && (ty == GgmlType::F16
                || (ty.block_len() > 1 && self.funcs.contains_key(&Kernel::DequantF16(ty))))
    }

    /// Changes the fewest rows of x that run on cuBLAS (for tests;
    /// `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_blas_min_rows(&self, rows: usize) {
        self.blas_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Turns the short-prompt kernels, `gemm_tck_*` and `mmq_*`, on or off
    /// (for tests and benchmarks).
    #[cfg(test)]
    pub fn set_gemm_split(&self, on: bool) {
        self.gemm_split.store(on, Ordering::Relaxed);
    }

    /// Turns `gemm_few_*` on or off (off: `gemm_tck_*` and `mmq_*` take
    /// the short prompts; for tests).
    #[cfg(test)]
    pub fn set_gemm_few(&self, on: bool) {
        self.gemm_few.store(on, Ordering::Relaxed);
    }

    /// Whether Q, K and V of one row of x (`q`, `k`, `v`) take one
    /// `mv8q_*` launch: each on `mv8_*` alone, of one format and width, the
    /// kernel compiled, and no more blocks than [`QKV_ROPE_ENV`] allows.
    /// (With the RoPE's angle taken after the products, each block's life
    /// grew: the 8B shape's 3,072 blocks, 1.45 waves, lost 1% in Q8_0 and
    /// Q4_K; the angle is now taken while the weights load.)
    pub fn qkv_rope_ready(&self, q: &MatmulArgs, k: &MatmulArgs, v: &MatmulArgs) -> bool {
        let same = |a: &MatmulArgs| {
            self.mv8_choice(a) == Some(Mv8Plan::One)
                && (a.w.ty, a.w.cols, a.w.row_bytes) == (q.w.ty, q.w.cols, q.w.row_bytes)
        };
        let per_block = mv8_rows_per_block(q.w.cols);
        let blocks: usize = [q, k, v].iter().map(|a| a.w.rows.div_ceil(per_block)).sum();
        same(q)
            && same(k)
            && same(v)
            && blocks <= self.qkv_rope_max_blocks.load(Ordering::Relaxed)
            && self.funcs.contains_key(&Kernel::MatVec8Qkv(q.w.ty))
    }

    /// Sets the most blocks a `mv8q_*` launch may take (0: none; `None`:
    /// as the environment says), for tests.
    #[cfg(test)]
    pub fn set_qkv_rope(&self, max_blocks: Option<usize>) {
        let max = max_blocks.unwrap_or_else(|| qkv_rope_max_blocks(self.sm_count));
        self.qkv_rope_max_blocks.store(max, Ordering::Relaxed);
    }

    /// Whether `n` query rows of heads of `head_dim` dims take `attention_tc`.
    pub fn attention_on_tensor_cores(&self, n: usize, head_dim: usize) -> bool {
        n >= self.attention_tc_min_rows.load(Ordering::Relaxed)
            && ATC_HEAD_DIMS.contains(&head_dim)
            && self.funcs.contains_key(&Kernel::AttentionTc)
    }

    /// Tests: the fewest query rows that take `attention_tc`
    /// ([`ATC_MIN_ROWS`] by default; `usize::MAX`: never).
    #[cfg(test)]
    pub fn set_attention_tc_min_rows(&self, rows: usize) {
        self.attention_tc_min_rows.store(rows, Ordering::Relaxed);
    }

    /// Whether a decode step at a context of `positions` splits its attention.
    pub fn splits_attention_at(&self, positions: usize) -> bool {
        positions >= self.split_min_context.load(Ordering::Relaxed)
    }

    /// How a context of up to `capacity` positions is split for `n_head_kv`
    /// KV heads: [`SPLIT_BLOCKS_PER_SM`] blocks per SM (the kernel cuts the
    /// filled context into that many chunks at run time).
    pub fn context_split(&self, n_head_kv: usize, capacity: usize) -> ContextSplit {
        let nsplit = (SPLIT_BLOCKS_PER_SM * self.sm_count)
            .div_ceil(n_head_kv.max(1))
            .min(capacity)
            .clamp(1, ATS_MAX_SPLITS);
        ContextSplit { nsplit }
    }

    /// Decode attention split over the context: `attention_split`, then
    /// `attention_combine` from `split.part` into `out`.
    pub fn attention_split(
        &self,
        s: &Arc<CudaStream>,
        split: &AttentionSplitArgs,
        combine: &AttentionCombineArgs,
    ) -> Result<(), BackendError> {
        combine.check()?;
        self.launch(s, split)?;
        self.launch(s, combine)
    }

    /// Launches one kernel on `s`: checks the arguments (M0-W-1431), lays
    /// out the grid, pushes the parameters in the kernel's order.
    pub fn launch<C: KernelCall>(&self, s: &Arc<CudaStream>, call: &C) -> Result<(), BackendError> {
        let plan = call.check()?;
        let k = plan.kernel;
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
        let failed =
            |e| BackendError::KernelLaunchFailed(format!("launching {}: {e:?}", k.symbol()));
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

    /// `out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r])`. One row of x from
    /// [`MV1_MIN_ROWS`] weight rows on: `mv1_<ty>`. Otherwise `mv_<ty>` (or
    /// `mvw_<ty>` from [`MV_WARP_MIN_ROWS`] rows on) over groups of up to
    /// [`MV_MAX_TOKENS`] rows of x when `n <= MV_LOOP_MAX_TOKENS`, or
    /// `n <= MV_LOOP_SMALL_GRID_MAX_TOKENS` and `gemm_<ty>` would not fill
    /// the GPU (short prompts: a block per weight row keeps every SM busy,
    /// and the weights stay in L2 between groups); else, float formats,
    /// `gemm_tc_<ty>` on tensor cores when its grid fills the GPU, or
    /// `gemm_<ty>`.
    pub fn matmul(&self, s: &Arc<CudaStream>, m: &MatmulArgs) -> Result<(), BackendError> {
        m.check()?;
        let (n, rows) = (m.n, m.w.rows);
        if n == 1 && rows >= self.mv1_min_rows.load(Ordering::Relaxed) {
            return self.launch(s, &m.one_row());
        }
        let gemm_blocks = rows.div_ceil(GEMM_BM as usize) * n.div_ceil(GEMM_BN as usize);
        let few_tiles = n <= MV_LOOP_SMALL_GRID_MAX_TOKENS && gemm_blocks < self.sm_count;
        if n > MV_MAX_TOKENS && (n <= MV_LOOP_MAX_TOKENS || few_tiles) {
            for t0 in (0..n).step_by(MV_MAX_TOKENS) {
                self.matmul(s, &m.rows_of_x(t0, MV_MAX_TOKENS.min(n - t0)))?;
            }
            return Ok(());
        }
        let tc_blocks = tc_tiles(rows, n);
        // The quantized formats' tensor-core GEMM (`gemm_tck_*`) takes x's
        // f16 parts: `CudaOps::matmul` runs it (`gemm_splits`).
        let kernel = if n > MV_MAX_TOKENS
            && tc_blocks >= self.tc_min_blocks.load(Ordering::Relaxed)
            && !integer_gemm(m.w.ty)
        {
            Kernel::GemmTc(m.w.ty)
        } else if n > MV_MAX_TOKENS {
            Kernel::Gemm(m.w.ty)
        } else if rows >= self.mv_warp_min_rows.load(Ordering::Relaxed) {
            Kernel::MatVecWarp(m.w.ty)
        } else {
            Kernel::MatVec(m.w.ty)
        };
        self.launch(s, &m.with_kernel(kernel))
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

/// [`BLAS_MIN_ROWS`], or what [`BLAS_MIN_ROWS_ENV`] says.
fn blas_min_rows_from_env() -> Result<usize, BackendError> {
    match std::env::var(BLAS_MIN_ROWS_ENV) {
        Err(_) => Ok(BLAS_MIN_ROWS),
        Ok(v) if v.trim() == "off" => Ok(usize::MAX),
        Ok(v) => v.trim().parse::<usize>().map_err(|_| {
            BackendError::InvalidDevice(format!(
                "{BLAS_MIN_ROWS_ENV}={v:?} is neither a row count nor \"off\""
            ))
        }),
    }
}

/// A short prompt's matmul: `gemm_few_*` (`few`) or `gemm_tck_*`, over
/// `splits` column ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmSplit {
    pub few: bool,
    pub splits: usize,
}

/// `gemm_few_*` blocks along the weight rows (32 a warp).
fn few_row_blocks(rows: usize) -> usize {
    rows.div_ceil(GF_WARPS as usize * 32)
}

/// `splits` ranges of `steps` as the kernels cut them (ceil(steps /
/// splits) long), fewer where that leaves the last ones empty.
fn even_ranges(steps: usize, splits: usize) -> usize {
    steps.div_ceil(steps.div_ceil(splits.max(1)))
}

/// Blocks of a `gemm_tc_*` grid (per column range, for `gemm_tck_*`).
fn tc_tiles(rows: usize, n: usize) -> usize {
    rows.div_ceil(GTC_BR as usize) * n.div_ceil(GTC_BT as usize)
}
