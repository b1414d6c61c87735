//! Decode steps replayed from a CUDA graph.
//!
//! A decode step (one token, last-position logits) launches a few hundred
//! small kernels; launched one by one, the host's launch cost dominates. So
//! the first decode step of a sequence is captured from the stream into a
//! graph (running the unchanged `model::forward` over `CudaOps` in capture
//! mode, see `ops::GraphCapture`), and every decode step, that one included,
//! replays it: the host writes the token id and position into pinned memory,
//! copies them to the step's device slot, launches the graph and waits for
//! it. The graph leaves the logits on the device, in the sampler's buffer
//! (sampling runs after the graph, outside it); only a caller that asks for
//! them gets them copied to pinned memory. The kernels are the same as in
//! eager mode, with the same launch shapes, so the logits are bit-identical.
//!
//! The graph holds the addresses of the weights, of this sequence's KV cache
//! and of its own activation arena, so it lives exactly as long as the
//! sequence.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys::{self, CUgraphExec};

use crate::backend::cuda::device::{align_up, driver_error, CudaDevice, DevBuf, Purpose};
use crate::backend::cuda::kernels::{most_splits, RowSeq};
use crate::backend::cuda::ops::{CudaCache, CudaOps, CudaWeight, GraphCapture, RowsPass};
use crate::backend::cuda::source::{ATS_MAX_SPLITS, GF_MAX_TOKENS};
use crate::backend::{BackendError, Logits};
use crate::model::ModelConfig;
use crate::model::{self, Weights};

/// Pinned host memory, freed on drop.
pub struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    dev: Arc<CudaDevice>,
}

impl Pinned {
    pub fn new(dev: &Arc<CudaDevice>, bytes: usize) -> Result<Self, BackendError> {
        dev.bind()?;
        // SAFETY: plain pinned allocation, freed in Drop.
        let ptr = unsafe { drv::malloc_host(bytes.max(1), 0) }
            .map_err(|e| driver_error("allocating pinned memory", e))? as *mut u8;
        Ok(Pinned {
            ptr,
            bytes,
            dev: dev.clone(),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // SAFETY: allocated in `new`; no queued copy uses it (every user
            // synchronizes before returning).
            unsafe { drv::free_host(self.ptr as *mut c_void) }.ok();
        }
    }
}

/// Writes a step's `[token, position]` into the slot at `at`, in stream order
/// and with no host buffer (a stream memory operation), so that a replay
/// need not wait for the one before it.
fn write_step(dev: &CudaDevice, at: u64, token: u32, position: i32) -> Result<(), BackendError> {
    let value = u64::from(token) | (u64::from(position as u32) << 32);
    // SAFETY: `at` is the 8-byte, 256-aligned step slot of a live arena
    // allocated on this stream's context.
    unsafe { sys::cuStreamWriteValue64_v2(dev.cu_stream(), at, value, 0) }
        .result()
        .map_err(|e| driver_error("writing the decode step", e))
}

/// Records what `queue` queues on `dev`'s stream into a graph and
/// instantiates it (`what`: for errors). The capture always ends, even
/// after an error, so that the stream is usable again.
fn record(
    dev: &CudaDevice,
    what: &str,
    queue: impl FnOnce() -> Result<(), BackendError>,
) -> Result<CUgraphExec, BackendError> {
    let stream = dev.cu_stream();
    // SAFETY: the stream is ours; every call until end_capture only queues work.
    let begun = unsafe {
        drv::stream::begin_capture(
            stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    };
    let recorded = begun
        .map_err(|e| driver_error("beginning a graph capture", e))
        .and_then(|()| queue());
    let graph = if begun.is_ok() {
        // SAFETY: ends the capture begun above.
        Some(unsafe { drv::stream::end_capture(stream) })
    } else {
        None
    };
    recorded?;
    let graph = graph
        .expect("capture began")
        .map_err(|e| driver_error("ending a graph capture", e))?;
    // SAFETY: `graph` is a valid captured graph, destroyed once instantiated.
    unsafe {
        let exec = drv::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0));
        drv::graph::destroy(graph).ok();
        exec.map_err(|e| driver_error(&format!("instantiating {what}"), e))
    }
}

/// Host-side buffers shared by every decode graph of a backend.
pub struct GraphHost {
    /// Receives `vocab_size` logits when the caller wants them on the host.
    logits: Pinned,
    vocab: usize,
}

// SAFETY: the pinned pointers are owned by this struct and only used by the
// thread that owns the backend.
unsafe impl Send for GraphHost {}

impl GraphHost {
    pub fn new(dev: &Arc<CudaDevice>, vocab: usize) -> Result<Self, BackendError> {
        Ok(GraphHost {
            logits: Pinned::new(dev, vocab * 4)?,
            vocab,
        })
    }
}

