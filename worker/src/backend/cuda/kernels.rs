//! The kernel set (M0-W-1430): modules embedded from `cuda/*.cu`, kernels
//! named by an enum, and one launcher per kernel.
//!
//! Every launcher's doc comment gives each argument's shape and dtype.
//! Pointers are raw device addresses (`u64`); callers (`ops.rs`) check
//! shapes and buffer sizes before launching, each launcher refuses zero or
//! out-of-range dimensions and null buffers ([`check_args`]) before it
//! queues anything (M0-W-1431), and every launch result is checked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::backend::cuda::nvrtc::KernelCache;
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// Headers every module may include, by the name used in `#include "..."`.
pub const HEADERS: [(&str, &str); 2] = [
    ("common.cuh", include_str!("../../../../cuda/common.cuh")),
    ("dequant.cuh", include_str!("../../../../cuda/dequant.cuh")),
];

/// One `cuda/*.cu` file, compiled as one CUDA module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    Embed,
    Matmul,
    Norm,
    Rope,
    Attention,
    Elementwise,
    Sample,
}

impl Module {
    pub const ALL: [Module; 7] = [
        Module::Embed,
        Module::Matmul,
        Module::Norm,
        Module::Rope,
        Module::Attention,
        Module::Elementwise,
        Module::Sample,
    ];

    pub fn file_name(self) -> &'static str {
        match self {
            Module::Embed => "embed.cu",
            Module::Matmul => "matmul.cu",
            Module::Norm => "norm.cu",
            Module::Rope => "rope.cu",
            Module::Attention => "attention.cu",
            Module::Elementwise => "elementwise.cu",
            Module::Sample => "sample.cu",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Module::Embed => include_str!("../../../../cuda/embed.cu"),
            Module::Matmul => include_str!("../../../../cuda/matmul.cu"),
            Module::Norm => include_str!("../../../../cuda/norm.cu"),
            Module::Rope => include_str!("../../../../cuda/rope.cu"),
            Module::Attention => include_str!("../../../../cuda/attention.cu"),
            Module::Elementwise => include_str!("../../../../cuda/elementwise.cu"),
            Module::Sample => include_str!("../../../../cuda/sample.cu"),
        }
    }
}

/// Every kernel the backend launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `embed_<type>`: rows of a stored table to f32.
    Embed(GgmlType),
    /// `mv_<type>`: matrix product for up to [`MV_MAX_TOKENS`] rows of x, a block per weight row.
    MatVec(GgmlType),
    /// `mvw_<type>`: the same with a warp per weight row, for matrices of many rows.
    MatVecWarp(GgmlType),
    /// `gemm_<type>`: tiled matrix product for any number of rows of x.
    Gemm(GgmlType),
    RmsNorm,
    /// `layer_norm`: GPT-2's LayerNorm (M0-W-1432).
    LayerNorm,
    Rope,
    KvStore,
    Attention,
    Swiglu,
    /// `gelu`: GPT-2's tanh-approximated GELU (M0-W-1433).
    Gelu,
    AddAssign,
    /// `sample_select`: the sampling pipeline over one logit vector.
    SampleSelect,
    /// `sample_logprobs`: the top log-probabilities of one logit vector.
    SampleLogprobs,
}

/// Largest number of activation rows `mv_*` takes (`MV_MAX_TOKENS` in matmul.cu).
pub const MV_MAX_TOKENS: usize = 8;
/// Up to this many rows of x, `matmul` runs `mv_*` once per group of
/// [`MV_MAX_TOKENS`] instead of `gemm_*`.
pub const MV_LOOP_MAX_TOKENS: usize = 32;
/// Up to this many rows of x, `mv_*` groups are also used when `gemm_*`
/// would have fewer tiles than the GPU has multiprocessors.
pub const MV_LOOP_SMALL_GRID_MAX_TOKENS: usize = 128;
/// Threads per `mv_*` block (`MV_THREADS` in matmul.cu); one block per weight row.
const MV_THREADS: u32 = 128;
/// Output tile of `gemm_*` (`GEMM_BM` x `GEMM_BN`) and its block size.
const GEMM_TILE: u32 = 64;
const GEMM_THREADS: u32 = 256;
/// Threads of the one block of `sample_select` and `sample_logprobs` (`SAMPLE_THREADS` in sample.cu).
const SAMPLE_THREADS: u32 = 1024;
/// Most log-probabilities `sample_logprobs` returns (`SAMPLE_MAX_LOGPROBS` in sample.cu).
pub const SAMPLE_MAX_LOGPROBS: usize = 20;
/// u32 words of the sampling kernels' result buffer (`SAMPLE_OUT_WORDS` in sample.cu).
pub const SAMPLE_OUT_WORDS: usize = 8 + 2 * SAMPLE_MAX_LOGPROBS;
/// Threads per `attention` block and the largest head size it takes.
const ATT_THREADS: u32 = 256;
pub const ATT_MAX_HEAD_DIM: usize = 256;

