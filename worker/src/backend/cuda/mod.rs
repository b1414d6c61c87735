//! The CUDA backend: one NVIDIA GPU through the driver API (cudarc, loaded at
//! run time), kernels from `cuda/*.cu` compiled by NVRTC.
//!
//! It mirrors the CPU reference backend (`backend::cpu`): the same
//! `model::forward` graph runs over [`CudaOps`]. Weights sit in VRAM in their
//! stored GGUF format (M0-W-1201) and are decoded inside the kernels; the KV
//! cache is f16. Each forward pass leaves its last position's logits on the
//! device, where `Backend::sample` picks the next token with the sampling
//! kernels (`sample`); logits reach the host only when asked for.
//!
//! Nothing outside this module uses cudarc (M0-W-1050).
//!
//! Kernels, with imports running one way: `source` (the embedded `.cu`
//! modules, headers and the constants Rust and CUDA share) ← `nvrtc`
//! (compiles them, disk cache) ← `kernels` (loads them; the one generic
//! launcher). `ptr` (typed device pointers) ← `launch` (kernel names, the
//! M0-W-1431 argument checks, launch geometry, the `KernelCall` trait) ←
//! `args` (one argument struct per kernel). `ops` and `sample` build those
//! structs from shapes they have checked.
//!
//! Memory (M0-SYS-2.2.1, M0-W-1011/1020/1021): before any weight is
//! allocated, the bytes needed (weights, the minimum KV cache, decode scratch)
//! are compared with the free memory (and the test cap
//! `WORKER_ORCD_VRAM_CAP_BYTES`); a shortfall is `OutOfMemory`. A sequence's
//! KV cache is allocated by `open` and freed by `close`;
//! activations come from the stream-ordered pool and are freed as each step
//! ends, so after a job the memory in use is back at its post-load value.

mod blas;
mod device;
pub mod fault;
mod graph;
mod kernels;
mod kv_memory;
mod kv_pool;
mod load;
mod nvrtc;
mod ops;
mod prefix;
mod ptr;
mod sample;
mod source;
mod steps;
mod upload;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use device::{align_up, ContextLimits, CudaDevice, MemoryKind, VRAM_CAP_ENV};
pub use kernels::{Kernel, RowSeq};
#[cfg(test)]
use load::{device_block_bytes, device_bytes, host_mapped_buffer};
pub use nvrtc::{
    compile_here, compile_in_processes, compile_source, compile_unit, nvrtc_available, KernelCache,
    KERNEL_CACHE_ENV, NVRTC_PROCESSES_ENV,
};
pub use ops::{CudaBuf, CudaCache, CudaOps, CudaWeight, RowsPass};
pub use sample::DeviceSampler;
pub use source::{KernelSet, Module, Unit, HEADERS};
pub use upload::UploadStats;

use crate::backend::prefix::{PrefixCache, Trail};
use crate::backend::{
    check_capacity, check_prefix_share, decode_one_by_one, Backend, BackendError, Checkpoints,
    DeviceInfo, KvBlocks, KvLayout, KvType, Logits, MemoryUse, PrefixStats, SampleRequest,
    SampledToken, SeqId, Slots,
};
use crate::gguf::GgufFile;
use crate::model::ModelConfig;
use crate::model::{self, Weights};
use crate::quant::{self, GgmlType};
use device::{memory_type, Purpose};

/// Positions of KV cache that must fit at load time besides the weights
/// (the "minimum KV cache" of M0-W-1020), unless the context is shorter.
pub const MIN_KV_POSITIONS: usize = 256;

/// Prompt tokens per prefill pass on the GPU (see `prefill_chunk`).
pub const PREFILL_CHUNK_GPU: usize = 512;

/// Test-only (M0-W-1012): when set, the load adds a host-mapped buffer to the
/// buffers the residency check asks about, so the check fails.
pub const TEST_HOST_MAPPED_WEIGHT_ENV: &str = "WORKER_ORCD_TEST_HOST_MAPPED_WEIGHT";

/// Set to `0` to run decode steps without CUDA graphs (for comparisons).
pub const CUDA_GRAPHS_ENV: &str = "WORKER_ORCD_CUDA_GRAPHS";

/// How to set up the backend.
#[derive(Clone, Debug)]
pub struct CudaLoadOptions {
    pub gpu_device: usize,
    /// Upper bound on one sequence's KV cache in MiB; `None`: no bound beyond the context.
    pub kv_cache_size_mb: Option<u64>,
    /// Host-to-device copy chunk in bytes (M0-W-1222).
    pub upload_chunk_bytes: usize,
    /// Test-only cap on device memory; `None`: `WORKER_ORCD_VRAM_CAP_BYTES` if set.
    pub vram_cap_bytes: Option<u64>,
    /// The KV cache's type (`--kv-type`).
    pub kv_type: KvType,
}

