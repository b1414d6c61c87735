//! Rows mode: one forward pass over a batched decode step, each row of x the
//! next token of a sequence of its own (`CudaBackend::decode_rows`).
//!
//! The graph runs unchanged; what depends on a row's sequence looks here
//! instead of at the pass's single cache and start position: every product
//! runs over all rows at once, reading each weight once for the step, on a
//! kernel whose per-row sums do not depend on how many rows there are
//! (`mv8n_*`, else `mv_*`, for one row as for many), so a row's logits are
//! the same bits whichever rows share its step; RoPE, the KV store and
//! attention run row by row, each with its own position and cache; the LM
//! head's rows go to each sequence's sampler.

use cudarc::driver::sys::CUdeviceptr;

use super::{
    check_bufs, matmul_args, shape_error, BufMem, CudaBuf, CudaCache, CudaOps, CudaWeight,
};
use crate::backend::cuda::kernels::Mv8Plan;
use crate::backend::BackendError;
use crate::model::ops::{AttentionShape, HeadNorms, QkPrep, RopeParams};

/// The sequences of a rows-mode pass, row by row.
pub struct RowsPass {
    /// Each row's position (its sequence's length before the step).
    pub positions: Vec<usize>,
    /// The caches of rows 1 and on; row 0's is the one the pass was given.
    pub caches: Vec<CudaCache>,
    /// Where each row's logits go (its sequence's sampler buffer).
    pub logits: Vec<CUdeviceptr>,
}

/// Row `i` of `x` as a matrix of its own, in `x`'s memory.
fn row_view(x: &CudaBuf, i: usize) -> CudaBuf {
    CudaBuf::new(BufMem::Arena(x.row_ptr(i)), 1, x.cols)
}

/// `p` at position `pos`.
fn rope_at(p: RopeParams<'_>, pos: usize) -> RopeParams<'_> {
    RopeParams {
        start_pos: pos,
        ..p
    }
}

/// `prep` for the row at position `pos`.
fn prep_at<'a>(prep: &QkPrep<'a, CudaWeight>, pos: usize) -> QkPrep<'a, CudaWeight> {
    QkPrep {
        norms: prep.norms.as_ref().map(|n| HeadNorms {
            q: n.q,
            k: n.k,
            eps: n.eps,
        }),
        rope: prep.rope.map(|(q, k)| (rope_at(q, pos), rope_at(k, pos))),
    }
}

/// `s` for the one row at position `pos`.
fn shape_at(s: AttentionShape, pos: usize) -> AttentionShape {
    AttentionShape {
        start_pos: pos,
        n_tokens: 1,
        ..s
    }
}

impl CudaOps {
    /// Starts a rows-mode pass (see the module doc): one position and one
    /// logits buffer per row, a cache for each row after the first. Never
    /// inside a graph capture.
    pub fn begin_rows(&mut self, rows: RowsPass) {
        let n = rows.positions.len();
        debug_assert!(n > 0 && rows.logits.len() == n && rows.caches.len() + 1 == n);
        debug_assert!(self.capture.is_none());
        self.rows = Some(rows);
    }

    /// Ends a rows-mode pass, giving back the caches of rows 1 and on.
    pub fn end_rows(&mut self) -> Vec<CudaCache> {
        self.rows.take().map(|r| r.caches).unwrap_or_default()
    }

    /// Whether a rows-mode pass is running.
    pub(super) fn in_rows(&self) -> bool {
        self.rows.is_some()
    }

    /// Runs `f` for every row with its position and cache (row 0's is
    /// `lead`); inside `f` the ops are out of rows mode, so single-row
    /// operations run as they do alone.
    pub(super) fn each_row(
        &mut self,
        lead: &mut CudaCache,
        mut f: impl FnMut(&mut CudaOps, usize, usize, &mut CudaCache) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let mut rows = self.rows.take().expect("in rows mode");
        let result = (0..rows.positions.len()).try_for_each(|i| {
            let cache = match i {
                0 => &mut *lead,
                _ => &mut rows.caches[i - 1],
            };
            f(self, i, rows.positions[i], cache)
        });
        self.rows = Some(rows);
        result
    }

    /// [`CudaOps::each_row`] for operations that touch no cache.
    fn each_position(
        &mut self,
        mut f: impl FnMut(&mut CudaOps, usize, usize) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let rows = self.rows.take().expect("in rows mode");
        let result = (rows.positions.iter().enumerate()).try_for_each(|(i, &pos)| f(self, i, pos));
        self.rows = Some(rows);
        result
    }