impl Kernel {
    /// Every kernel, for loading them all at start.
    pub fn all() -> Vec<Kernel> {
        let mut v = Vec::new();
        for t in GgmlType::ALL {
            v.extend([Kernel::Embed(t), Kernel::MatVec(t), Kernel::MatVecWarp(t), Kernel::Gemm(t)]);
        }
        v.extend([
            Kernel::RmsNorm,
            Kernel::LayerNorm,
            Kernel::Rope,
            Kernel::KvStore,
            Kernel::Attention,
            Kernel::Swiglu,
            Kernel::Gelu,
            Kernel::AddAssign,
            Kernel::SampleSelect,
            Kernel::SampleLogprobs,
        ]);
        v
    }

    pub fn module(self) -> Module {
        match self {
            Kernel::Embed(_) => Module::Embed,
            Kernel::MatVec(_) | Kernel::MatVecWarp(_) | Kernel::Gemm(_) => Module::Matmul,
            Kernel::RmsNorm | Kernel::LayerNorm => Module::Norm,
            Kernel::Rope => Module::Rope,
            Kernel::KvStore | Kernel::Attention => Module::Attention,
            Kernel::Swiglu | Kernel::Gelu | Kernel::AddAssign => Module::Elementwise,
            Kernel::SampleSelect | Kernel::SampleLogprobs => Module::Sample,
        }
    }

    /// The `extern "C"` symbol in the module.
    pub fn symbol(self) -> String {
        let ty = |t: GgmlType| t.name().to_ascii_lowercase();
        match self {
            Kernel::Embed(t) => format!("embed_{}", ty(t)),
            Kernel::MatVec(t) => format!("mv_{}", ty(t)),
            Kernel::MatVecWarp(t) => format!("mvw_{}", ty(t)),
            Kernel::Gemm(t) => format!("gemm_{}", ty(t)),
            Kernel::RmsNorm => "rms_norm".into(),
            Kernel::LayerNorm => "layer_norm".into(),
            Kernel::Rope => "rope".into(),
            Kernel::KvStore => "kv_store".into(),
            Kernel::Attention => "attention".into(),
            Kernel::Swiglu => "swiglu".into(),
            Kernel::Gelu => "gelu".into(),
            Kernel::AddAssign => "add_assign".into(),
            Kernel::SampleSelect => "sample_select".into(),
            Kernel::SampleLogprobs => "sample_logprobs".into(),
        }
    }
}

/// Threads of a norm block (a multiple of 32, as `block_sum` needs): enough
/// to cover wide rows in few strides, few enough not to idle on narrow ones.
fn norm_threads(cols: usize) -> u32 {
    if cols >= 1024 {
        512
    } else if cols >= 256 {
        256
    } else {
        64
    }
}

/// The scalar arguments of `sample_select`.
#[derive(Clone, Copy, Debug)]
pub struct SelectArgs {
    pub temperature: f32,
    pub penalty: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub uniform: f64,
    /// Fixed-point scale of the weights, a power of two with `n * scale <= 2^63`.
    pub scale: f64,
    pub greedy: bool,
}

/// From this many weight rows on, `matmul` uses `mvw_*` (a warp per row)
/// rather than `mv_*` (a block per row) for short x.
pub const MV_WARP_MIN_ROWS: usize = 4096;

/// The loaded kernels of one context.
pub struct Kernels {
    funcs: HashMap<Kernel, CudaFunction>,
    mv_warp_min_rows: AtomicUsize,
    sm_count: usize,
}

