//! Compute backends behind one trait.
//!
//! The engine thread owns exactly one `Backend`. A backend holds the model's
//! weights and at most one sequence (KV cache) at a time, and turns token ids
//! into logits. `cpu` is the plain-Rust f32 reference (the numerical oracle);
//! `cuda` runs the same graph on the GPU. Nothing outside `backend::cuda`
//! touches cudarc, the driver or cuBLAS (M0-W-1050).

#[cfg(test)]
mod contract;
pub mod cpu;
pub mod cuda;
mod error;

pub use error::BackendError;
// The forward pass's vocabulary is the model graph's; backends speak it.
pub use crate::model::ops::{Checkpoints, Logits};

use std::fmt;

use crate::sampling::{top_logprobs, SamplingParams, Selector, TokenLogprob, MAX_LOGPROBS};

/// Which implementation a backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(format!("unknown backend {other:?} (expected cuda or cpu)")),
        }
    }
}

/// Facts about the device a backend runs on, fixed after start-up.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceInfo {
    pub backend: BackendKind,
    /// Device name as the driver reports it, or the CPU's description.
    pub name: String,
    /// GPU ordinal; `None` on the CPU.
    pub gpu_device: Option<usize>,
    /// Compute capability such as `"9.0"`; `None` on the CPU.
    pub sm: Option<String>,
    /// CUDA version reported by the driver; `None` on the CPU.
    pub cuda_runtime_version: Option<String>,
    /// Total device memory in bytes; `None` on the CPU.
    pub total_memory_bytes: Option<u64>,
}

/// Bytes a backend holds on its device, by purpose (M0-W-1011). All zero on the CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryUse {
    pub weights: u64,
    pub kv_cache: u64,
    pub scratch: u64,
}

impl MemoryUse {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.scratch
    }
}

/// The paged KV cache's blocks: their size, how many there are, and how
/// many open sequences hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KvBlocks {
    pub block_bytes: u64,
    pub total: usize,
    pub used: usize,
}

/// What [`Backend::sample`] is asked to do with the last forward pass's
/// last-position logits.
#[derive(Clone, Copy, Debug)]
pub struct SampleRequest<'a> {
    pub params: &'a SamplingParams,
    /// Tokens generated so far in the job (for the repetition penalty).
    pub generated: &'a [u32],
    /// The token's draw from the job's PRNG ([`crate::sampling::Sampler::draw`]):
    /// `None` at temperature 0 (greedy).
    pub uniform: Option<f64>,
    /// How many top log-probabilities of the raw logits to return (0: none;
    /// at most [`MAX_LOGPROBS`]).
    pub logprobs: usize,
}

/// The token [`Backend::sample`] chose.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    /// The `logprobs` most likely tokens of the raw logits with their
    /// log-softmax, as [`top_logprobs`] gives them.
    pub logprobs: Vec<TokenLogprob>,
}

/// [`Backend::sample`] on host logits: [`Selector::select`] and
/// [`top_logprobs`]. The CPU backend's implementation, and the reference the
/// CUDA one is compared with.
pub fn sample_on_host(
    selector: &mut Selector,
    logits: &[f32],
    req: &SampleRequest,
) -> Result<SampledToken, BackendError> {
    if logits.is_empty() {
        return Err(BackendError::InferenceFailed(
            "sample without logits: run forward first".into(),
        ));
    }
    if req.logprobs > MAX_LOGPROBS {
        return Err(BackendError::InferenceFailed(format!(
            "{} log-probabilities asked, at most {MAX_LOGPROBS}",
            req.logprobs
        )));
    }
    let id = selector.select(logits, req.generated, req.params, req.uniform);
    let logprobs = if req.logprobs > 0 {
        top_logprobs(logits, req.logprobs)
    } else {
        Vec::new()
    };
    Ok(SampledToken { id, logprobs })
}

/// Whether a backend may now hold `n` sequences (`Backend::set_slots`):
/// at least one, and only while none is open.
pub fn check_set_slots(n: usize, any_open: bool) -> Result<(), BackendError> {
    if n == 0 {
        return Err(BackendError::InferenceFailed("zero slots".into()));
    }
    if any_open {
        return Err(BackendError::InferenceFailed(
            "slots change only while no sequence is open".into(),
        ));
    }
    Ok(())
}

/// [`Backend::decode_rows`] as one-token `forward` calls, slot by slot.
pub fn decode_one_by_one<B: Backend + ?Sized>(
    b: &mut B,
    rows: &[(usize, u32)],
) -> Result<(), BackendError> {
    let mut none = Vec::new();
    for &(slot, token) in rows {
        b.select_slot(slot)?;
        b.forward(&[token], Logits::None, &mut none, None)?;
    }
    Ok(())
}

/// `slot` is one of `slots`, or the error that says it is not.
pub fn check_slot(slot: usize, slots: usize) -> Result<(), BackendError> {
    if slot < slots {
        Ok(())
    } else {
        Err(BackendError::InferenceFailed(format!(
            "slot {slot} does not exist: the backend holds {slots}"
        )))
    }
}

