//! Compute backends behind one trait.
//!
//! The engine thread owns exactly one `Backend`. A backend holds the model's
//! weights and up to [`Backend::max_sequences`] open sequences (each a KV
//! cache, a position and its last logits, named by a [`SeqId`]), and turns
//! token ids into logits. `cpu` is the plain-Rust f32 reference (the numerical oracle);
//! `cuda` runs the same graph on the GPU. Nothing outside `backend::cuda`
//! touches cudarc, the driver or cuBLAS (M0-W-1050).

#[cfg(test)]
mod contract;
pub mod cpu;
pub mod cuda;
mod error;
mod kv_type;
pub mod prefix;
mod seqs;

pub use error::BackendError;
pub use kv_type::KvType;
pub use prefix::PrefixStats;
pub use seqs::{SeqId, Slots};
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
/// many open sequences hold (those of the prefix cache are not counted: a
/// sequence takes them back when it needs them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KvBlocks {
    pub block_bytes: u64,
    pub total: usize,
    pub used: usize,
}

/// How a backend's KV cache stores one position (`/health`'s `kv_cache`):
/// its type and the bytes a token takes in every layer's K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KvLayout {
    #[serde(rename = "type")]
    pub kv_type: KvType,
    pub bytes_per_token: u64,
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
    /// The tokens a constraint allows (issue #43): bit `id % 32` of word
    /// `id / 32` set for each; the others' logits become -inf before the
    /// sampling pipeline, so the choice and the log-probabilities are those
    /// of the allowed tokens alone. `None`: every token.
    pub mask: Option<&'a [u32]>,
    /// Added to the logits before the sampling pipeline (and before `mask`):
    /// `(id, delta)`, ids distinct and in the vocabulary (OpenAI's
    /// `logit_bias`, presence and frequency penalties; see
    /// [`crate::sampling::LogitBias`]).
    pub bias: &'a [(u32, f32)],
}

impl SampleRequest<'_> {
    /// Whether the logits are biased or masked before the pipeline (into a
    /// copy: the step's own logits stay as the forward left them).
    pub fn adjusts(&self) -> bool {
        self.mask.is_some() || !self.bias.is_empty()
    }
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
        return Err(BackendError::CallerBug(
            "sample without logits: run forward first".into(),
        ));
    }
    if req.logprobs > MAX_LOGPROBS {
        return Err(BackendError::CallerBug(format!(
            "{} log-probabilities asked, at most {MAX_LOGPROBS}",
            req.logprobs
        )));
    }
    let adjusted;
    let logits = if req.adjusts() {
        adjusted = adjust(logits, req.bias, req.mask)?;
        &adjusted[..]
    } else {
        logits
    };
    let id = selector.select(logits, req.generated, req.params, req.uniform);
    let logprobs = if req.logprobs > 0 {
        top_logprobs(logits, req.logprobs)
    } else {
        Vec::new()
    };
    Ok(SampledToken { id, logprobs })
}

/// `logits` with `bias` added, then every token `mask` does not allow at
/// -inf: what the GPU's `sample_mask_rows` and `sample_bias` leave (it masks
/// first, then adds: the same values, a finite delta leaves -inf). A bias list
/// whose ids are not ascending and distinct, or out of the vocabulary, is a
/// caller's bug on every backend (the GPU adds them in parallel).
pub fn adjust(
    logits: &[f32],
    bias: &[(u32, f32)],
    mask: Option<&[u32]>,
) -> Result<Vec<f32>, BackendError> {
    check_bias(bias, logits.len())?;
    let mut out = logits.to_vec();
    for &(id, delta) in bias {
        out[id as usize] += delta;
    }
    let Some(bits) = mask else {
        return Ok(out);
    };
    check_mask(bits, logits.len())?;
    for (id, x) in out.iter_mut().enumerate() {
        if bits[id / 32] & (1 << (id % 32)) == 0 {
            *x = f32::NEG_INFINITY;
        }
    }
    Ok(out)
}

/// Checks that a mask has one bit for each of `vocab` tokens, in u32 words.
pub fn check_mask(bits: &[u32], vocab: usize) -> Result<(), BackendError> {
    if bits.len() != vocab.div_ceil(32) {
        return Err(BackendError::CallerBug(format!(
            "a mask of {} words for {vocab} logits",
            bits.len()
        )));
    }
    Ok(())
}

/// Checks that a bias list's ids are ascending, distinct and below `vocab`.
pub fn check_bias(bias: &[(u32, f32)], vocab: usize) -> Result<(), BackendError> {
    let ascending = bias.windows(2).all(|w| w[0].0 < w[1].0);
    match bias.last() {
        Some(&(id, _)) if !ascending || id as usize >= vocab => {
            Err(BackendError::CallerBug(format!(
                "a bias list of {} ids (ascending: {ascending}, last {id}) for {vocab} logits",
                bias.len()
            )))
        }
        _ => Ok(()),
    }
}