/// One sequence's captured decode step.
pub struct DecodeGraph {
    exec: CUgraphExec,
    /// Activations of the step, then the step's `[token, position]` slot.
    arena: DevBuf,
    step_offset: u64,
    /// Whether the step's attention is split over the context.
    pub split_attention: bool,
    dev: Arc<CudaDevice>,
}

// SAFETY: the graph handle is owned by this struct and used from one thread at a time.
unsafe impl Send for DecodeGraph {}

impl Drop for DecodeGraph {
    fn drop(&mut self) {
        if self.dev.bind().is_ok() {
            // A replay may still run (the caller's `sample` waits for it, and
            // an ended job may never sample again): let it end first, so that
            // the arena goes back with no kernel on it.
            self.dev.synchronize().ok();
            // SAFETY: no replay is in flight now.
            unsafe { drv::graph::exec_destroy(self.exec) }.ok();
        }
    }
}

/// Bytes of activations one decode step of `model::forward` allocates, with slack.
fn arena_bytes(cfg: &ModelConfig) -> u64 {
    let bufs = crate::model::step_buffers(cfg, 1);
    bufs.iter().map(|&n| align_up(n as u64 * 4)).sum::<u64>() + (64 << 10)
}

impl DecodeGraph {
    /// Captures one decode step of `model::forward` for the sequence whose
    /// cache is `cache`, with its attention split over the context or not.
    pub fn capture(
        ops: &mut CudaOps,
        cfg: &ModelConfig,
        weights: &Weights<CudaWeight>,
        cache: &mut CudaCache,
        split_attention: bool,
    ) -> Result<DecodeGraph, BackendError> {
        let dev = ops.dev.clone();
        dev.bind()?;
        // The split attention's chunk states, when it may be used.
        let part_floats = dev
            .kernels
            .context_split(cfg.n_head_kv, cache.capacity)
            .nsplit
            * cfg.n_head
            * (cfg.head_dim + 2);
        let step_offset = arena_bytes(cfg) + align_up(part_floats as u64 * 4);
        let arena = dev.alloc(Purpose::Scratch, step_offset + 256)?;
        // Where the device cannot take stream memory operations, no graph
        // (the backend decodes without one).
        write_step(&dev, arena.ptr() + step_offset, 0, 0)?;
        ops.capture = Some(GraphCapture {
            arena: arena.ptr(),
            arena_bytes: step_offset,
            arena_used: 0,
            step: arena.ptr() + step_offset,
            split_attention,
            split_part: None,
            temp: None,
        });
        let mut dummy = Vec::new();
        let exec = record(&dev, "the decode graph", || {
            model::forward(
                ops,
                cfg,
                weights,
                cache,
                &[0],
                0,
                Logits::None,
                &mut dummy,
                None,
            )
        });
        ops.capture = None;
        let exec = exec?;
        Ok(DecodeGraph {
            exec,
            arena,
            step_offset,
            split_attention,
            dev,
        })
    }

    /// Runs the step for `token` at `position`, which leaves the logits in
    /// `kept` (the device buffer of `[vocab]` f32 the graph was captured
    /// with), and copies them to `out` when given.
    pub fn replay(
        &self,
        host: &GraphHost,
        token: u32,
        position: usize,
        kept: u64,
        out: Option<&mut Vec<f32>>,
    ) -> Result<(), BackendError> {
        self.dev.bind()?;
        let stream = self.dev.cu_stream();
        let pos = i32::try_from(position)
            .map_err(|_| BackendError::InferenceFailed("position overflows".into()))?;
        write_step(&self.dev, self.arena.ptr() + self.step_offset, token, pos)?;
        // SAFETY: the graph was instantiated on this context; its buffers live
        // as long as `self`.
        unsafe { drv::graph::launch(self.exec, stream) }
            .map_err(|e| driver_error("launching the decode graph", e))?;
        // The graph's kernels wrote device memory behind `Kernels::launch`.
        self.dev.kernels.note_write();
        let Some(out) = out else {
            // Not waited for: the caller's `sample` queues behind the step and
            // waits for both, one round trip a token (a wait here had the host
            // wake up before it could queue the sampling).
            return Ok(());
        };
        debug_assert!(host.logits.bytes() >= host.vocab * 4);
        // SAFETY: the pinned buffer holds `vocab` f32 values and no other copy
        // into it is in flight; `kept` holds `vocab` logits once the graph ran.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(host.logits.as_ptr() as *mut f32, host.vocab);
            drv::memcpy_dtoh_async(dst, kept, stream)
                .map_err(|e| driver_error("copying the logits", e))?;
        }
        self.dev.synchronize()?;
        out.clear();
        // SAFETY: the copy above has finished.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(host.logits.as_ptr() as *const f32, host.vocab)
        });
        Ok(())
    }
}