/// [`Backend::prefill_chunk`] unless a backend says otherwise: the CPU
/// backend's scratch stays bounded.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// A loaded model on a device, holding one sequence, or several in slots of
/// their own ([`Backend::set_slots`]).
///
/// `begin_sequence`, `sequence_len`, `forward`, `sample` and `end_sequence`
/// act on the current slot ([`Backend::select_slot`]; slot 0 unless another
/// is selected). Calls come from the engine thread only. Errors never panic across this
/// boundary: every failure is a `BackendError`.
pub trait Backend: Send {
    /// The device this backend runs on.
    fn device(&self) -> &DeviceInfo;

    /// Starts a new sequence with room for `capacity` positions, freeing any
    /// previous one. Fails with `OutOfMemory` when its KV cache cannot be had.
    fn begin_sequence(&mut self, capacity: usize) -> Result<(), BackendError>;

    /// Number of positions already in the current sequence's KV cache.
    fn sequence_len(&self) -> usize;

    /// Appends `tokens` to the current sequence (their K/V go into the cache at
    /// the positions after those already there) and writes the requested logits
    /// into `out` (resized by the callee). When `checkpoints` is given, the
    /// backend records its intermediate values at the last position.
    fn forward(
        &mut self,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError>;

    /// Picks the next token from the last position's logits of the latest
    /// `forward` in this sequence (whatever `Logits` it was given), by the
    /// pipeline of `crate::sampling` with the draw `req.uniform`. The id
    /// equals `sampling::select` on the same logits (see each backend for
    /// its precision). Fails when no forward pass has run in the sequence.
    fn sample(&mut self, req: &SampleRequest) -> Result<SampledToken, BackendError>;

    /// Frees the current sequence's KV cache and scratch.
    fn end_sequence(&mut self);

    /// Whether a one-token `forward` returns once its work is queued on the
    /// device (the next `sample` waits for it), so that the engine may queue
    /// the next step before it streams the token it follows. `false` (the
    /// default): `forward` computes, and a token would wait a step to go out.
    fn queues_work(&self) -> bool {
        false
    }

    /// Prompt tokens per `forward` call during prefill: as many as the
    /// backend runs well in one pass within its scratch budget (the engine
    /// checks for aborts between calls).
    fn prefill_chunk(&self) -> usize {
        DEFAULT_PREFILL_CHUNK
    }

    /// Bytes held on the device now.
    fn memory_use(&self) -> MemoryUse;

    /// Whether a sequence of `capacity` positions fits now beside the open
    /// ones (its KV cache within the backend's budget); the engine lets a
    /// job wait for room rather than fail at its start.
    fn has_room(&self, _capacity: usize) -> bool {
        true
    }

    /// The paged KV cache's blocks, where the backend has one (the GPU with
    /// more than one slot): jobs' caches come from a pool of fixed-size
    /// blocks taken at start-up, and `has_room` asks whether enough are free.
    fn kv_blocks(&self) -> Option<KvBlocks> {
        None
    }

    /// How many sequences the backend holds at once: 1 unless `set_slots`
    /// asked for more.
    fn slots(&self) -> usize {
        1
    }

    /// Makes room for `n` sequences at once, each in a slot with its own KV
    /// cache, position and last logits (`--parallel N`). Only while no
    /// sequence is open; a backend that holds one sequence refuses `n > 1`.
    fn set_slots(&mut self, n: usize) -> Result<(), BackendError> {
        match n {
            1 => Ok(()),
            _ => Err(BackendError::InferenceFailed(format!(
                "this backend holds one sequence at a time, not {n}"
            ))),
        }
    }

    /// Makes `slot` (below [`Backend::slots`]) the current sequence.
    fn select_slot(&mut self, slot: usize) -> Result<(), BackendError> {
        check_slot(slot, self.slots())
    }

    /// `sample` for each `(slot, request)` (distinct slots): the tokens in
    /// the same order, each the one that slot's own `sample` picks.
    /// Backends that batch it (the GPU: one launch, one wait) override this.
    /// The current slot afterwards is unspecified.
    fn sample_rows(
        &mut self,
        rows: &[(usize, SampleRequest<'_>)],
    ) -> Result<Vec<SampledToken>, BackendError> {
        let mut out = Vec::with_capacity(rows.len());
        for (slot, req) in rows {
            self.select_slot(*slot)?;
            out.push(self.sample(req)?);
        }
        Ok(out)
    }

    /// One decode step of several sequences: for each `(slot, token)`, the
    /// token is appended to that slot's sequence as `forward(&[token],
    /// Logits::None, ..)` would append it, and that slot's `sample` then picks
    /// from its new logits. Each row's logits are bit for bit the same
    /// whichever rows share the step, a row alone included (batch
    /// invariance); a backend that batches may differ from a one-token
    /// `forward` in the last bits (other kernels). The current slot
    /// afterwards is unspecified.
    fn decode_rows(&mut self, rows: &[(usize, u32)]) -> Result<(), BackendError> {
        decode_one_by_one(self, rows)
    }

    /// Runs the work of a first job once before serving, on a sequence that
    /// is then closed, so that the first client does not pay for first use
    /// (kernels loaded on first launch, libraries' set-up, memory pools'
    /// growth). Nothing to do on the CPU.
    fn warm_up(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Asks the driver where every weight buffer lives; `Ok(true)` when all
    /// are plain device memory. Always `Ok(false)` on the CPU, where the
    /// notion does not apply.
    fn check_residency(&self) -> Result<bool, BackendError>;
}