/// [`Backend::sample`] of backends that keep each sequence's last logits on
/// the host: [`sample_on_host`] for each row, in order.
pub fn sample_rows_on_host<S>(
    seqs: &mut Slots<S>,
    selector: &mut Selector,
    rows: &[(SeqId, SampleRequest<'_>)],
    logits: impl Fn(&S) -> &[f32],
) -> Result<Vec<SampledToken>, BackendError> {
    let ids: Vec<SeqId> = rows.iter().map(|(id, _)| *id).collect();
    let states = seqs.get_many_mut(&ids)?;
    states
        .into_iter()
        .zip(rows)
        .map(|(s, (_, req))| sample_on_host(selector, logits(s), req))
        .collect()
}

/// Whether a sequence of `capacity` positions fits a context of `context`.
pub fn check_capacity(capacity: usize, context: usize) -> Result<(), BackendError> {
    if capacity == 0 || capacity > context {
        return Err(BackendError::CallerBug(format!(
            "a sequence of {capacity} positions does not fit the context of {context}"
        )));
    }
    Ok(())
}

/// Whether `share` is a prefix cache's share of the KV memory: above 0, at most 1.
pub fn check_prefix_share(share: f64) -> Result<(), BackendError> {
    if !(share > 0.0 && share <= 1.0) {
        return Err(BackendError::CallerBug(format!(
            "a prefix cache's share of {share} (expected above 0, at most 1)"
        )));
    }
    Ok(())
}

/// [`Backend::decode`] as one-token [`Backend::forward`] calls, row by row.
pub fn decode_one_by_one<B: Backend + ?Sized>(
    b: &mut B,
    rows: &[(SeqId, u32)],
) -> Result<(), BackendError> {
    check_distinct(rows.iter().map(|(seq, _)| *seq))?;
    let mut none = Vec::new();
    for &(seq, token) in rows {
        b.forward(seq, &[token], Logits::None, &mut none, None)?;
    }
    Ok(())
}

/// Each sequence once in a step, or the caller's bug.
pub fn check_distinct(seqs: impl Iterator<Item = SeqId>) -> Result<(), BackendError> {
    let mut seen = std::collections::HashSet::new();
    for seq in seqs {
        if !seen.insert(seq) {
            return Err(BackendError::CallerBug(format!(
                "{seq:?} is twice in one step"
            )));
        }
    }
    Ok(())
}

/// [`Backend::sample`] of one sequence.
pub fn sample_one(
    b: &mut (impl Backend + ?Sized),
    seq: SeqId,
    req: &SampleRequest,
) -> Result<SampledToken, BackendError> {
    let mut tokens = b.sample(&[(seq, *req)])?;
    tokens
        .pop()
        .ok_or_else(|| BackendError::CallerBug("sample gave no token for one row".into()))
}

/// [`Backend::forward`]'s chunk unless a backend says otherwise: the CPU
/// backend's scratch stays bounded.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// A loaded model on a device, holding up to [`Backend::max_sequences`]
/// sequences at once.
///
/// A sequence is opened with the positions it may need ([`Backend::open`]),
/// its prompt appended a chunk at a time ([`Backend::forward`]), and then,
/// step after step, its next token chosen ([`Backend::sample`]) and appended
/// ([`Backend::decode`], which appends one token to each of several
/// sequences at once), until it is closed ([`Backend::close`]). Calls come
/// from the engine thread only. Errors never panic across this boundary:
/// every failure is a `BackendError`; a call naming a sequence that is not
/// open is a [`BackendError::CallerBug`].
pub trait Backend: Send {
    /// The device this backend runs on.
    fn device(&self) -> &DeviceInfo;

    /// How many sequences may be open at once: 1 unless
    /// [`Backend::set_max_sequences`] asked for more.
    fn max_sequences(&self) -> usize {
        1
    }

    /// Makes room for `n` sequences at once, each with its own KV cache,
    /// position and last logits (`--parallel N`). Only while none is open;
    /// a backend that holds one sequence refuses `n > 1`.
    fn set_max_sequences(&mut self, n: usize) -> Result<(), BackendError> {
        match n {
            1 => Ok(()),
            _ => Err(BackendError::CallerBug(format!(
                "this backend holds one sequence at a time, not {n}"
            ))),
        }
    }

    /// Opens a sequence with room for `capacity` positions. Fails with
    /// `OutOfMemory` when its KV cache cannot be had, and with `CallerBug`
    /// when [`Backend::max_sequences`] are open already.
    fn open(&mut self, capacity: usize) -> Result<SeqId, BackendError>;

    /// Frees `seq`'s KV cache and scratch; `seq` is no longer valid. Closing a
    /// sequence that is not open does nothing.
    fn close(&mut self, seq: SeqId);

    /// Number of positions already in `seq`'s KV cache (0 when it is not open).
    fn len(&self, seq: SeqId) -> usize;

    /// Appends `tokens` to `seq` (their K/V go into its cache at the
    /// positions after those already there) and writes the requested logits
    /// into `out` (resized by the callee): a prompt's chunk, or one token
    /// whose logits or checkpoints the caller wants on the host. When
    /// `checkpoints` is given, the backend records its intermediate values at
    /// the last position.
    fn forward(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        logits: Logits,
        out: &mut Vec<f32>,
        checkpoints: Option<&mut Checkpoints>,
    ) -> Result<(), BackendError>;

    /// One decode step of several sequences (distinct): for each `(seq,
    /// token)`, the token is appended to that sequence as `forward(seq,
    /// &[token], Logits::None, ..)` would append it, and its `sample` then
    /// picks from its new logits. Each row's logits are bit for bit the same
    /// whichever rows share the step, a row alone included (batch
    /// invariance); a backend that batches may differ from a one-token
    /// `forward` in the last bits (other kernels).
    fn decode(&mut self, rows: &[(SeqId, u32)]) -> Result<(), BackendError> {
        decode_one_by_one(self, rows)
    }

    /// Whether [`Backend::decode`] of `rows` returns once its work is queued
    /// on the device (the next `sample` waits for it), so that the engine may
    /// queue the step before it streams the tokens it follows. `false` (the
    /// default): `decode` computes, or first does slow work on the host
    /// (capturing a graph), and a token would wait for it to go out.
    fn queues_decode(&self, _rows: &[(SeqId, u32)]) -> bool {
        false
    }

    /// Picks the next token of each `(seq, request)` (distinct sequences)
    /// from the last position's logits of the latest `forward` or `decode`
    /// of that sequence, by the pipeline of `crate::sampling` with the draw
    /// `req.uniform`; the tokens in the same order. Each id equals
    /// `sampling::select` on the same logits (see each backend for its
    /// precision), whichever rows share the call. Fails when a sequence has
    /// no logits yet.
    fn sample(
        &mut self,
        rows: &[(SeqId, SampleRequest<'_>)],
    ) -> Result<Vec<SampledToken>, BackendError>;

    /// Prompt tokens per `forward` call during prefill: as many as the
    /// backend runs well in one pass within its scratch budget (the engine
    /// checks for aborts between calls).
    fn prefill_chunk(&self) -> usize {
        DEFAULT_PREFILL_CHUNK
    }

    /// Keeps prompts' whole chunks after their sequences end, in at most
    /// `max_share` of the KV memory of [`Backend::max_sequences`] full
    /// contexts (the GPU's paged pool), for [`Backend::attach_prefix`]
    /// (`backend::prefix`). Only while no sequence is open; `None` turns it
    /// off and drops what it held. A backend without one ignores it.
    fn set_prefix_cache(&mut self, _max_share: Option<f64>) -> Result<(), BackendError> {
        Ok(())
    }

    /// Gives `seq` (just opened, empty) the KV of the longest run of whole
    /// cached chunks `prompt` starts with, leaving at least its last token
    /// to compute; the number of positions it now holds (a multiple of
    /// [`Backend::prefill_chunk`]). The caller prefills the rest from there in
    /// chunks of that size, as it would have from 0: the tokens that follow
    /// are the same bits, cached or not. 0 without a cache.
    fn attach_prefix(&mut self, _seq: SeqId, _prompt: &[u32]) -> Result<usize, BackendError> {
        Ok(0)
    }

    /// The prefix cache's counters; `None` without one.
    fn prefix_stats(&self) -> Option<PrefixStats> {
        None
    }

    /// Bytes held on the device now.
    fn memory_use(&self) -> MemoryUse;

    /// The KV cache's type and the bytes one position takes in it.
    fn kv_layout(&self) -> KvLayout;

    /// Whether a sequence of `capacity` positions fits now beside the open
    /// ones (its KV cache within the backend's budget); the engine lets a
    /// job wait for room rather than fail at its start.
    fn has_room(&self, _capacity: usize) -> bool {
        true
    }

    /// The paged KV cache's blocks, where the backend has one (the GPU with
    /// more than one sequence): caches come from a pool of fixed-size
    /// blocks taken at start-up, and `has_room` asks whether enough are free.
    fn kv_blocks(&self) -> Option<KvBlocks> {
        None
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
