//! The kernels of `cuda/sample.cu`: the sampling pipeline over one logit
//! vector (`sample_select`) or each row of a batched step's
//! (`sample_select_rows`), greedy sampling over many blocks
//! (`sample_argmax`), the top log-probabilities (`sample_logprobs`), and a
//! job's adjustments before them (`sample_mask_rows`, `sample_bias`).

use cudarc::driver::LaunchConfig;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    blocks, kernel_params, plan, refusal, unit_kernels, Family, KernelCall, Plan, Work,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    Module, SAMPLE_ARGMAX_BLOCKS, SAMPLE_ARGMAX_THREADS, SAMPLE_MAX_LOGPROBS, SAMPLE_THREADS,
};
use crate::backend::BackendError;

unit_kernels! {
    /// The kernels of `sample.cu`.
    pub enum Sample {
        /// `sample_select`: the sampling pipeline over one logit vector.
        Select = "sample_select",
        /// `sample_select_rows`: `sample_select` for each sequence of a batched
        /// decode step, a block each.
        SelectRows = "sample_select_rows",
        /// `sample_argmax`: greedy sampling without a penalty, over many blocks.
        Argmax = "sample_argmax",
        /// `sample_logprobs`: the top log-probabilities of one logit vector.
        Logprobs = "sample_logprobs",
        /// `sample_mask_rows`: each constrained row's logits, masked, into its
        /// sampler's adjusted copy.
        MaskRows = "sample_mask_rows",
        /// `sample_bias`: a job's additive biases applied to one logit vector.
        Bias = "sample_bias",
    }
}

impl Family for Sample {
    const MODULE: Module = Module::Sample;

    fn all() -> Vec<Sample> {
        Sample::ALL.to_vec()
    }
    fn symbol(self) -> String {
        self.name().into()
    }
    fn part(self) -> Option<u8> {
        match self {
            Sample::Select | Sample::SelectRows => Some(0),
            Sample::Argmax | Sample::Logprobs | Sample::MaskRows | Sample::Bias => Some(1),
        }
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        match (self, work) {
            (Sample::Argmax, Work::Elements(n)) => {
                Some(Ok(blocks((argmax_blocks(n), 1), SAMPLE_ARGMAX_THREADS)))
            }
            (Sample::MaskRows, Work::Rows { rows, cols }) if rows > 0 && rows <= 65535 => {
                Some(Ok(blocks(
                    (
                        cols.div_ceil(SAMPLE_MASK_THREADS as usize) as u32,
                        rows as u32,
                    ),
                    SAMPLE_MASK_THREADS,
                )))
            }
            (Sample::Bias, Work::Elements(n)) if n > 0 => Some(Ok(blocks(
                (n.div_ceil(SAMPLE_BIAS_THREADS as usize) as u32, 1),
                SAMPLE_BIAS_THREADS,
            ))),
            (Sample::Select | Sample::Logprobs, Work::Single) => {
                Some(Ok(blocks((1, 1), SAMPLE_THREADS)))
            }
            (Sample::SelectRows, Work::Rows { rows, .. }) if rows > 0 && rows <= 65535 => {
                Some(Ok(blocks((rows as u32, 1), SAMPLE_THREADS)))
            }
            _ => None,
        }
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            Sample::Select => pushed::<SampleSelectArgs>(),
            Sample::SelectRows => pushed::<SampleSelectRowsArgs>(),
            Sample::Argmax => pushed::<SampleArgmaxArgs>(),
            Sample::Logprobs => pushed::<SampleLogprobsArgs>(),
            Sample::MaskRows => pushed::<SampleMaskRowsArgs>(),
            Sample::Bias => pushed::<SampleBiasArgs>(),
        }
    }
}

/// Threads of a `sample_mask_rows` block (as `SAMPLE_MASK_THREADS` in sample.cu).
const SAMPLE_MASK_THREADS: u32 = 256;

/// One constrained row's buffers in `sample_mask_rows`'s table (sample.cu's
/// `MaskRow`: the same fields in the same order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MaskRow {
    /// `[n]` f32: the step's logits.
    pub logits: u64,
    /// `[n]` f32: the sampler's adjusted copy, written.
    pub adjusted: u64,
}

impl crate::backend::cuda::ptr::Elem for MaskRow {
    #[cfg(test)]
    const C_NAME: &'static str = "MaskRow";
}

/// `sample_mask_rows`: for each of `rows` rows, its logits into its
/// adjusted buffer with every token whose bit in the row's mask is clear at
/// -inf.
#[derive(Clone, Copy, Debug)]
pub struct SampleMaskRowsArgs {
    /// `[rows]` [`MaskRow`]s.
    pub table: DevPtr<MaskRow>,
    pub rows: usize,
    pub n: u32,
    /// `[rows * words]` u32: row r's mask at `r * words`; bit `id % 32` of
    /// word `id / 32` allows `id`.
    pub masks: DevPtr<u32>,
    /// `ceil(n / 32)`.
    pub words: u32,
}