/// Row counts of captured batched steps are multiples of this.
pub const ROWS_GRAPH_STEP: usize = 8;

/// One captured batched decode step: `rows` rows, attention over at most
/// `max_splits` chunks a row.
struct RowsGraph {
    exec: CUgraphExec,
    rows: usize,
    max_splits: usize,
}

/// Batched decode steps (`CudaBackend::decode`) replayed from CUDA
/// graphs. A rows-mode pass reads everything that depends on its sequences
/// from the device table (`ops::RowsTable`), so one graph per row count and
/// bound on attention's chunks (a power of two: contexts grow) serves every
/// step of that shape, whichever sequences it decodes: the host rewrites the
/// table and launches it. The kernels and launch shapes are the eager
/// pass's, so the logits are bit-identical.
///
/// Row counts are padded to multiples of [`ROWS_GRAPH_STEP`] (rows of a
/// scratch sequence whose logits go nowhere; a row's sums do not depend on
/// the others, and the products run on tiles of 8 rows anyway), so a
/// worker holds a few graphs however its batch grows and drains.
///
/// All graphs share one activation arena (they run one after another on the
/// stream), as large as the largest shape captured; when a larger one is
/// needed, the graphs are dropped and the arena made again. The backend
/// drops them all when no sequence is open, so that the device memory in
/// use is back at its value after load.
pub struct RowsGraphs {
    arena: Option<DevBuf>,
    graphs: Vec<RowsGraph>,
    /// The padding rows' sequence: a KV cache of one position and a
    /// logits buffer (made with the first graph).
    pad: Option<(CudaCache, DevBuf)>,
    /// A capture failed (a model with row-by-row work): steps run eagerly.
    pub failed: bool,
    dev: Arc<CudaDevice>,
}

// SAFETY: the graph handles are owned by this struct and used from one thread at a time.
unsafe impl Send for RowsGraphs {}