fn launch_error(k: Kernel, e: cudarc::driver::DriverError) -> BackendError {
    BackendError::KernelLaunchFailed(format!("launching {}: {e:?}", k.symbol()))
}

/// M0-W-1431: the checks every launcher makes before it queues anything, so
/// that a bad call is a typed error rather than a launch that reads or
/// writes outside a buffer. Each `int` argument of the kernel must lie in
/// `1..=i32::MAX` (zero rows or columns are refused, not launched as empty
/// grids), and each required buffer must not be null. Buffer sizes are
/// checked one level up, in `ops.rs`, where the buffers are known.
pub fn check_args(k: Kernel, ints: &[(&str, usize)], ptrs: &[(&str, CUdeviceptr)]) -> Result<(), BackendError> {
    for &(name, v) in ints {
        if v == 0 {
            return Err(BackendError::InferenceFailed(format!("{}: {name} is zero; nothing is launched", k.symbol())));
        }
        if v > i32::MAX as usize {
            return Err(BackendError::InferenceFailed(format!("{}: {name} = {v} exceeds the kernel's int range", k.symbol())));
        }
    }
    if let Some((name, _)) = ptrs.iter().find(|(_, p)| *p == 0) {
        return Err(BackendError::InferenceFailed(format!("{}: buffer {name} is null", k.symbol())));
    }
    Ok(())
}

/// One thread per element in blocks of `block`; zero elements are refused.
fn grid_1d(n: u64, block: u32) -> Result<LaunchConfig, BackendError> {
    if n == 0 {
        return Err(BackendError::InferenceFailed("a launch over zero elements".into()));
    }
    let blocks = n.div_ceil(block as u64);
    let blocks = u32::try_from(blocks)
        .map_err(|_| BackendError::InferenceFailed(format!("{n} elements exceed one launch")))?;
    Ok(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 })
}