impl KernelCall for SampleMaskRowsArgs {
    type Kernel = Sample;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [("table", self.table.addr()), ("masks", self.masks.addr())];
        let n = self.n as usize;
        plan(
            Sample::MaskRows,
            [("n", n), ("rows", self.rows)],
            buffers,
            Work::Rows {
                rows: self.rows,
                cols: n,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.words as usize != (self.n as usize).div_ceil(32) {
            return Err(refusal(
                Sample::MaskRows,
                format!("{} mask words for {} logits", self.words, self.n),
            ));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<MaskRow> = self.table,
        u32 = self.n,
        DevPtr<u32> = self.masks,
        u32 = self.words,
    }
}

/// Threads of a `sample_bias` block (as `SAMPLE_BIAS_THREADS` in sample.cu).
const SAMPLE_BIAS_THREADS: u32 = 256;

/// `sample_bias`: `count` (id, delta) pairs added to the logits.
#[derive(Clone, Copy, Debug)]
pub struct SampleBiasArgs {
    /// `[n]` f32, changed in place.
    pub logits: DevPtrMut<f32>,
    pub n: u32,
    /// At least 1.
    pub count: u32,
    /// `[2 * count]` u32: each pair's id (distinct, below `n`), then its
    /// delta's f32 bits.
    pub pairs: DevPtr<u32>,
}

impl KernelCall for SampleBiasArgs {
    type Kernel = Sample;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [("logits", self.logits.addr()), ("pairs", self.pairs.addr())];
        let count = self.count as usize;
        plan(
            Sample::Bias,
            [("n", self.n as usize), ("count", count)],
            buffers,
            Work::Elements(count),
        )
    }
    kernel_params! { self =>
        DevPtrMut<f32> = self.logits,
        u32 = self.count,
        DevPtr<u32> = self.pairs,
    }
}

/// Blocks of `sample_argmax` over `n` logits: eight a thread, at most
/// `SAMPLE_ARGMAX_BLOCKS` (its buffer of partial results).
pub fn argmax_blocks(n: usize) -> u32 {
    let per_block = SAMPLE_ARGMAX_THREADS as usize * 8;
    n.div_ceil(per_block).clamp(1, SAMPLE_ARGMAX_BLOCKS) as u32
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

/// `sample_select`: picks one token from `n` logits by the sampling
/// pipeline (one block; see sample.cu for the algorithm).
#[derive(Clone, Copy, Debug)]
pub struct SampleSelectArgs {
    /// `[n]` f32.
    pub logits: DevPtr<f32>,
    pub n: u32,
    /// `[n]` u32 scratch.
    pub keys: DevPtrMut<u32>,
    /// `[n_pen]` u32, distinct ids `< n` to penalize; needed when `n_pen > 0`.
    pub pen_ids: Option<DevPtr<u32>>,
    pub n_pen: u32,
    /// `top_k`: 0 or `0 < top_k < n`; `uniform`: in `[0, 1)`, unused when `greedy`.
    pub p: SelectArgs,
    /// `[SAMPLE_OUT_WORDS]` u32; word 0 receives the id.
    pub out: DevPtrMut<u32>,
}

impl KernelCall for SampleSelectArgs {
    type Kernel = Sample;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [
            ("logits", self.logits.addr()),
            ("keys", self.keys.addr()),
            ("out", self.out.addr()),
        ];
        plan(
            Sample::Select,
            [("n", self.n as usize)],
            buffers,
            Work::Single,
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.n_pen > 0 && DevPtr::or_null(self.pen_ids).addr() == 0 {
            return Err(refusal(Sample::Select, "buffer pen_ids is null".into()));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.logits,
        u32 = self.n,
        DevPtrMut<u32> = self.keys,
        DevPtr<u32> = DevPtr::or_null(self.pen_ids),
        u32 = self.n_pen,
        f32 = self.p.temperature,
        f32 = self.p.penalty,
        u32 = self.p.top_k,
        f32 = self.p.top_p,
        f32 = self.p.min_p,
        f64 = self.p.uniform,
        f64 = self.p.scale,
        i32 = i32::from(self.p.greedy),
        DevPtrMut<u32> = self.out,
    }
}

/// One sequence's `sample_select` arguments in `sample_select_rows`'s table
/// (sample.cu's `SampleRow`: the same fields in the same order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SampleRow {
    /// `[n]` f32.
    pub logits: u64,
    /// `[n]` u32 scratch.
    pub keys: u64,
    /// `[n_pen]` u32, or 0 when `n_pen` is 0.
    pub pen_ids: u64,
    /// `[SAMPLE_OUT_WORDS]` u32; word 0 receives the id.
    pub out: u64,
    pub uniform: f64,
    pub n_pen: u32,
    pub temperature: f32,
    pub penalty: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub greedy: i32,
    pub pad: u32,
}

impl crate::backend::cuda::ptr::Elem for SampleRow {
    #[cfg(test)]
    const C_NAME: &'static str = "SampleRow";
}

impl SampleRow {
    /// The row of one `sample_select` launch's arguments.
    pub fn of(a: &SampleSelectArgs) -> SampleRow {
        let p = &a.p;
        SampleRow {
            logits: a.logits.addr(),
            keys: a.keys.addr(),
            pen_ids: DevPtr::or_null(a.pen_ids).addr(),
            out: a.out.addr(),
            uniform: p.uniform,
            n_pen: a.n_pen,
            temperature: p.temperature,
            penalty: p.penalty,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            greedy: i32::from(p.greedy),
            pad: 0,
        }
    }
}

/// `sample_select_rows`: `sample_select` for each of `rows` sequences of a
/// batched decode step, one block each, every row's arguments in the table
/// (`rows` [`SampleRow`]s on the device), all over vocabularies of `n`
/// tokens with the same fixed-point `scale`.
#[derive(Clone, Copy, Debug)]
pub struct SampleSelectRowsArgs {
    pub table: DevPtr<SampleRow>,
    pub rows: usize,
    pub n: u32,
    pub scale: f64,
}

impl KernelCall for SampleSelectRowsArgs {
    type Kernel = Sample;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Sample::SelectRows,
            [("n", self.n as usize), ("rows", self.rows)],
            [("table", self.table.addr())],
            Work::Rows {
                rows: self.rows,
                cols: self.n as usize,
            },
        )
    }
    kernel_params! { self =>
        DevPtr<SampleRow> = self.table,
        u32 = self.n,
        f64 = self.scale,
    }
}