impl Drop for RowsGraphs {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Bytes of activations a batched step of `rows` rows allocates, with
/// attention's chunk states for `max_splits` chunks a row and the
/// products' column-range parts (a block for each shape at most: the
/// capture reuses the largest so far), with slack.
fn rows_arena_bytes(dev: &CudaDevice, cfg: &ModelConfig, rows: usize, max_splits: usize) -> u64 {
    let bufs = crate::model::step_buffers(cfg, rows);
    let acts: u64 = bufs.iter().map(|&n| align_up(n as u64 * 4)).sum();
    let part = align_up((rows * cfg.n_head * max_splits * (cfg.head_dim + 2) * 4) as u64);
    let (d, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    let shapes = [
        (qd, d),
        (kvd, d),
        (qd + 2 * kvd, d),
        (d, qd),
        (ff, d),
        (2 * ff, d),
        (d, ff),
        (cfg.vocab_size, d),
    ];
    let group = rows.min(GF_MAX_TOKENS);
    let products: u64 = (shapes.iter())
        .map(|&(r, c)| align_up((dev.kernels.few_part_floats(r, c) * group * 4) as u64))
        .sum();
    acts + part + products + (1 << 20)
}

impl RowsGraphs {
    pub fn new(dev: &Arc<CudaDevice>) -> Self {
        RowsGraphs {
            arena: None,
            graphs: Vec::new(),
            pad: None,
            failed: false,
            dev: dev.clone(),
        }
    }

    /// Drops every graph, the arena and the padding sequence (after any
    /// replay in flight).
    pub fn clear(&mut self) {
        self.drop_graphs();
        self.pad = None;
    }

    /// Drops every graph and the arena (after any replay in flight); the
    /// padding sequence stays (a pass being captured holds its addresses).
    fn drop_graphs(&mut self) {
        if self.graphs.is_empty() && self.arena.is_none() {
            return;
        }
        if self.dev.bind().is_ok() {
            self.dev.synchronize().ok();
            for g in self.graphs.drain(..) {
                // SAFETY: no replay is in flight now.
                unsafe { drv::graph::exec_destroy(g.exec) }.ok();
            }
        }
        self.graphs.clear();
        self.arena = None;
    }

    /// How many graphs are held (for tests).
    #[cfg(test)]
    pub fn captured(&self) -> usize {
        self.graphs.len()
    }

    /// Runs the batched step of `pass` (row 0's cache `lead`) from its
    /// shape's graph, capturing it first; the caches of rows 1 and on are
    /// taken from `pass` and given back in it. `Ok(false)`: this step
    /// cannot be captured (then it runs eagerly, and so do later ones).
    pub fn run(
        &mut self,
        ops: &mut CudaOps,
        cfg: &ModelConfig,
        weights: &Weights<CudaWeight>,
        lead: &mut CudaCache,
        pass: &mut RowsPass,
    ) -> Result<bool, BackendError> {
        let real = pass.seqs.len();
        let rows = real.next_multiple_of(ROWS_GRAPH_STEP);
        if self.pad.is_none() {
            self.dev.bind()?;
            let cache = CudaCache::new_in(
                &self.dev,
                None,
                self.dev.kernels.kv_type(),
                cfg.n_layer,
                cfg.n_head_kv,
                cfg.head_dim,
                1,
            )?;
            let logits = self
                .dev
                .alloc(Purpose::Scratch, (cfg.vocab_size * 4) as u64)?;
            self.pad = Some((cache, logits));
        }
        let (pad_cache, pad_logits) = self.pad.as_ref().expect("made above");
        let pad = RowSeq {
            cache: pad_cache.planes(0).0,
            logits: pad_logits.ptr(),
            pos: 0,
            capacity: 1,
        };
        pass.seqs.resize(rows, pad);
        pass.tokens.resize(rows, 0);
        let ran = self.run_padded(ops, cfg, weights, lead, pass);
        pass.seqs.truncate(real);
        pass.tokens.truncate(real);
        ran
    }

    /// [`RowsGraphs::run`] of a pass padded to a whole step of rows.
    fn run_padded(
        &mut self,
        ops: &mut CudaOps,
        cfg: &ModelConfig,
        weights: &Weights<CudaWeight>,
        lead: &mut CudaCache,
        pass: &mut RowsPass,
    ) -> Result<bool, BackendError> {
        let rows = pass.seqs.len();
        let max_splits = most_splits(&pass.seqs, 0)
            .next_power_of_two()
            .min(ATS_MAX_SPLITS);
        let at = self
            .graphs
            .iter()
            .position(|g| g.rows == rows && g.max_splits == max_splits);
        let at = match at {
            Some(i) => i,
            None => match self.capture(ops, cfg, weights, lead, pass, max_splits) {
                Ok(g) => {
                    self.graphs.push(g);
                    self.graphs.len() - 1
                }
                Err(e) => {
                    tracing::warn!(error = %e, rows, "capturing a batched decode step failed; decoding without graphs");
                    self.failed = true;
                    return Ok(false);
                }
            },
        };
        ops.write_rows_table(&pass.seqs, &pass.tokens)?;
        self.dev.bind()?;
        // SAFETY: the graph was instantiated on this context; its arena and
        // table live as long as `self` and the ops.
        unsafe { drv::graph::launch(self.graphs[at].exec, self.dev.cu_stream()) }
            .map_err(|e| driver_error("launching a batched decode graph", e))?;
        // The graph's kernels wrote device memory behind `Kernels::launch`.
        self.dev.kernels.note_write();
        Ok(true)
    }

    /// Captures the batched step of `pass`'s shape.
    fn capture(
        &mut self,
        ops: &mut CudaOps,
        cfg: &ModelConfig,
        weights: &Weights<CudaWeight>,
        lead: &mut CudaCache,
        pass: &mut RowsPass,
        max_splits: usize,
    ) -> Result<RowsGraph, BackendError> {
        let rows = pass.seqs.len();
        let bytes = rows_arena_bytes(&self.dev, cfg, rows, max_splits);
        if self.arena.as_ref().is_none_or(|a| a.bytes() < bytes) {
            self.drop_graphs();
            self.dev.bind()?;
            self.arena = Some(self.dev.alloc(Purpose::Scratch, bytes)?);
        }
        let arena = self.arena.as_ref().expect("made above");
        ops.capture = Some(GraphCapture {
            arena: arena.ptr(),
            arena_bytes: arena.bytes(),
            arena_used: 0,
            // Rows mode reads no step slot (the table holds tokens and positions).
            step: arena.ptr(),
            split_attention: false,
            split_part: None,
            temp: None,
        });
        let began = ops.begin_rows(RowsPass {
            seqs: pass.seqs.clone(),
            tokens: pass.tokens.clone(),
            caches: std::mem::take(&mut pass.caches),
            max_splits: Some(max_splits),
        });
        if let Err(e) = began {
            ops.capture = None;
            pass.caches = ops.end_rows();
            return Err(e);
        }
        let pos = pass.seqs[0].pos as usize;
        let exec = record(&self.dev, "a batched decode graph", || {
            model::forward(
                ops,
                cfg,
                weights,
                lead,
                &pass.tokens,
                pos,
                Logits::Rows,
                &mut Vec::new(),
                None,
            )
        });
        pass.caches = ops.end_rows();
        ops.capture = None;
        ops.end_step();
        let exec = exec?;
        Ok(RowsGraph {
            exec,
            rows,
            max_splits,
        })
    }
}
