//! Sampling on the GPU (M0-W-1421): `Backend::sample` for the CUDA backend.
//!
//! Every forward pass leaves its last position's logits in this sampler's
//! device buffer (`Ops::keep_last_row`, also inside the decode graph). A
//! sample launches `sample_select` (`sample_argmax`, over many blocks, for
//! the greedy choice without a penalty) (and `sample_logprobs` when
//! log-probabilities are asked for) over that buffer and copies back one
//! small result block: the id, and at most [`SAMPLE_MAX_LOGPROBS`] (id,
//! logit) pairs with the max and log-sum-exp, from which the host computes
//! the log-probabilities exactly as `sampling::top_logprobs` does.
//!
//! The job's PRNG stays on the host: the draw `u` arrives in the request, so
//! the random stream is the CPU backend's. The kernels follow the CPU
//! pipeline step for step; the chosen id equals `sampling::select` on the
//! same logits except where `u × total` lies within the fixed-point
//! rounding of a cumulative boundary (see `cuda/sample.cu`: weights are
//! multiples of 2^-45 of the top one for a 151936-token vocabulary).
//!
//! All buffers are allocated once, with the backend (accounted as weights,
//! like the RoPE table: they live as long as the model), so nothing is
//! allocated per token.

use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys::CUdeviceptr;

