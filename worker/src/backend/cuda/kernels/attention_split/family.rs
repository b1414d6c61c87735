//! Of `attention_split.cu`'s family (`attention_split/mod.rs` says what each file holds):
//! the family's enum (`AttentionSplit`), the split kernels and their
//! merge.

use half::f16;

use crate::backend::cuda::kernels::attention::validate_head_split;
use crate::backend::cuda::kernels::launch::{kernel_params, plan, refusal, KernelCall, Plan, Work};
use crate::backend::cuda::kernels::operands::{CacheWindow, WindowParams, X8Bufs, X8Writes};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{ATS_MAX_GROUP, ATS_MAX_SPLITS, ATT_MAX_HEAD_DIM};
use crate::backend::BackendError;

/// The kernels of `attention_split.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionSplit {
    /// `attention_split_<64 * n>_g<g>`: one query row over a long context,
    /// the context split into chunks across blocks, for heads of up to 64 * n
    /// dims (n = 1, 2, 4) and up to g query heads per KV head (g = 4, 8);
    /// `attention_combine` merges the chunks.
    Scalar(u8, u8),
    /// `attention_split_tc_<64 * n>`: the same on tensor cores for heads of
    /// exactly 64 * n dims (n = 1, 2) and any group of up to 8 (the group's
    /// query heads are the rows of the products).
    Tc(u8),
    Combine,
    /// `attention_split_*_rows`: `Scalar` for a batched decode
    /// step, each row over its own cache in chunks of `ATS_ROW_CHUNK`.
    ScalarRows(u8, u8),
    /// `attention_split_tc_*_rows`: the same on tensor cores.
    TcRows(u8),
    /// `attention_combine_rows`: the merge of each row's chunks.
    CombineRows,
}

/// From this many context positions on, a decode step's attention is split
/// over the context (`attention_split`); below, one block per head is faster.
pub const SPLIT_MIN_CONTEXT: usize = 1024;

/// `attention_split` blocks per SM: the fastest of 1, 2 and 4 measured at
/// depth 4096 (`benches/results/kernel-choices.md`). The tensor-core kernel
/// (heads of 64 and 128 dims) takes chunks of at least 128 keys, so at that
/// depth fewer chunks are filled and the count barely mattered; the bound
/// matters for longer contexts.
pub const SPLIT_BLOCKS_PER_SM: usize = 4;

/// How `attention_split` divides a context: into `nsplit` chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextSplit {
    pub nsplit: usize,
}

/// The `attention_split_*` instance for heads of `head_dim` and `group`
/// query heads per KV head: the tensor-core kernel for heads of 64 or 128
/// dims; else dim pairs per lane, 1, 2 or 4, and most heads, 4 or 8 (larger
/// heads and groups are refused by `validate`).
pub(crate) fn split_kernel(head_dim: usize, group: usize) -> AttentionSplit {
    let pairs = crate::backend::cuda::source::head_pairs(head_dim);
    if crate::backend::cuda::source::split_on_tensor_cores(head_dim) {
        return AttentionSplit::Tc(pairs);
    }
    AttentionSplit::Scalar(pairs, if group <= 4 { 4 } else { 8 })
}

/// Refuses heads the split kernels do not take: a group of more than
/// `ATS_MAX_GROUP` query heads per KV head, heads not of whole 8-value
/// chunks or wider than `ATT_MAX_HEAD_DIM`.
pub(crate) fn check_split_heads(
    k: AttentionSplit,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
) -> Result<(), BackendError> {
    let group = n_head / n_head_kv.max(1);
    if n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) || group > ATS_MAX_GROUP {
        return Err(refusal(k, format!("{n_head}/{n_head_kv} heads")));
    }
    if !head_dim.is_multiple_of(8) || head_dim > ATT_MAX_HEAD_DIM {
        return Err(refusal(k, format!("heads of {head_dim}")));
    }
    Ok(())
}

/// `attention_split`: one query row (decode) over a long context split into
/// `nsplit` chunks of equal length (fixed at run time from the position);
/// block (KV head, chunk) writes the softmax state of its chunk for every
/// query head of the group to `part`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSplitArgs {
    /// `[n_head * head_dim]` f32, at position `start_pos`.
    pub q: DevPtr<f32>,
    /// A multiple of `n_head_kv`, at most `ATS_MAX_GROUP` times it.
    pub n_head: usize,
    pub n_head_kv: usize,
    /// A multiple of 8, at most `ATT_MAX_HEAD_DIM`.
    pub head_dim: usize,
    pub window: CacheWindow,
    /// `[n_head_kv, capacity, head_dim]` f16 each, filled up to `start_pos + 1`.
    pub k_cache: DevPtr<f16>,
    pub v_cache: DevPtr<f16>,
    pub scale: f32,
    /// As [`AttentionArgs::sliding`](crate::backend::cuda::kernels::attention::AttentionArgs::sliding); the chunks cover only the visible positions.
    pub sliding: usize,
    /// At least 1, at most `ATS_MAX_SPLITS`.
    pub nsplit: usize,
    /// `[n_head, nsplit, head_dim + 2]` f32: max, sum of weights, then the unnormalised output.
    pub part: DevPtrMut<f32>,
}