/// `sample_logprobs`: the `k` most likely of `n` logits, unordered, with
/// the max and log-sum-exp for their log-softmax (one block).
#[derive(Clone, Copy, Debug)]
pub struct SampleLogprobsArgs {
    /// `[n]` f32.
    pub logits: DevPtr<f32>,
    pub n: u32,
    /// `[n]` u32 scratch.
    pub keys: DevPtrMut<u32>,
    /// `0 < k <= SAMPLE_MAX_LOGPROBS`.
    pub k: u32,
    /// `[SAMPLE_OUT_WORDS]` u32, 8-byte aligned; words 1.. receive the result.
    pub out: DevPtrMut<u32>,
}

impl KernelCall for SampleLogprobsArgs {
    type Kernel = Sample;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [
            ("logits", self.logits.addr()),
            ("keys", self.keys.addr()),
            ("out", self.out.addr()),
        ];
        plan(
            Sample::Logprobs,
            [("n", self.n as usize), ("k", self.k as usize)],
            buffers,
            Work::Single,
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.k as usize > SAMPLE_MAX_LOGPROBS {
            return Err(refusal(
                Sample::Logprobs,
                format!("k = {} exceeds {SAMPLE_MAX_LOGPROBS}", self.k),
            ));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.logits,
        u32 = self.n,
        DevPtrMut<u32> = self.keys,
        u32 = self.k,
        DevPtrMut<u32> = self.out,
    }
}

/// `sample_argmax`: the greedy choice among `n` logits (the lowest id of the
/// largest; NaN never wins unless all are), over [`argmax_blocks`]`(n)`
/// blocks whose partial results meet in `partial`.
#[derive(Clone, Copy, Debug)]
pub struct SampleArgmaxArgs {
    /// `[n]` f32.
    pub logits: DevPtr<f32>,
    pub n: u32,
    /// `[SAMPLE_ARGMAX_BLOCKS]` u64 scratch.
    pub partial: DevPtrMut<u64>,
    /// One u32, 0 before the launch (the kernel leaves it 0).
    pub done: DevPtrMut<u32>,
    /// Word 0 receives the id.
    pub out: DevPtrMut<u32>,
}

impl KernelCall for SampleArgmaxArgs {
    type Kernel = Sample;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [
            ("logits", self.logits.addr()),
            ("partial", self.partial.addr()),
            ("done", self.done.addr()),
            ("out", self.out.addr()),
        ];
        let n = self.n as usize;
        plan(Sample::Argmax, [("n", n)], buffers, Work::Elements(n))
    }
    kernel_params! { self =>
        DevPtr<f32> = self.logits,
        u32 = self.n,
        DevPtrMut<u64> = self.partial,
        DevPtrMut<u32> = self.done,
        DevPtrMut<u32> = self.out,
    }
}