use crate::backend::cuda::device::{driver_error, CudaDevice, DevBuf, Purpose};
use crate::backend::cuda::graph::Pinned;
use crate::backend::cuda::kernels::{
    MaskRow, SampleArgmaxArgs, SampleBiasArgs, SampleLogprobsArgs, SampleMaskRowsArgs, SampleRow,
    SampleSelectArgs, SampleSelectRowsArgs, SelectArgs,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{SAMPLE_ARGMAX_BLOCKS, SAMPLE_MAX_LOGPROBS, SAMPLE_OUT_WORDS};
use crate::backend::{check_bias, check_mask, BackendError, SampleRequest, SampledToken};
use crate::sampling::TokenLogprob;

/// Which kernel picks a token: `sample_argmax` for the greedy choice
/// without a penalty, else the whole pipeline.
enum Choice {
    Argmax(SampleArgmaxArgs),
    Select(SampleSelectArgs),
}

/// A batched step's sampling scratch: the rows' `sample_select_rows`
/// table, and the constrained rows' [`MaskRow`]s and masks (on the device,
/// and staged in pinned memory so that their copy is one queued transfer).
#[derive(Default)]
pub struct SampleTables {
    select: Option<DevBuf>,
    masks: Option<DevBuf>,
    staged: Option<Pinned>,
}

impl SampleTables {
    /// Room for `rows` sampling rows over `vocab` tokens
    /// (`set_max_sequences` reserves it for every slot, so that serving
    /// never grows it).
    pub fn reserve(
        &mut self,
        dev: &Arc<CudaDevice>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), BackendError> {
        let rows = rows.max(1);
        let bytes = (rows * std::mem::size_of::<SampleRow>()) as u64;
        if self.select.as_ref().is_none_or(|t| t.bytes() < bytes) {
            self.select = None;
            self.select = Some(dev.alloc(Purpose::Scratch, bytes.next_power_of_two())?);
        }
        let bytes = rows * mask_row_bytes(vocab);
        if self.staged.as_ref().is_none_or(|p| p.bytes() < bytes) {
            (self.staged, self.masks) = (None, None);
            self.staged = Some(Pinned::new(dev, bytes)?);
            self.masks = Some(dev.alloc(Purpose::Scratch, bytes as u64)?);
        }
        Ok(())
    }
}

/// Samples one token for each `(sampler, request)` of a batched decode step
/// with one wait: the constrained rows' masks in one launch
/// (`queue_masks`), each greedy choice as `sample` makes it, the rest in one
/// `sample_select_rows` launch (a block each; every row's choice the one
/// `sample_select` makes alone), then the log-probabilities where asked for.
/// `tables` is the launches' scratch, grown as needed.
pub fn sample_rows(
    rows: &mut [(&mut DeviceSampler, &SampleRequest)],
    tables: &mut SampleTables,
) -> Result<Vec<SampledToken>, BackendError> {
    let Some((first, _)) = rows.first() else {
        return Ok(Vec::new());
    };
    let (dev, vocab, scale) = (first.dev.clone(), first.vocab, first.scale);
    if rows.iter().any(|(s, _)| s.vocab != vocab) {
        return Err(BackendError::InferenceFailed(
            "samplers of one step share a vocabulary".into(),
        ));
    }
    let queued = queue_rows(rows, tables, &dev, scale);
    if queued.is_err() {
        // Nothing queued may still read the staged masks when the next
        // call writes them.
        dev.synchronize().ok();
    }
    queued?;
    dev.synchronize()?;
    rows.iter().map(|(s, req)| s.finish(req)).collect()
}

/// `sample_rows`' launches and copies, queued.
fn queue_rows(
    rows: &mut [(&mut DeviceSampler, &SampleRequest)],
    tables: &mut SampleTables,
    dev: &Arc<CudaDevice>,
    scale: f64,
) -> Result<(), BackendError> {
    let vocab = rows[0].0.vocab;
    queue_masks(rows, tables, dev)?;
    let mut selects = Vec::new();
    for (s, req) in rows.iter_mut() {
        match s.prepare(req)? {
            Choice::Argmax(a) => dev.kernels.launch(&dev.stream, &a)?,
            Choice::Select(a) => selects.push(SampleRow::of(&a)),
        }
    }
    if !selects.is_empty() {
        tables.reserve(dev, selects.len(), vocab)?;
        let t = tables.select.as_ref().expect("reserved above");
        let bytes = selects.len() * std::mem::size_of::<SampleRow>();
        // SAFETY: `bytes` of plain C structs into a block of at least that
        // many; pageable memory is staged before the call returns.
        unsafe {
            let raw = std::slice::from_raw_parts(selects.as_ptr() as *const u8, bytes);
            drv::memcpy_htod_async(t.ptr(), raw, dev.cu_stream())
        }
        .map_err(|e| driver_error("copying the sampling rows", e))?;
        let args = SampleSelectRowsArgs {
            table: DevPtr::new(t.ptr()),
            rows: selects.len(),
            n: vocab as u32,
            scale,
        };
        dev.kernels.launch(&dev.stream, &args)?;
    }
    for (s, req) in rows.iter_mut() {
        s.queue_result(req)?;
    }
    Ok(())
}

/// Queues the constrained rows' masks: their [`MaskRow`]s and masks written
/// to the pinned stage, one copy to the device, one `sample_mask_rows`
/// launch that leaves each row's masked logits in its sampler's adjusted
/// copy (its bias, if any, is added after: see sample.cu).
fn queue_masks(
    rows: &[(&mut DeviceSampler, &SampleRequest)],
    tables: &mut SampleTables,
    dev: &Arc<CudaDevice>,
) -> Result<(), BackendError> {
    let vocab = rows[0].0.vocab;
    let masked: Vec<(&DeviceSampler, &[u32])> = rows
        .iter()
        .filter_map(|(s, req)| req.mask.map(|bits| (&**s, bits)))
        .collect();
    if masked.is_empty() {
        return Ok(());
    }
    for (_, bits) in &masked {
        check_mask(bits, vocab)?;
    }
    tables.reserve(dev, masked.len(), vocab)?;
    let (staged, table) = match (&tables.staged, &tables.masks) {
        (Some(p), Some(t)) => (p, t),
        _ => unreachable!("reserved above"),
    };
    let words = vocab.div_ceil(32);
    let head = masked.len() * std::mem::size_of::<MaskRow>() / 4;
    let len = head + masked.len() * words;
    // SAFETY: the stage is page-aligned pinned memory of at least
    // `len` u32 (reserved above), and no queued copy reads it: every
    // sample waits for its stream before returning.
    let stage = unsafe { std::slice::from_raw_parts_mut(staged.as_ptr() as *mut u32, len) };
    for (r, (s, bits)) in masked.iter().enumerate() {
        let (logits, adjusted) = (s.logits.ptr(), s.adjusted.ptr());
        stage[4 * r..4 * r + 4].copy_from_slice(&[
            logits as u32,
            (logits >> 32) as u32,
            adjusted as u32,
            (adjusted >> 32) as u32,
        ]);
        stage[head + r * words..head + (r + 1) * words].copy_from_slice(bits);
    }
    dev.bind()?;
    // SAFETY: `len` u32 into a device block of at least as many.
    unsafe { drv::memcpy_htod_async(table.ptr(), &stage[..], dev.cu_stream()) }
        .map_err(|e| driver_error("copying the constraints' masks", e))?;
    let args = SampleMaskRowsArgs {
        table: DevPtr::new(table.ptr()),
        rows: masked.len(),
        n: vocab as u32,
        masks: DevPtr::new(table.ptr() + 4 * head as u64),
        words: words as u32,
    };
    dev.kernels.launch(&dev.stream, &args)
}

/// Bytes of a mask over `vocab` tokens: a bit each, in u32 words.
fn mask_bytes(vocab: usize) -> u64 {
    vocab.div_ceil(32) as u64 * 4
}

/// Bytes of one constrained row in [`SampleTables`]: its [`MaskRow`] and mask.
fn mask_row_bytes(vocab: usize) -> usize {
    std::mem::size_of::<MaskRow>() + mask_bytes(vocab) as usize
}

/// Bytes of the bias pairs for `vocab` tokens: at most one (id, delta) each.
fn bias_bytes(vocab: usize) -> u64 {
    vocab as u64 * 8
}

/// `sample_argmax`'s partial results and ticket counter.
const ARGMAX_BYTES: u64 = SAMPLE_ARGMAX_BLOCKS as u64 * 8 + 8;

// The kernels return as many log-probabilities as a job may ask for.
const _: () = assert!(SAMPLE_MAX_LOGPROBS >= crate::sampling::MAX_LOGPROBS);

/// The device side of sampling for one vocabulary size.
pub struct DeviceSampler {
    dev: Arc<CudaDevice>,
    vocab: usize,
    /// `[vocab]` f32: the logits sampled from (the last forward's last position).
    logits: DevBuf,
    /// `[vocab]` f32: a job's biased and masked copy of `logits` (issue #43),
    /// sampled from instead ([`SampleRequest::adjusts`]), so that `logits`
    /// stay as the forward left them (sampling twice from one step's logits
    /// gives the same token).
    adjusted: DevBuf,
    /// `[vocab]` u32: the kernels' working rank keys.
    keys: DevBuf,
    /// `[vocab]` u32: the distinct generated ids to penalize.
    ids: DevBuf,
    /// `[2 * vocab]` u32: a job's (id, delta bits) biases (issue #43).
    bias: DevBuf,
    /// `[SAMPLE_OUT_WORDS]` u32: the result block.
    out: DevBuf,
    /// `sample_argmax`'s `[SAMPLE_ARGMAX_BLOCKS]` u64 partial results, then
    /// its u32 ticket counter (zero between launches).
    argmax: DevBuf,
    /// Host scratch: the distinct ids, the bias pairs, and the result block.
    distinct: Vec<u32>,
    pairs: Vec<u32>,
    result: Vec<u32>,
    /// Fixed-point scale of the weights: 2^(63 - ceil(log2 vocab)).
    scale: f64,
}

/// The fixed-point scale for `vocab` tokens: the largest power of two with
/// `vocab * scale <= 2^63`, so that a sum of weights in `[0, 1]` fits a u64.
pub fn weight_scale(vocab: usize) -> f64 {
    let bits = usize::BITS - vocab.saturating_sub(1).leading_zeros();
    2f64.powi(63 - bits as i32)
}

impl DeviceSampler {
    /// Device bytes a sampler for `vocab` tokens holds.
    pub fn bytes_for(vocab: usize) -> u64 {
        use crate::backend::cuda::device::align_up;
        4 * align_up(vocab as u64 * 4)
            + align_up(bias_bytes(vocab))
            + align_up(SAMPLE_OUT_WORDS as u64 * 4)
            + align_up(ARGMAX_BYTES)
    }

    pub fn new(dev: &Arc<CudaDevice>, vocab: usize) -> Result<Self, BackendError> {
        if vocab == 0 || vocab >= u32::MAX as usize / 2 {
            return Err(BackendError::InferenceFailed(format!(
                "cannot sample from a vocabulary of {vocab} tokens"
            )));
        }
        dev.bind()?;
        let bytes = vocab as u64 * 4;
        let logits = dev.alloc(Purpose::Weights, bytes)?;
        // Until a forward pass writes them, the logits are all zero (not garbage).
        logits.zero(bytes)?;
        let argmax = dev.alloc(Purpose::Weights, ARGMAX_BYTES)?;
        argmax.zero(ARGMAX_BYTES)?;
        Ok(DeviceSampler {
            dev: dev.clone(),
            vocab,
            logits,
            adjusted: dev.alloc(Purpose::Weights, bytes)?,
            keys: dev.alloc(Purpose::Weights, bytes)?,
            ids: dev.alloc(Purpose::Weights, bytes)?,
            bias: dev.alloc(Purpose::Weights, bias_bytes(vocab))?,
            out: dev.alloc(Purpose::Weights, SAMPLE_OUT_WORDS as u64 * 4)?,
            argmax,
            distinct: Vec::new(),
            pairs: Vec::new(),
            result: vec![0; SAMPLE_OUT_WORDS],
            scale: weight_scale(vocab),
        })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The device buffer the logits are sampled from: `[vocab]` f32.
    pub fn logits_ptr(&self) -> CUdeviceptr {
        self.logits.ptr()
    }

    /// Copies `logits` (exactly `vocab` values) into the buffer sampled from
    /// (for tests, and for logits that come from the host).
    pub fn upload_logits(&mut self, logits: &[f32]) -> Result<(), BackendError> {
        if logits.len() != self.vocab {
            return Err(BackendError::InferenceFailed(format!(
                "{} logits for a vocabulary of {}",
                logits.len(),
                self.vocab
            )));
        }
        self.dev.bind()?;
        // SAFETY: the buffer holds `vocab` f32 values; pageable memory is
        // staged before the call returns.
        unsafe { drv::memcpy_htod_async(self.logits.ptr(), logits, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying logits to the device", e))
    }

    /// Copies the logits sampled from to the host (for tests, and for the
    /// prefix cache, which keeps a prompt's last logits).
    pub fn download_logits(&self) -> Result<Vec<f32>, BackendError> {
        let mut v = vec![0f32; self.vocab];
        self.dev.bind()?;
        // SAFETY: the buffer holds `vocab` f32 values.
        unsafe {
            drv::memcpy_dtoh_async(v.as_mut_slice(), self.logits.ptr(), self.dev.cu_stream())
        }
        .map_err(|e| driver_error("copying logits to the host", e))?;
        self.dev.synchronize()?;
        Ok(v)
    }

    /// Samples from the logits in the buffer (see the module comment); a
    /// constrained row goes through [`sample_rows`], whose tables hold masks.
    pub fn sample(&mut self, req: &SampleRequest) -> Result<SampledToken, BackendError> {
        if req.mask.is_some() {
            return Err(BackendError::CallerBug(
                "a masked row is sampled by sample_rows".into(),
            ));
        }
        match self.prepare(req)? {
            Choice::Argmax(a) => self.dev.kernels.launch(&self.dev.stream, &a)?,
            Choice::Select(a) => self.dev.kernels.launch(&self.dev.stream, &a)?,
        }
        self.queue_result(req)?;
        self.dev.synchronize()?;
        self.finish(req)
    }

    /// Checks `req`, copies the ids to penalize to the device, and says
    /// which kernel picks the token, with its arguments.
    fn prepare(&mut self, req: &SampleRequest) -> Result<Choice, BackendError> {
        let n = self.vocab;
        let p = req.params;
        if req.logprobs > SAMPLE_MAX_LOGPROBS {
            return Err(BackendError::InferenceFailed(format!(
                "{} log-probabilities asked, at most {SAMPLE_MAX_LOGPROBS}",
                req.logprobs
            )));
        }
        let greedy = p.temperature <= 0.0 || req.uniform.is_none();
        let uniform = req.uniform.unwrap_or(0.0);
        if !greedy && !(0.0..1.0).contains(&uniform) {
            return Err(BackendError::InferenceFailed(format!(
                "the draw {uniform} is outside [0, 1)"
            )));
        }
        // The penalty goes to each distinct in-vocabulary id once.
        self.distinct.clear();
        if p.repetition_penalty != 1.0 {
            self.distinct.extend(
                req.generated
                    .iter()
                    .copied()
                    .filter(|&id| (id as usize) < n),
            );
            self.distinct.sort_unstable();
            self.distinct.dedup();
        }
        debug_assert!(self.distinct.len() <= n);
        let args = SelectArgs {
            temperature: p.temperature,
            penalty: p.repetition_penalty,
            top_k: if p.top_k < n { p.top_k as u32 } else { 0 },
            top_p: p.top_p,
            min_p: p.min_p,
            uniform,
            scale: self.scale,
            greedy,
        };
        self.dev.bind()?;
        if req.adjusts() {
            // A constrained row's adjusted copy is queued by `queue_masks`.
            if req.mask.is_none() {
                self.copy_to_adjusted()?;
            }
            if !req.bias.is_empty() {
                self.apply_bias(req.bias)?;
            }
        }
        let stream = self.dev.cu_stream();
        if !self.distinct.is_empty() {
            // SAFETY: at most `vocab` ids into a `[vocab]` u32 buffer; pageable
            // memory is staged before the call returns.
            unsafe { drv::memcpy_htod_async(self.ids.ptr(), self.distinct.as_slice(), stream) }
                .map_err(|e| driver_error("copying the generated ids", e))?;
        }
        let out = self.out_ptr();
        let (logits, keys) = (
            DevPtr::new(self.source(req)),
            DevPtrMut::new(self.keys.ptr()),
        );
        let (vocab, pen_ids, n_pen) = (
            n as u32,
            Some(DevPtr::new(self.ids.ptr())),
            self.distinct.len() as u32,
        );
        if greedy && n_pen == 0 {
            let (partial, done) = (
                self.argmax.ptr(),
                self.argmax.ptr() + SAMPLE_ARGMAX_BLOCKS as u64 * 8,
            );
            return Ok(Choice::Argmax(SampleArgmaxArgs {
                logits,
                n: vocab,
                partial: DevPtrMut::new(partial),
                done: DevPtrMut::new(done),
                out,
            }));
        }
        Ok(Choice::Select(SampleSelectArgs {
            logits,
            n: vocab,
            keys,
            pen_ids,
            n_pen,
            p: args,
            out,
        }))
    }

    /// Queues the copy of the logits that the bias and the mask change.
    fn copy_to_adjusted(&self) -> Result<(), BackendError> {
        let bytes = self.vocab * 4;
        // SAFETY: both buffers hold `vocab` f32 values on this device.
        unsafe {
            drv::memcpy_dtod_async(
                self.adjusted.ptr(),
                self.logits.ptr(),
                bytes,
                self.dev.cu_stream(),
            )
        }
        .map_err(|e| driver_error("copying the logits to adjust them", e))
    }

    /// The logits `req` is sampled from: the adjusted copy where it adjusts.
    fn source(&self, req: &SampleRequest) -> CUdeviceptr {
        if req.adjusts() {
            self.adjusted.ptr()
        } else {
            self.logits.ptr()
        }
    }

    /// Queues the bias pairs' copy and `sample_bias` over the adjusted logits
    /// (after the mask; `backend::adjust` adds before it, the same values).
    fn apply_bias(&mut self, bias: &[(u32, f32)]) -> Result<(), BackendError> {
        check_bias(bias, self.vocab)?;
        self.pairs.clear();
        self.pairs
            .extend(bias.iter().flat_map(|&(id, delta)| [id, delta.to_bits()]));
        // SAFETY: at most `vocab` distinct ids (checked above), so at most
        // `2 * vocab` u32 into the bias buffer; pageable memory is staged
        // before the call returns.
        unsafe {
            drv::memcpy_htod_async(self.bias.ptr(), self.pairs.as_slice(), self.dev.cu_stream())
        }
        .map_err(|e| driver_error("copying the logit biases", e))?;
        let args = SampleBiasArgs {
            logits: DevPtrMut::new(self.adjusted.ptr()),
            n: self.vocab as u32,
            count: bias.len() as u32,
            pairs: DevPtr::new(self.bias.ptr()),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    /// After the choice: the log-probabilities' launch where asked for, and
    /// the result block's copy to the host.
    fn queue_result(&mut self, req: &SampleRequest) -> Result<(), BackendError> {
        let out = self.out_ptr();
        let (kernels, st) = (&self.dev.kernels, &self.dev.stream);
        if req.logprobs > 0 {
            kernels.launch(
                st,
                &SampleLogprobsArgs {
                    logits: DevPtr::new(self.source(req)),
                    n: self.vocab as u32,
                    keys: DevPtrMut::new(self.keys.ptr()),
                    k: req.logprobs as u32,
                    out,
                },
            )?;
        }
        // SAFETY: the result block holds SAMPLE_OUT_WORDS u32 values.
        unsafe {
            drv::memcpy_dtoh_async(self.result.as_mut_slice(), out.addr(), self.dev.cu_stream())
        }
        .map_err(|e| driver_error("copying the sampled token", e))
    }

    /// The token in the result block, once the stream has caught up.
    fn finish(&self, req: &SampleRequest) -> Result<SampledToken, BackendError> {
        let id = self.result[0];
        if id as usize >= self.vocab {
            return Err(BackendError::InferenceFailed(format!(
                "the sampler returned id {id} for a vocabulary of {}",
                self.vocab
            )));
        }
        let logprobs = if req.logprobs > 0 {
            self.logprobs(req.logprobs)
        } else {
            Vec::new()
        };
        Ok(SampledToken { id, logprobs })
    }

    /// The result block, which both sampling kernels write.
    fn out_ptr(&mut self) -> DevPtrMut<u32> {
        DevPtrMut::new(self.out.ptr())
    }

    /// The log-probabilities from the result block, as `top_logprobs`
    /// computes them: `(x − max − ln Σ e^(x − max))` in f64, in rank order
    /// (logit descending, ties by lower id).
    fn logprobs(&self, k: usize) -> Vec<TokenLogprob> {
        let r = &self.result;
        let count = (r[1] as usize).min(k);
        let max = f64::from(f32::from_bits(r[2]));
        let log_sum = f64::from_bits(u64::from(r[4]) | (u64::from(r[5]) << 32));
        let mut top: Vec<(u32, f32)> = (0..count)
            .map(|j| (r[8 + 2 * j], f32::from_bits(r[9 + 2 * j])))
            .collect();
        top.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        top.into_iter()
            .map(|(id, x)| TokenLogprob {
                id,
                logprob: (f64::from(x) - max - log_sum) as f32,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_scale_keeps_the_total_in_a_u64() {
        assert_eq!(weight_scale(151_936), 2f64.powi(45));
        assert_eq!(weight_scale(1 << 18), 2f64.powi(45));
        assert_eq!(weight_scale((1 << 18) + 1), 2f64.powi(44));
        assert_eq!(weight_scale(49_152), 2f64.powi(47));
        assert_eq!(weight_scale(1), 2f64.powi(63));
        assert_eq!(weight_scale(2), 2f64.powi(62));
        for n in [1usize, 2, 3, 33, 1000, 49_152, 151_936, 262_144, 1 << 20] {
            assert!(n as f64 * weight_scale(n) <= 2f64.powi(63), "{n}");
            assert!(
                n as f64 * weight_scale(n) * 2.0 > 2f64.powi(63),
                "{n}: the largest such scale"
            );
        }
    }
}