impl KernelCall for AttentionSplitArgs {
    type Kernel = AttentionSplit;
    fn plan(&self) -> Plan<Self::Kernel> {
        let (kv, hd, capacity) = (self.n_head_kv, self.head_dim, self.window.capacity);
        let dims = [
            ("n_head", self.n_head),
            ("n_head_kv", kv),
            ("head_dim", hd),
            ("capacity", capacity),
        ];
        let dims = [dims[0], dims[1], dims[2], dims[3], ("nsplit", self.nsplit)];
        let (q, kc, vc, part) = (
            self.q.addr(),
            self.k_cache.addr(),
            self.v_cache.addr(),
            self.part.addr(),
        );
        let buffers = [("q", q), ("k_cache", kc), ("v_cache", vc), ("part", part)];
        plan(
            split_kernel(hd, self.n_head / kv.max(1)),
            dims,
            buffers,
            Work::Chunks {
                n_head_kv: kv,
                nsplit: self.nsplit,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let group = self.n_head / self.n_head_kv.max(1);
        let k = split_kernel(self.head_dim, group);
        check_split_heads(k, self.n_head, self.n_head_kv, self.head_dim)?;
        if self.sliding > self.window.capacity {
            return Err(refusal(k, format!("a window of {}", self.sliding)));
        }
        if self.nsplit == 0 || self.nsplit > ATS_MAX_SPLITS {
            return Err(refusal(k, format!("{} chunks", self.nsplit)));
        }
        self.window.check(k, 1)
    }
    kernel_params! { self =>
        DevPtr<f32> = self.q,
        i32 = self.n_head as i32,
        i32 = self.n_head_kv as i32,
        i32 = self.head_dim as i32,
        ..WindowParams = self.window.params(),
        DevPtr<f16> = self.k_cache,
        DevPtr<f16> = self.v_cache,
        f32 = self.scale,
        i32 = self.sliding as i32,
        i32 = self.nsplit as i32,
        DevPtrMut<f32> = self.part,
    }
}

/// `attention_combine`: `out[h]` = the merge of head `h`'s `nsplit` chunk
/// states in `part`, in chunk order.
#[derive(Clone, Copy, Debug)]
pub struct AttentionCombineArgs {
    /// `[n_head, nsplit, head_dim + 2]` f32, as `attention_split` wrote it.
    pub part: DevPtr<f32>,
    pub n_head: usize,
    pub head_dim: usize,
    /// At most `ATS_MAX_SPLITS`.
    pub nsplit: usize,
    /// As [`AttentionArgs::sinks`](crate::backend::cuda::kernels::attention::AttentionArgs::sinks).
    pub sinks: Option<DevPtr<f32>>,
    /// `[n_head * head_dim]` f32.
    pub out: DevPtrMut<f32>,
    /// As [`AttentionArgs::x8`](crate::backend::cuda::kernels::attention::AttentionArgs::x8).
    pub x8: Option<X8Bufs>,
}

impl KernelCall for AttentionCombineArgs {
    type Kernel = AttentionSplit;
    fn plan(&self) -> Plan<Self::Kernel> {
        let dims = [
            ("n_head", self.n_head),
            ("head_dim", self.head_dim),
            ("nsplit", self.nsplit),
        ];
        let buffers = [("part", self.part.addr()), ("out", self.out.addr())];
        plan(
            AttentionSplit::Combine,
            dims,
            buffers,
            Work::Rows {
                rows: self.n_head,
                cols: self.head_dim,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.nsplit > ATS_MAX_SPLITS {
            return Err(refusal(
                AttentionSplit::Combine,
                format!("{} chunks", self.nsplit),
            ));
        }
        validate_head_split(AttentionSplit::Combine, self.x8, 1, self.head_dim, false)
    }
    kernel_params! { self =>
        DevPtr<f32> = self.part,
        i32 = self.n_head as i32,
        i32 = self.head_dim as i32,
        i32 = self.nsplit as i32,
        DevPtr<f32> = DevPtr::or_null(self.sinks),
        DevPtrMut<f32> = self.out,
        ..X8Writes = X8Bufs::writes_or_null(self.x8),
    }
}