impl Default for CudaLoadOptions {
    fn default() -> Self {
        CudaLoadOptions {
            gpu_device: 0,
            kv_cache_size_mb: None,
            upload_chunk_bytes: 1 << 20,
            vram_cap_bytes: None,
            kv_type: KvType::F16,
        }
    }
}

/// One weight's device block: the tensor it holds, its address (a multiple
/// of 256, M0-W-1220) and its size as allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightBuffer {
    pub name: String,
    pub ptr: u64,
    pub bytes: u64,
}

/// Pinned host memory mapped into the device's address space: a buffer the
/// residency check must reject (test hook only).
struct HostMapped {
    host: *mut std::ffi::c_void,
    dptr: u64,
}

/// The GPU backend with a model loaded.
pub struct CudaBackend {
    cfg: ModelConfig,
    dev: Arc<CudaDevice>,
    ops: CudaOps,
    weights: Weights<CudaWeight>,
    /// Every weight buffer, by tensor name, for the residency check.
    weight_bufs: Vec<WeightBuffer>,
    host_mapped: Option<HostMapped>,
    /// The open sequences ([`Backend::set_max_sequences`] of them at most).
    seqs: Slots<CudaSlot>,
    kv_limit_bytes: Option<u64>,
    /// The paged KV pool the caches come from (more than one sequence).
    kv_pool: Option<kv_pool::KvPool>,
    upload_stats: UploadStats,
    graph_host: graph::GraphHost,
    use_graphs: bool,
    /// `sample`'s scratch for a batched step's rows and masks.
    sample_tables: sample::SampleTables,
    /// Batched decode steps' graphs (`decode`).
    rows_graphs: graph::RowsGraphs,
    /// Prompts' whole chunks, each a cache of its own on blocks of the pool
    /// (`backend::prefix`).
    prefix: Option<PrefixCache<CudaCache>>,
    /// Its share of the pool.
    prefix_share: Option<f64>,
}

/// One sequence: its KV cache, position, captured decode step and logits.
struct CudaSlot {
    cache: Option<CudaCache>,
    len: usize,
    /// The sequence's captured decode step.
    decode_graph: Option<graph::DecodeGraph>,
    /// Capture failed in this sequence; decode runs eagerly.
    graph_failed: bool,
    /// Holds the last forward pass's last-position logits and samples from them.
    sampler: DeviceSampler,
    /// A forward pass of the sequence has left logits in `sampler`.
    has_logits: bool,
    /// Where it stands with the prefix cache.
    trail: Trail,
}

impl CudaSlot {
    fn new(dev: &Arc<CudaDevice>, vocab: usize) -> Result<Self, BackendError> {
        Ok(CudaSlot {
            cache: None,
            len: 0,
            decode_graph: None,
            graph_failed: false,
            sampler: DeviceSampler::new(dev, vocab)?,
            has_logits: false,
            trail: Trail::new(),
        })
    }

    /// Frees the sequence's graph and KV cache; the sampler stays.
    fn end(&mut self) {
        self.decode_graph = None;
        self.graph_failed = false;
        self.cache = None;
        self.len = 0;
        self.has_logits = false;
        self.trail = Trail::new();
    }
}

// SAFETY: the only non-Send field is the test hook's host pointer, which is
// owned by the backend and only freed in Drop.
unsafe impl Send for CudaBackend {}

impl CudaBackend {
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn cuda_device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// What the weight upload did (copies, largest copy, bytes).
    pub fn upload_stats(&self) -> UploadStats {
        self.upload_stats
    }

    /// Every weight buffer: tensor name, device address and size.
    pub fn weight_buffers(&self) -> &[WeightBuffer] {
        &self.weight_bufs
    }

    pub fn weights(&self) -> &Weights<CudaWeight> {
        &self.weights
    }

    /// `seq`'s KV cache.
    pub fn cache(&self, seq: SeqId) -> Result<&CudaCache, BackendError> {
        let slot = self.seqs.get(seq)?;
        Ok(slot.cache.as_ref().expect("an open sequence has a cache"))
    }

    /// Whether decode steps batch their rows (`decode` in rows mode): with
    /// room for more than one sequence, whatever the step's row count, so
    /// that a row's bits never depend on how many share its step.
    fn batches(&self) -> bool {
        self.seqs.capacity() > 1 && self.cfg.moe.is_none()
    }