    /// Checks that a rows-mode operation's buffers hold one row per sequence.
    fn check_rows(&self, what: &str, bufs: &[&CudaBuf]) -> Result<(), BackendError> {
        let n = self.rows.as_ref().map_or(0, |r| r.positions.len());
        if bufs.iter().any(|b| b.rows != n) {
            return Err(shape_error(format!("{what}: rows mode over {n} sequences")));
        }
        check_bufs(what, bufs)
    }

    /// A product of a batched decode step (see the module doc).
    pub(super) fn matmul_rows(
        &mut self,
        x: &CudaBuf,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let args = matmul_args(x, w, bias, out)?;
        self.dev.bind()?;
        if self.dev.kernels.mv8_applies(&args)
            && self.matmul_x8_plan(x, &args, Mv8Plan::Rows, out)?
        {
            return Ok(());
        }
        self.dev.kernels.matmul_rows(&self.dev.stream, &args)
    }

    /// `Ops::attend` in rows mode: each row's norms, rotation, store and
    /// attention as alone.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_rows(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        prep: &QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        self.check_rows("attend", &[q, k, v, out])?;
        self.each_row(cache, |ops, i, pos, c| {
            let (mut qi, mut ki, vi, mut oi) = (
                row_view(q, i),
                row_view(k, i),
                row_view(v, i),
                row_view(out, i),
            );
            let prep = prep_at(prep, pos);
            crate::model::ops::Ops::attend(
                ops,
                &mut qi,
                &mut ki,
                &vi,
                prep,
                c,
                shape_at(s, pos),
                &mut oi,
            )
        })
    }

    /// `Ops::attention` (with sinks where given) in rows mode.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_rows(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: Option<&CudaWeight>,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        self.check_rows("attention", &[q, k, v, out])?;
        self.each_row(cache, |ops, i, pos, c| {
            let (qi, ki, vi, mut oi) = (
                row_view(q, i),
                row_view(k, i),
                row_view(v, i),
                row_view(out, i),
            );
            let s = shape_at(s, pos);
            match sinks {
                Some(w) => {
                    crate::model::ops::Ops::attention_sinks(ops, &qi, &ki, &vi, c, s, w, &mut oi)
                }
                None => crate::model::ops::Ops::attention(ops, &qi, &ki, &vi, c, s, &mut oi),
            }
        })
    }

    /// `Ops::rope_qk` in rows mode: each row turned by its own position.
    pub(super) fn rope_qk_rows(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        pq: RopeParams<'_>,
        pk: RopeParams<'_>,
    ) -> Result<(), BackendError> {
        self.check_rows("rope", &[q, k])?;
        self.each_position(|ops, i, pos| {
            let (mut qi, mut ki) = (row_view(q, i), row_view(k, i));
            crate::model::ops::Ops::rope_qk(
                ops,
                &mut qi,
                &mut ki,
                rope_at(pq, pos),
                rope_at(pk, pos),
            )
        })
    }

    /// `Ops::rope` in rows mode.
    pub(super) fn rope_rows(&mut self, x: &CudaBuf, p: RopeParams<'_>) -> Result<(), BackendError> {
        self.check_rows("rope", &[x])?;
        self.each_position(|ops, i, pos| {
            crate::model::ops::Ops::rope(ops, &mut row_view(x, i), rope_at(p, pos))
        })
    }

    /// Each row's learned position (GPT-2) in rows mode.
    pub(super) fn rows_positions(&self) -> Vec<u32> {
        self.rows
            .as_ref()
            .map(|r| r.positions.iter().map(|&p| p as u32).collect())
            .unwrap_or_default()
    }

    /// `keep_last_row` in rows mode: row `i` of the logits to sequence `i`'s
    /// sampler.
    pub(super) fn keep_rows(&mut self, x: &CudaBuf, len: usize) -> Result<(), BackendError> {
        self.check_rows("keep_last_row", &[x])?;
        if x.cols != len {
            return Err(shape_error(format!(
                "keep_last_row: {}x{} for {len} logits",
                x.rows, x.cols
            )));
        }
        let dsts = self.rows.as_ref().expect("in rows mode").logits.clone();
        self.dev.bind()?;
        self.dev.kernels.note_write();
        for (i, dst) in dsts.into_iter().enumerate() {
            // SAFETY: one row of `len` f32 inside the block, into a sampler
            // buffer of `len` f32.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst,
                    x.row_ptr(i),
                    len * 4,
                    self.dev.cu_stream(),
                )
            }
            .map_err(|e| crate::backend::cuda::device::driver_error("keeping a row's logits", e))?;
        }
        Ok(())
    }
}
