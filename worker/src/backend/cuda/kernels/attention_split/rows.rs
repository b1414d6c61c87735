//! A batched decode step's split attention: each row's sequence is an
//! entry of a device table ([`RowSeq`]), each row over its own cache in
//! chunks of `ATS_ROW_CHUNK` positions (`attention_split_*_rows`), then
//! each row's chunks merged (`attention_combine_rows`).

use super::family::{check_split_heads, split_kernel, AttentionSplit};
use crate::backend::cuda::kernels::launch::{kernel_params, plan, refusal, KernelCall, Plan, Work};
use crate::backend::cuda::kernels::operands::RowSeq;
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{ATS_MAX_SPLITS, ATS_ROW_CHUNK, ATT_MAX_HEAD_DIM};
use crate::backend::BackendError;

/// Chunks `attention_split_*_rows` cuts a context into for a row at `pos`
/// in a cache of `capacity` with a sliding window of `sliding` (0: none):
/// attention_split.cu's `rows_nsplit`, which depends on the row alone.
pub fn rows_nsplit(pos: usize, capacity: usize, sliding: usize) -> usize {
    let n_ctx = (pos + 1).min(capacity);
    let first = if sliding > 0 {
        (pos + 1).saturating_sub(sliding)
    } else {
        0
    };
    n_ctx
        .saturating_sub(first)
        .div_ceil(ATS_ROW_CHUNK)
        .clamp(1, ATS_MAX_SPLITS)
}

/// The most chunks any of these rows' attention takes with a window of
/// `sliding` positions (0: none; no window gives the most).
pub fn most_splits(seqs: &[RowSeq], sliding: usize) -> usize {
    seqs.iter()
        .map(|q| rows_nsplit(q.pos as usize, q.capacity as usize, sliding))
        .max()
        .unwrap_or(1)
}

/// The `attention_split_*_rows` instance for heads of `head_dim` and
/// `group` query heads per KV head: the rows form of the one
/// `attention_split_*` takes.
pub(crate) fn split_rows_kernel(head_dim: usize, group: usize) -> AttentionSplit {
    match split_kernel(head_dim, group) {
        AttentionSplit::Tc(pairs) => AttentionSplit::TcRows(pairs),
        AttentionSplit::Scalar(pairs, g) => AttentionSplit::ScalarRows(pairs, g),
        k => unreachable!("{k:?} is not a split attention kernel"),
    }
}

/// `attention_split_*_rows`: one query row per sequence, each over its own
/// cache, the context cut into [`rows_nsplit`] chunks per row; block (KV
/// head, chunk, row) writes its chunk's softmax states to `part`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSplitRowsArgs {
    /// `[rows, n_head * head_dim]` f32.
    pub q: DevPtr<f32>,
    pub rows: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// A multiple of 8, at most `ATT_MAX_HEAD_DIM`.
    pub head_dim: usize,
    /// `[rows]` [`RowSeq`], every position's K and V already stored.
    pub seqs: DevPtr<RowSeq>,
    pub layer: usize,
    pub scale: f32,
    /// A sliding window's positions, or 0.
    pub sliding: usize,
    /// At least every row's [`rows_nsplit`], at most `ATS_MAX_SPLITS`.
    pub max_splits: usize,
    /// `[rows, n_head, max_splits, head_dim + 2]` f32.
    pub part: DevPtrMut<f32>,
}

impl KernelCall for AttentionSplitRowsArgs {
    type Kernel = AttentionSplit;
    fn plan(&self) -> Plan<Self::Kernel> {
        let dims = [
            ("rows", self.rows),
            ("n_head", self.n_head),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("max_splits", self.max_splits),
        ];
        let buffers = [
            ("q", self.q.addr()),
            ("seqs", self.seqs.addr()),
            ("part", self.part.addr()),
        ];
        let k = split_rows_kernel(self.head_dim, self.n_head / self.n_head_kv.max(1));
        let work = Work::RowChunks {
            n_head_kv: self.n_head_kv,
            nsplit: self.max_splits,
            rows: self.rows,
        };
        plan(k, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = split_rows_kernel(self.head_dim, self.n_head / self.n_head_kv.max(1));
        check_split_heads(k, self.n_head, self.n_head_kv, self.head_dim)?;
        if self.max_splits > ATS_MAX_SPLITS || self.layer > i32::MAX as usize {
            let msg = format!("{} chunks, layer {}", self.max_splits, self.layer);
            return Err(refusal(k, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.q,
        i32 = self.n_head as i32,
        i32 = self.n_head_kv as i32,
        i32 = self.head_dim as i32,
        DevPtr<RowSeq> = self.seqs,
        i32 = self.layer as i32,
        f32 = self.scale,
        i32 = self.sliding as i32,
        i32 = self.max_splits as i32,
        DevPtrMut<f32> = self.part,
    }
}

/// `attention_combine_rows`: row `r`'s head `h` = the merge of its chunk
/// states in `part`, in chunk order (as `attention_combine` merges one
/// query's).
#[derive(Clone, Copy, Debug)]
pub struct AttentionCombineRowsArgs {
    /// As [`AttentionSplitRowsArgs::part`] wrote it.
    pub part: DevPtr<f32>,
    pub rows: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub seqs: DevPtr<RowSeq>,
    /// As the split's.
    pub sliding: usize,
    pub max_splits: usize,
    /// Each head's sink logit, or none.
    pub sinks: Option<DevPtr<f32>>,
    /// `[rows, n_head * head_dim]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for AttentionCombineRowsArgs {
    type Kernel = AttentionSplit;
    fn plan(&self) -> Plan<Self::Kernel> {
        let dims = [
            ("rows", self.rows),
            ("n_head", self.n_head),
            ("head_dim", self.head_dim),
            ("max_splits", self.max_splits),
        ];
        let buffers = [
            ("part", self.part.addr()),
            ("seqs", self.seqs.addr()),
            ("out", self.out.addr()),
        ];
        let work = Work::Heads {
            n: self.rows,
            n_head: self.n_head,
        };
        plan(AttentionSplit::CombineRows, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.max_splits > ATS_MAX_SPLITS || self.head_dim > ATT_MAX_HEAD_DIM {
            let msg = format!("{} chunks of heads of {}", self.max_splits, self.head_dim);
            return Err(refusal(AttentionSplit::CombineRows, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.part,
        i32 = self.n_head as i32,
        i32 = self.head_dim as i32,
        DevPtr<RowSeq> = self.seqs,
        i32 = self.sliding as i32,
        i32 = self.max_splits as i32,
        DevPtr<f32> = DevPtr::or_null(self.sinks),
        DevPtrMut<f32> = self.out,
    }
}