impl Kernels {
    /// Compiles (or takes from the disk cache) every module for `arch`, loads
    /// it into `ctx` and looks up every kernel. Modules compile in parallel.
    pub fn load(ctx: &Arc<CudaContext>, arch: (i32, i32)) -> Result<Kernels, BackendError> {
        let cache = KernelCache::from_env();
        type Image = Result<(Module, Vec<u8>, bool), BackendError>;
        let images: Vec<Image> = std::thread::scope(|s| {
            let handles: Vec<_> = Module::ALL
                .iter()
                .map(|&m| {
                    let cache = &cache;
                    s.spawn(move || cache.load_or_compile(m, arch).map(|(img, hit)| (m, img, hit)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("compile thread panicked")).collect()
        });
        let mut modules = HashMap::new();
        for r in images {
            let (m, image, from_cache) = r?;
            let loaded = match ctx.load_module(Ptx::from_binary(image)) {
                Ok(module) => module,
                Err(e) if from_cache => {
                    // A stale or damaged cache entry: compile afresh.
                    tracing::warn!(module = m.file_name(), error = ?e, "cached kernels did not load; recompiling");
                    let image = crate::backend::cuda::nvrtc::compile_module(m, arch)?;
                    cache.put(m, arch, &image);
                    ctx.load_module(Ptx::from_binary(image))
                        .map_err(|e| BackendError::KernelLaunchFailed(format!("loading {}: {e:?}", m.file_name())))?
                }
                Err(e) => {
                    return Err(BackendError::KernelLaunchFailed(format!("loading {}: {e:?}", m.file_name())))
                }
            };
            modules.insert(m, loaded);
        }
        let mut funcs = HashMap::new();
        for k in Kernel::all() {
            let f = modules[&k.module()].load_function(&k.symbol()).map_err(|e| {
                BackendError::KernelLaunchFailed(format!("{} has no kernel {}: {e:?}", k.module().file_name(), k.symbol()))
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

    fn func(&self, k: Kernel) -> &CudaFunction {
        &self.funcs[&k]
    }

    /// `embed_<ty>`: `out[t] = decode(table[tokens[t]])`.
    /// - `table`: `rows` rows of `row_bytes` bytes, each `cols` values of `ty`
    /// - `tokens`: `[n]` u32, each `< rows` (checked by the caller; the kernel writes zeros otherwise)
    /// - `out`: `[n, cols]` f32
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &self,
        s: &Arc<CudaStream>,
        ty: GgmlType,
        table: CUdeviceptr,
        row_bytes: usize,
        rows: usize,
        cols: usize,
        tokens: CUdeviceptr,
        n: usize,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let k = Kernel::Embed(ty);
        let dims = [("rows", rows), ("cols", cols), ("n", n), ("row_bytes", row_bytes)];
        check_args(k, &dims, &[("table", table), ("tokens", tokens), ("out", out)])?;
        let (row_bytes, rows, cols, n_) = (row_bytes as i64, rows as i32, cols as i32, n as i32);
        let cfg = LaunchConfig { grid_dim: (n as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(self.func(k));
        b.arg(&table).arg(&row_bytes).arg(&rows).arg(&cols).arg(&tokens).arg(&n_).arg(&out);
        // SAFETY: argument types match the kernel's signature; sizes checked by the caller.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r])`: `mv_<ty>` (or
    /// `mvw_<ty>` from [`MV_WARP_MIN_ROWS`] rows on) over
    /// groups of up to [`MV_MAX_TOKENS`] rows of x when `n <= MV_LOOP_MAX_TOKENS`,
    /// or `n <= MV_LOOP_SMALL_GRID_MAX_TOKENS` and `gemm_<ty>` would not fill
    /// the GPU (short prompts: a block per weight row keeps every SM busy, and
    /// the weights stay in L2 between groups), else `gemm_<ty>`.
    /// - `w`: `rows` rows of `row_bytes` bytes, each `cols` values of `ty`
    /// - `x`: `[n, cols]` f32
    /// - `bias`: `[rows]` f32, or 0 for none
    /// - `out`: `[n, rows]` f32, not overlapping `x`
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        s: &Arc<CudaStream>,
        ty: GgmlType,
        w: CUdeviceptr,
        row_bytes: usize,
        rows: usize,
        cols: usize,
        x: CUdeviceptr,
        n: usize,
        bias: CUdeviceptr,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let dims = [("rows", rows), ("cols", cols), ("n", n), ("row_bytes", row_bytes)];
        check_args(Kernel::Gemm(ty), &dims, &[("w", w), ("x", x), ("out", out)])?;
        let gemm_blocks = rows.div_ceil(GEMM_TILE as usize) * n.div_ceil(GEMM_TILE as usize);
        let few_tiles = n <= MV_LOOP_SMALL_GRID_MAX_TOKENS && gemm_blocks < self.sm_count;
        if n > MV_MAX_TOKENS && (n <= MV_LOOP_MAX_TOKENS || few_tiles) {
            for t0 in (0..n).step_by(MV_MAX_TOKENS) {
                let group = MV_MAX_TOKENS.min(n - t0);
                let (xg, og) = (x + (t0 * cols * 4) as u64, out + (t0 * rows * 4) as u64);
                self.matmul(s, ty, w, row_bytes, rows, cols, xg, group, bias, og)?;
            }
            return Ok(());
        }
        let (k, cfg) = if n <= MV_MAX_TOKENS && rows >= self.mv_warp_min_rows.load(Ordering::Relaxed) {
            let blocks = (rows as u32).div_ceil(MV_THREADS / 32);
            (
                Kernel::MatVecWarp(ty),
                LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (MV_THREADS, 1, 1), shared_mem_bytes: 0 },
            )
        } else if n <= MV_MAX_TOKENS {
            let blocks = rows as u32;
            (
                Kernel::MatVec(ty),
                LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (MV_THREADS, 1, 1), shared_mem_bytes: 0 },
            )
        } else {
            let gy = (n as u32).div_ceil(GEMM_TILE);
            if gy > 65535 {
                return Err(BackendError::InferenceFailed(format!("{n} rows exceed one matmul launch")));
            }
            (
                Kernel::Gemm(ty),
                LaunchConfig {
                    grid_dim: ((rows as u32).div_ceil(GEMM_TILE), gy, 1),
                    block_dim: (GEMM_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                },
            )
        };
        let (row_bytes, rows, cols, n) = (row_bytes as i64, rows as i32, cols as i32, n as i32);
        let mut b = s.launch_builder(self.func(k));
        b.arg(&w).arg(&row_bytes).arg(&rows).arg(&cols).arg(&x).arg(&n).arg(&bias).arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `rms_norm`: `out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w`.
    /// - `x`, `out`: `[rows, cols]` f32 (may not overlap)
    /// - `w`: `[cols]` f32
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        s: &Arc<CudaStream>,
        x: CUdeviceptr,
        w: CUdeviceptr,
        rows: usize,
        cols: usize,
        eps: f32,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let k = Kernel::RmsNorm;
        check_args(k, &[("rows", rows), ("cols", cols)], &[("x", x), ("w", w), ("out", out)])?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (norm_threads(cols), 1, 1), shared_mem_bytes: 0 };
        let (cols, rows) = (cols as i32, rows as i32);
        let mut b = s.launch_builder(self.func(k));
        b.arg(&x).arg(&w).arg(&cols).arg(&eps).arg(&rows).arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `layer_norm`: `out[t] = (x[t] - mean) / sqrt(var + eps) * w + b`, the
    /// mean and variance over row `t`.
    /// - `x`, `out`: `[rows, cols]` f32 (may not overlap)
    /// - `w`: `[cols]` f32; `b`: `[cols]` f32, or 0 for none
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        s: &Arc<CudaStream>,
        x: CUdeviceptr,
        w: CUdeviceptr,
        b: CUdeviceptr,
        rows: usize,
        cols: usize,
        eps: f32,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let k = Kernel::LayerNorm;
        check_args(k, &[("rows", rows), ("cols", cols)], &[("x", x), ("w", w), ("out", out)])?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (norm_threads(cols), 1, 1), shared_mem_bytes: 0 };
        let (cols, rows) = (cols as i32, rows as i32);
        let mut lb = s.launch_builder(self.func(k));
        lb.arg(&x).arg(&w).arg(&b).arg(&cols).arg(&eps).arg(&rows).arg(&out);
        // SAFETY: as for `embed`.
        unsafe { lb.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `rope`, in place: rotates dims `0..n_rot` of every head of every row;
    /// row `t` is at position `start_pos + t`.
    /// - `x`: `[rows, n_head * head_dim]` f32
    /// - `style`: 0 adjacent pairs (normal), 1 halves (NEOX)
    /// - `pos_ptr`: 0, or a device i32 that replaces `start_pos` (graph replay)
    /// - `inv_freq`: 0, or `[n_rot / 2]` f64 `freq_base^(-2i / n_rot)`
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        s: &Arc<CudaStream>,
        x: CUdeviceptr,
        rows: usize,
        n_head: usize,
        head_dim: usize,
        n_rot: usize,
        start_pos: usize,
        pos_ptr: CUdeviceptr,
        inv_freq: CUdeviceptr,
        freq_base: f32,
        freq_scale: f32,
        style: i32,
    ) -> Result<(), BackendError> {
        let k = Kernel::Rope;
        check_args(k, &[("rows", rows), ("n_head", n_head), ("head_dim", head_dim), ("n_rot", n_rot)], &[("x", x)])?;
        if !n_rot.is_multiple_of(2) || n_rot > head_dim {
            return Err(BackendError::InferenceFailed(format!("rope: {n_rot} rotated dims of a {head_dim}-dim head")));
        }
        let cfg = grid_1d((rows * n_head * (n_rot / 2)) as u64, 256)?;
        let (rows, n_head, head_dim, n_rot, start_pos) =
            (rows as i32, n_head as i32, head_dim as i32, n_rot as i32, start_pos as i32);
        let mut b = s.launch_builder(self.func(k));
        b.arg(&x).arg(&rows).arg(&n_head).arg(&head_dim).arg(&n_rot).arg(&start_pos).arg(&pos_ptr).arg(&inv_freq).arg(&freq_base).arg(&freq_scale).arg(&style);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `kv_store`: writes K and V rows into one layer's cache planes as f16.
    /// - `k`, `v`: `[n, n_head_kv * head_dim]` f32
    /// - `k_cache`, `v_cache`: `[n_head_kv, capacity, head_dim]` f16; rows go
    ///   to positions `start_pos..start_pos + n` (`<= capacity`, checked by the caller)
    /// - `pos_ptr`: 0, or a device i32 that replaces `start_pos` (graph replay)
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &self,
        s: &Arc<CudaStream>,
        k: CUdeviceptr,
        v: CUdeviceptr,
        n: usize,
        n_head_kv: usize,
        head_dim: usize,
        start_pos: usize,
        pos_ptr: CUdeviceptr,
        capacity: usize,
        k_cache: CUdeviceptr,
        v_cache: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let kern = Kernel::KvStore;
        check_args(
            kern,
            &[("n", n), ("n_head_kv", n_head_kv), ("head_dim", head_dim), ("capacity", capacity)],
            &[("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)],
        )?;
        if pos_ptr == 0 && start_pos + n > capacity {
            return Err(BackendError::InferenceFailed(format!("kv_store: positions {start_pos}..{} of {capacity}", start_pos + n)));
        }
        let cfg = grid_1d((n * n_head_kv * head_dim) as u64, 256)?;
        let (n, n_head_kv, head_dim, start_pos, capacity) =
            (n as i32, n_head_kv as i32, head_dim as i32, start_pos as i32, capacity as i32);
        let mut b = s.launch_builder(self.func(kern));
        b.arg(&k).arg(&v).arg(&n).arg(&n_head_kv).arg(&head_dim).arg(&start_pos).arg(&pos_ptr).arg(&capacity).arg(&k_cache).arg(&v_cache);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(kern, e))
    }

    /// `attention`: causal GQA of each query row over the cache.
    /// - `q`: `[n, n_head * head_dim]` f32, row `t` at position `start_pos + t`
    /// - `k_cache`, `v_cache`: `[n_head_kv, capacity, head_dim]` f16, filled
    ///   up to `start_pos + n`
    /// - `out`: `[n, n_head * head_dim]` f32
    /// - `head_dim <= ATT_MAX_HEAD_DIM`, `n_head % n_head_kv == 0`
    /// - `pos_ptr`: 0, or a device i32 that replaces `start_pos` (graph replay)
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        s: &Arc<CudaStream>,
        q: CUdeviceptr,
        n: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        start_pos: usize,
        pos_ptr: CUdeviceptr,
        capacity: usize,
        k_cache: CUdeviceptr,
        v_cache: CUdeviceptr,
        scale: f32,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let kern = Kernel::Attention;
        check_args(
            kern,
            &[("n", n), ("n_head", n_head), ("n_head_kv", n_head_kv), ("head_dim", head_dim), ("capacity", capacity)],
            &[("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)],
        )?;
        if head_dim > ATT_MAX_HEAD_DIM || !n_head.is_multiple_of(n_head_kv) {
            return Err(BackendError::InferenceFailed(format!("attention: {n_head}/{n_head_kv} heads of {head_dim}")));
        }
        if pos_ptr == 0 && start_pos + n > capacity {
            return Err(BackendError::InferenceFailed(format!("attention: positions {start_pos}..{} of {capacity}", start_pos + n)));
        }
        if n > 65535 * 1024 || n_head > 65535 {
            return Err(BackendError::InferenceFailed("attention shape exceeds one launch".into()));
        }
        let cfg = LaunchConfig { grid_dim: (n as u32, n_head as u32, 1), block_dim: (ATT_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (n, n_head, n_head_kv, head_dim, start_pos, capacity) =
            (n as i32, n_head as i32, n_head_kv as i32, head_dim as i32, start_pos as i32, capacity as i32);
        let mut b = s.launch_builder(self.func(kern));
        b.arg(&q)
            .arg(&n)
            .arg(&n_head)
            .arg(&n_head_kv)
            .arg(&head_dim)
            .arg(&start_pos)
            .arg(&pos_ptr)
            .arg(&capacity)
            .arg(&k_cache)
            .arg(&v_cache)
            .arg(&scale)
            .arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(kern, e))
    }

    /// `swiglu`: `out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]`.
    /// - `gate`, `up`, `out`: `[len]` f32
    pub fn swiglu(&self, s: &Arc<CudaStream>, gate: CUdeviceptr, up: CUdeviceptr, len: usize, out: CUdeviceptr) -> Result<(), BackendError> {
        let k = Kernel::Swiglu;
        check_args(k, &[], &[("gate", gate), ("up", up), ("out", out)])?;
        let cfg = grid_1d(len as u64, 256)?;
        let len = len as i64;
        let mut b = s.launch_builder(self.func(k));
        b.arg(&gate).arg(&up).arg(&len).arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `gelu`: `out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, `x = x[i]`.
    /// - `x`, `out`: `[len]` f32 (may be the same buffer)
    pub fn gelu(&self, s: &Arc<CudaStream>, x: CUdeviceptr, len: usize, out: CUdeviceptr) -> Result<(), BackendError> {
        let k = Kernel::Gelu;
        check_args(k, &[], &[("x", x), ("out", out)])?;
        let cfg = grid_1d(len as u64, 256)?;
        let len = len as i64;
        let mut b = s.launch_builder(self.func(k));
        b.arg(&x).arg(&len).arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `add_assign`: `x[i] += y[i]`.
    /// - `x`, `y`: `[len]` f32
    pub fn add_assign(&self, s: &Arc<CudaStream>, x: CUdeviceptr, y: CUdeviceptr, len: usize) -> Result<(), BackendError> {
        let k = Kernel::AddAssign;
        check_args(k, &[], &[("x", x), ("y", y)])?;
        let cfg = grid_1d(len as u64, 256)?;
        let len = len as i64;
        let mut b = s.launch_builder(self.func(k));
        b.arg(&x).arg(&y).arg(&len);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `sample_select`: picks one token from `n` logits by the sampling
    /// pipeline (one block; see sample.cu for the algorithm).
    /// - `logits`: `[n]` f32; `keys`: `[n]` u32 scratch
    /// - `pen_ids`: `[n_pen]` u32, distinct ids `< n` to penalize (`n_pen` 0: no penalty)
    /// - `p.top_k`: 0 or `0 < top_k < n`; `p.uniform`: in `[0, 1)`, unused when `p.greedy`
    /// - `out`: `[SAMPLE_OUT_WORDS]` u32; word 0 receives the id
    #[allow(clippy::too_many_arguments)]
    pub fn sample_select(
        &self,
        s: &Arc<CudaStream>,
        logits: CUdeviceptr,
        n: u32,
        keys: CUdeviceptr,
        pen_ids: CUdeviceptr,
        n_pen: u32,
        p: &SelectArgs,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let k = Kernel::SampleSelect;
        check_args(k, &[("n", n as usize)], &[("logits", logits), ("keys", keys), ("out", out)])?;
        if n_pen > 0 && pen_ids == 0 {
            return Err(BackendError::InferenceFailed(format!("{}: buffer pen_ids is null", k.symbol())));
        }
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (SAMPLE_THREADS, 1, 1), shared_mem_bytes: 0 };
        let greedy = i32::from(p.greedy);
        let mut b = s.launch_builder(self.func(k));
        b.arg(&logits)
            .arg(&n)
            .arg(&keys)
            .arg(&pen_ids)
            .arg(&n_pen)
            .arg(&p.temperature)
            .arg(&p.penalty)
            .arg(&p.top_k)
            .arg(&p.top_p)
            .arg(&p.min_p)
            .arg(&p.uniform)
            .arg(&p.scale)
            .arg(&greedy)
            .arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }

    /// `sample_logprobs`: the `k` most likely of `n` logits, unordered, with
    /// the max and log-sum-exp for their log-softmax (one block).
    /// - `logits`: `[n]` f32; `keys`: `[n]` u32 scratch
    /// - `0 < k <= SAMPLE_MAX_LOGPROBS`
    /// - `out`: `[SAMPLE_OUT_WORDS]` u32, 8-byte aligned; words 1.. receive the result
    #[allow(clippy::too_many_arguments)]
    pub fn sample_logprobs(
        &self,
        s: &Arc<CudaStream>,
        logits: CUdeviceptr,
        n: u32,
        keys: CUdeviceptr,
        k_top: u32,
        out: CUdeviceptr,
    ) -> Result<(), BackendError> {
        let k = Kernel::SampleLogprobs;
        check_args(k, &[("n", n as usize), ("k", k_top as usize)], &[("logits", logits), ("keys", keys), ("out", out)])?;
        if k_top as usize > SAMPLE_MAX_LOGPROBS {
            return Err(BackendError::InferenceFailed(format!("{}: k = {k_top} exceeds {SAMPLE_MAX_LOGPROBS}", k.symbol())));
        }
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (SAMPLE_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut b = s.launch_builder(self.func(k));
        b.arg(&logits).arg(&n).arg(&keys).arg(&k_top).arg(&out);
        // SAFETY: as for `embed`.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| launch_error(k, e))
    }
}
