//! What `CudaOps` keeps between operations: RoPE's frequency tables on the
//! device, the blocks x is split into for the products, the cuBLAS handle,
//! and a rows-mode pass's sequences and their device table (`rows.rs`).

use crate::backend::cuda::blas::Blas;
use crate::backend::cuda::device::DevBuf;
use crate::backend::cuda::kernels::RowSeq;
use crate::backend::cuda::ops::buffers::CudaCache;
use crate::backend::cuda::ptr::DevPtr;

/// `freq_base^(-2i / n_rot) / factors[i]` for one (base, n_rot, factors),
/// on the device as f64.
pub(super) struct RopeTable {
    base_bits: u32,
    n_rot: usize,
    /// The frequency factors' bits, or none.
    factors: Option<Vec<u32>>,
    pub(super) mem: DevBuf,
}

impl RopeTable {
    pub(super) fn new(freq_base: f32, n_rot: usize, factors: Option<&[f32]>, mem: DevBuf) -> Self {
        RopeTable {
            base_bits: freq_base.to_bits(),
            n_rot,
            factors: factors.map(factor_bits),
            mem,
        }
    }

    pub(super) fn is_for(&self, freq_base: f32, n_rot: usize, factors: Option<&[f32]>) -> bool {
        self.base_bits == freq_base.to_bits()
            && self.n_rot == n_rot
            && self.factors.as_deref() == factors.map(factor_bits).as_deref()
    }
}

fn factor_bits(f: &[f32]) -> Vec<u32> {
    f.iter().map(|v| v.to_bits()).collect()
}

/// A block of x split for a kernel: `quantize_x8`'s parts for `mv8_*`, or
/// `to_f16`'s two f16 parts for `gemm_tck_*` (room for `len` values), and
/// which x it holds: `(CudaBuf::id, rows, cols, Kernels::writes)` when it
/// was written, so that Q, K and V (or gate and up), which read one x,
/// split it once. Any launch or copy since changes the count, and the x is
/// split again.
pub(super) struct SplitX {
    pub(super) mem: DevBuf,
    pub(super) len: usize,
    pub(super) holds: Option<(u64, usize, usize, u64)>,
}

/// cuBLAS for prefill products, made on first use (or at load).
pub(super) enum BlasSlot {
    Untried,
    /// No libcublas, or no handle could be made: `gemm_tc_*` serves.
    Missing,
    Ready(Blas),
}

/// The sequences of a rows-mode pass, row by row.
pub struct RowsPass {
    /// Each row's sequence: its cache, sampler buffer and position (its
    /// length before the step).
    pub seqs: Vec<RowSeq>,
    /// Each row's token.
    pub tokens: Vec<u32>,
    /// The caches of rows 1 and on; row 0's is the one the pass was given.
    /// A captured pass may have rows past them: padding, whose sequences
    /// (in `seqs`) are a graph's own scratch.
    pub caches: Vec<CudaCache>,
    /// Inside a graph capture, the most chunks of `ATS_ROW_CHUNK` positions
    /// the graph's attention takes a row (its replays' rows stay within);
    /// otherwise none (each pass its own).
    pub max_splits: Option<usize>,
}

impl RowsPass {
    /// Row `i`'s position.
    pub(super) fn position(&self, i: usize) -> usize {
        self.seqs[i].pos as usize
    }
}

/// The device table of rows-mode passes, for up to `rows` rows: each row's
/// [`RowSeq`], then each row's token id, then each row's position (u32), at
/// fixed addresses (graphs hold them).
pub(crate) struct RowsTable {
    pub(super) mem: DevBuf,
    pub(super) rows: usize,
}

impl RowsTable {
    pub(super) const ROW_BYTES: usize = std::mem::size_of::<RowSeq>() + 8;

    pub(super) fn seqs(&self) -> DevPtr<RowSeq> {
        DevPtr::new(self.mem.ptr())
    }

    pub(super) fn tokens(&self) -> DevPtr<u32> {
        DevPtr::new(self.mem.ptr() + (self.rows * std::mem::size_of::<RowSeq>()) as u64)
    }

    pub(super) fn positions(&self) -> DevPtr<u32> {
        DevPtr::new(self.mem.ptr() + (self.rows * (std::mem::size_of::<RowSeq>() + 4)) as u64)
    }
}
