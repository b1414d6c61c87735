//! The split-context decode attention's choices on `CudaOps`: when a step
//! splits, and where its chunk states live.

use super::buffers::{BufMem, CudaBuf};
use super::CudaOps;
use crate::backend::cuda::kernels::ContextSplit;
use crate::backend::cuda::source::ATS_MAX_GROUP;
use crate::backend::BackendError;
use crate::model::ops::AttentionShape;

impl CudaOps {
    /// How a decode step's attention is split over a cache of `capacity`
    /// positions, when it is: one query row, a context long enough (known
    /// on the host, or chosen for a captured graph), and a shape the split
    /// kernel takes (see `AttentionSplitArgs`).
    pub(super) fn context_split(
        &self,
        s: &AttentionShape,
        capacity: usize,
    ) -> Option<ContextSplit> {
        let kernels = &self.dev.kernels;
        let long = match &self.capture {
            Some(c) => c.split_attention,
            None => kernels.splits_attention_at(s.start_pos + 1),
        };
        let group = s.n_head / s.n_head_kv;
        let shape_ok = group <= ATS_MAX_GROUP && s.head_dim.is_multiple_of(8);
        if s.n_tokens != 1 || !long || !shape_ok {
            return None;
        }
        Some(kernels.context_split(s.n_head_kv, capacity))
    }

    /// Scratch for the split attention's chunk states: while capturing, one
    /// arena block shared by every layer (they run one after another on the
    /// stream); otherwise a stream-ordered block of its own.
    pub(super) fn split_part(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        if let Some((ptr, r, c)) = self.capture.as_ref().and_then(|c| c.split_part) {
            if (r, c) == (rows, cols) {
                return Ok(CudaBuf::new(BufMem::Arena(ptr), rows, cols));
            }
        }
        let b = self.alloc_buf(rows, cols)?;
        if let Some(c) = &mut self.capture {
            c.split_part = Some((b.ptr(), rows, cols));
        }
        Ok(b)
    }
}