    /// Whether `seq` can take `token` as one more position.
    fn check_decode(&self, seq: SeqId, token: u32) -> Result<(), BackendError> {
        let s = self.seqs.get(seq)?;
        let cache = s.cache.as_ref().expect("an open sequence has a cache");
        if s.len + 1 > cache.capacity {
            return Err(BackendError::InferenceFailed(format!(
                "KV cache holds {} positions, {} needed",
                cache.capacity,
                s.len + 1
            )));
        }
        if token as usize >= self.cfg.vocab_size {
            return Err(BackendError::InferenceFailed(format!(
                "token id {token} is outside the vocabulary ({})",
                self.cfg.vocab_size
            )));
        }
        Ok(())
    }

    /// Whether decode steps replay a captured CUDA graph (default on; off
    /// with `WORKER_ORCD_CUDA_GRAPHS=0`). Takes effect at the next sequence.
    pub fn set_decode_graphs(&mut self, on: bool) {
        self.use_graphs = on;
    }

    /// Whether `seq` decodes through a captured graph.
    pub fn decoding_with_graph(&self, seq: SeqId) -> bool {
        self.seqs.get(seq).is_ok_and(|s| s.decode_graph.is_some())
    }

    /// `seq`'s sampler, whose logits buffer its forward passes write (for
    /// tests that sample from logits of their own).
    pub fn sampler(&mut self, seq: SeqId) -> Result<&mut DeviceSampler, BackendError> {
        Ok(&mut self.seqs.get_mut(seq)?.sampler)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Some(h) = self.host_mapped.take() {
            if self.dev.bind().is_ok() {
                // SAFETY: allocated by `host_mapped_buffer`, freed once.
                unsafe { cudarc::driver::sys::cuMemFreeHost(h.host) };
            }
        }
        // M0-W-1401: let queued work finish before buffers are freed.
        if let Err(e) = self.dev.synchronize() {
            tracing::error!(error = %e, "synchronizing before teardown failed");
        }
        // M0-SYS-2.5.1: a backend dropped in mid-sequence releases the
        // sequence's graph and KV cache, and the activation memory its steps
        // left in the stream-ordered pool goes back to the driver (the pool
        // keeps freed blocks between steps). The weights are freed after
        // this, as the fields drop.
        for slot in self.seqs.states_mut() {
            slot.end();
        }
        if let Err(e) = self.dev.trim_pool() {
            tracing::error!(error = %e, "returning scratch memory failed");
        }
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> &DeviceInfo {
        self.dev.info()
    }

    fn max_sequences(&self) -> usize {
        self.seqs.capacity()
    }

    /// Each sequence has its own sampler (its logits buffer and scratch,
    /// counted at load as the first one's is); more than one share the
    /// paged KV pool and batched decode steps.
    fn set_max_sequences(&mut self, n: usize) -> Result<(), BackendError> {
        self.dev.bind()?;
        let (dev, vocab) = (self.dev.clone(), self.cfg.vocab_size);
        self.seqs.resize(n, || CudaSlot::new(&dev, vocab))?;
        // Batched steps' graphs hold the table and x8 block of the old count.
        self.rows_graphs.clear();
        self.ops
            .reserve_rows(n.next_multiple_of(graph::ROWS_GRAPH_STEP))?;
        self.sample_tables.reserve(&dev, n, vocab)?;
        // The cache's entries are blocks of the old pool: they go first.
        self.prefix = None;
        self.kv_pool = None;
        self.check_context_fits()?;
        if n > 1 {
            self.kv_pool = Some(self.make_kv_pool(n, 0)?);
        }
        self.set_prefix_cache(self.prefix_share)
    }

    /// See `prefix.rs` (`make_prefix_cache`): the entries are blocks of the
    /// paged pool, made for one sequence too.
    fn set_prefix_cache(&mut self, max_share: Option<f64>) -> Result<(), BackendError> {
        if self.seqs.any_open() {
            return Err(BackendError::CallerBug(
                "the prefix cache is set up only while no sequence is open".into(),
            ));
        }
        self.prefix = None;
        self.prefix_share = max_share;
        let Some(share) = max_share else {
            return Ok(());
        };
        check_prefix_share(share)?;
        self.make_prefix_cache(share);
        Ok(())
    }

    /// Copies the cached chunks `prompt` starts with into `seq`'s cache.
    fn attach_prefix(&mut self, seq: SeqId, prompt: &[u32]) -> Result<usize, BackendError> {
        let slot = self.seqs.get_mut(seq)?;
        let Some(prefix) = self.prefix.as_mut() else {
            return Ok(0);
        };
        let cache = slot.cache.as_mut().expect("an open sequence has a cache");
        let dev = &self.dev;
        let a = prefix.attach(slot.len, prompt, |at, part, n| {
            cache.copy_positions(dev, part, 0, at, n)
        })?;
        (slot.trail, slot.len) = (a.trail, a.len);
        if let Some(logits) = a.logits {
            slot.sampler.upload_logits(&logits)?;
            slot.has_logits = true;
        }
        Ok(a.len)
    }

    fn prefix_stats(&self) -> Option<PrefixStats> {
        self.prefix.as_ref().map(|p| p.stats())
    }

    fn open(&mut self, capacity: usize) -> Result<SeqId, BackendError> {
        check_capacity(capacity, self.cfg.context_length)?;
        self.kv_budget(capacity)?;
        self.evict_for(self.kv_bytes(capacity));
        let cfg = &self.cfg;
        let cache = CudaCache::new_in(
            &self.dev,
            self.kv_pool.as_ref(),
            self.dev.kernels.kv_type(),
            cfg.n_layer,
            cfg.n_head_kv,
            cfg.head_dim,
            capacity,
        )?;
        let (id, slot) = self.seqs.open()?;
        slot.cache = Some(cache);
        slot.len = 0;
        Ok(id)
    }

    fn close(&mut self, seq: SeqId) {
        let Some(slot) = self.seqs.close(seq) else {
            return;
        };
        slot.end();
        // With no sequence open, batched steps' graphs go too (the device
        // memory in use goes back to its value after load).
        if !self.seqs.any_open() {
            self.rows_graphs.clear();
        }
        if let Err(e) = self.dev.trim_pool() {
            tracing::error!(error = %e, "returning scratch memory failed");
        }
    }

    fn len(&self, seq: SeqId) -> usize {
        self.seqs.get(seq).map_or(0, |s| s.len)
    }

    /// llama.cpp's micro-batch: 512 rows keep the GEMMs busy and a
    /// 500-token prompt is one pass rather than two (benches/results).
    fn prefill_chunk(&self) -> usize {
        PREFILL_CHUNK_GPU
    }

    /// The logits go to `seq`'s own sampler; a one-token step replays the
    /// sequence's captured graph where it can.
    fn forward(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError> {
        if logits == Logits::Rows {
            return Err(BackendError::CallerBug(
                "Logits::Rows belongs to decode".into(),
            ));
        }
        let use_graphs = self.use_graphs;
        let slot = self.seqs.get_mut(seq)?;
        slot.has_logits = false;
        let graph_step = use_graphs
            && !slot.graph_failed
            && tokens.len() == 1
            && logits != Logits::All
            && checkpoints.is_none();
        let kept = slot.sampler.logits_ptr();
        self.dev.bind()?;
        self.ops.keep_logits_in(kept, self.cfg.vocab_size);
        if graph_step {
            let host_out = if logits == Logits::None {
                out.clear();
                None
            } else {
                Some(&mut *out)
            };
            if self.decode_with_graph(seq, tokens[0], host_out)? {
                let slot = self.seqs.get_mut(seq)?;
                let start = slot.len;
                slot.len += 1;
                slot.has_logits = true;
                return self.publish(seq, start, tokens);
            }
        }
        let slot = self.seqs.get_mut(seq)?;
        let cache = slot.cache.as_mut().expect("an open sequence has a cache");
        let r = model::forward(
            &mut self.ops,
            &self.cfg,
            &self.weights,
            cache,
            tokens,
            slot.len,
            logits,
            out,
            checkpoints,
        );
        self.ops.end_step();
        r?;
        let start = slot.len;
        slot.len += tokens.len();
        slot.has_logits = true;
        self.publish(seq, start, tokens)
    }

    /// One unconstrained row alone from the slot's own sampler; several, or
    /// a constrained one, with one wait (`sample::sample_rows`, whose tables
    /// hold the masks). Both give the same bits.
    fn sample(
        &mut self,
        rows: &[(SeqId, SampleRequest<'_>)],
    ) -> Result<Vec<SampledToken>, BackendError> {
        let ids: Vec<SeqId> = rows.iter().map(|(id, _)| *id).collect();
        let slots = self.seqs.get_many_mut(&ids)?;
        let mut batch = Vec::with_capacity(rows.len());
        for ((id, req), s) in rows.iter().zip(slots) {
            if !s.has_logits {
                return Err(BackendError::CallerBug(format!(
                    "{id:?}: sample without logits: run forward first"
                )));
            }
            batch.push((&mut s.sampler, req));
        }
        if let [(sampler, req)] = batch.as_mut_slice() {
            if req.mask.is_none() {
                return Ok(vec![sampler.sample(req)?]);
            }
        }
        sample::sample_rows(&mut batch, &mut self.sample_tables)
    }

    /// A captured graph's replay is queued and not waited for: a batched
    /// step's, or each row's own once its sequence has captured one.
    fn queues_decode(&self, rows: &[(SeqId, u32)]) -> bool {
        if !self.use_graphs {
            return false;
        }
        if self.batches() {
            return !self.rows_graphs.failed;
        }
        rows.iter().all(|(id, _)| {
            self.seqs
                .get(*id)
                .is_ok_and(|s| s.decode_graph.is_some() && !s.graph_failed)
        })
    }

    /// Within `--kv-cache-size-mb` beside the open sequences' caches, and
    /// enough of the pool's blocks free.
    fn has_room(&self, capacity: usize) -> bool {
        let bytes = self.kv_bytes(capacity);
        let in_pool = |p: &kv_pool::KvPool| {
            let b = p.blocks();
            p.blocks_for(bytes) <= b.total - b.used + self.prefix_blocks()
        };
        self.kv_budget(capacity).is_ok() && self.kv_pool.as_ref().is_none_or(in_pool)
    }

    /// Blocks the prefix cache holds count as free: a job takes them back.
    fn kv_blocks(&self) -> Option<KvBlocks> {
        let cached = self.prefix_blocks();
        self.kv_pool.as_ref().map(|p| {
            let b = p.blocks();
            KvBlocks {
                used: b.used - cached,
                ..b
            }
        })
    }

    /// With room for one sequence, its one-token step (its own captured
    /// graph, the one-row kernels). With room for more, one forward pass over
    /// every row (`ops::RowsPass`) whatever their number: each weight read
    /// once for the step, each row's sums on kernels that do not depend on
    /// how many rows there are, each row's attention over its own cache; a
    /// row's logits are the same bits in any batch, one row alone included
    /// (they may differ in the last bits from the one-row kernels). A mixture
    /// of experts decodes its rows one by one.
    fn decode(&mut self, rows: &[(SeqId, u32)]) -> Result<(), BackendError> {
        if rows.is_empty() {
            return Ok(());
        }
        if !self.batches() {
            return decode_one_by_one(self, rows);
        }
        self.decode_batched(rows)
    }

    fn memory_use(&self) -> MemoryUse {
        self.dev.memory_use()
    }

    fn kv_layout(&self) -> KvLayout {
        let (cfg, kv_type) = (&self.cfg, self.dev.kernels.kv_type());
        KvLayout {
            kv_type,
            bytes_per_token: (cfg.n_layer * 2 * cfg.n_head_kv * kv_type.row_bytes(cfg.head_dim))
                as u64,
        }
    }

    /// A prompt of a whole prefill chunk (the products from cuBLAS and the
    /// tensor-core kernels, flash attention) and one decode step (its graph),
    /// then the sequence closes and the memory pool is trimmed as after any
    /// job. Without it the first long prompt after start took several times
    /// as long as the next ones (benches/results).
    fn warm_up(&mut self) -> Result<(), BackendError> {
        // Within --kv-cache-size-mb (and the pool): a shorter prompt if need be.
        let mut n = PREFILL_CHUNK_GPU.min(self.cfg.context_length.saturating_sub(1));
        while n > 0 && !self.has_room(n + 1) {
            n /= 2;
        }
        if n == 0 {
            return Ok(());
        }
        let vocab = self.cfg.vocab_size;
        let tokens: Vec<u32> = (0..n).map(|i| (i * 7 % vocab) as u32).collect();
        // Its made-up prompt is no one's prefix.
        let prefix = self.prefix.take();
        let r = self.open(n + 1).and_then(|seq| {
            let mut out = Vec::new();
            let r = self
                .forward(seq, &tokens, Logits::Last, &mut out, None)
                .and_then(|()| self.forward(seq, &tokens[..1], Logits::Last, &mut out, None))
                .and_then(|()| self.dev.synchronize());
            self.close(seq);
            r
        });
        self.prefix = prefix;
        r
    }

    fn check_residency(&self) -> Result<bool, BackendError> {
        self.dev.bind()?;
        let extra = self
            .host_mapped
            .as_ref()
            .map(|h| ("test-host-mapped".to_string(), h.dptr));
        let weights = self.weight_bufs.iter().map(|b| (b.name.clone(), b.ptr));
        for (name, ptr) in weights.chain(extra) {
            let kind = memory_type(ptr)?;
            if kind != MemoryKind::Device {
                tracing::error!(tensor = %name, ptr = format_args!("{ptr:#x}"), kind = ?kind, "weight buffer is not device memory");
                return Ok(false);
            }
        }
        Ok(true)
    }
}
