//! [`CudaOps`], the graph operations over one device, and what it does
//! differently while a decode step is captured into a CUDA graph.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;

use crate::backend::cuda::device::{CudaDevice, DevBuf};
use crate::backend::cuda::ops::state::{BlasSlot, RopeTable, RowsPass, RowsTable, SplitX};

/// What `CudaOps` does differently while a decode step is captured into a
/// CUDA graph: buffers come from a fixed arena (so their addresses are the
/// same at every replay) and the token id and position are read from device
/// memory that the host rewrites before each replay. The step's logits stay
/// on the device (`keep_last_row`); nothing is copied to the host inside
/// the graph.
pub(crate) struct GraphCapture {
    /// The arena: start, size, bytes handed out so far.
    pub arena: CUdeviceptr,
    pub arena_bytes: u64,
    pub arena_used: u64,
    /// Device `[token: u32, position: i32]` of the step.
    pub step: CUdeviceptr,
    /// Whether the step's attention is split over the context (the choice
    /// is fixed in the graph; `CudaBackend` recaptures when it changes).
    pub split_attention: bool,
    /// The split attention's chunk states `(address, rows, cols)`, taken
    /// from the arena by the first layer and reused by every later one (the
    /// arena is never freed during a capture).
    pub split_part: Option<(CUdeviceptr, usize, usize)>,
    /// A block for what one launch writes and the next reads (a product's
    /// column-range parts): `(address, bytes)`, the largest taken so far,
    /// reused by every later request it holds.
    pub temp: Option<(CUdeviceptr, u64)>,
}

/// The `Ops` implementation over one device.
pub struct CudaOps {
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) capture: Option<GraphCapture>,
    pub(super) rope_tables: Vec<RopeTable>,
    pub(super) x8: Option<SplitX>,
    /// x in two f16 parts for `gemm_tck_*` (short prompts).
    pub(super) x16: Option<SplitX>,
    /// Where `keep_last_row` copies the last position's logits: a device
    /// buffer of this many f32 (the sampler's); none: nowhere.
    pub(super) kept_logits: Option<(CUdeviceptr, usize)>,
    pub(super) blas: BlasSlot,
    /// Rows of a weight matrix decoded to f16 for cuBLAS, and its room in
    /// values (held for the model's lifetime, as the x8 block is).
    pub(super) blas_scratch: Option<(DevBuf, usize)>,
    /// A decode step's `moe` scratch (mixture-of-experts models), made at load.
    pub(super) moe_step: Option<DevBuf>,
    /// A batched decode step's sequences, while one runs (`rows.rs`).
    pub(super) rows: Option<RowsPass>,
    /// The device table of a rows-mode pass's sequences (`rows.rs`), kept
    /// for the next pass.
    pub(super) rows_table: Option<RowsTable>,
    /// The widest row of x `mv8_*` splits (`reserve_x8`).
    pub(super) x8_cols: Option<usize>,
    /// A batched step's rows of x in f16 parts for `gemm_few_*` (`rows.rs`).
    pub(super) rows_x16: Option<DevBuf>,
    /// The widest row of x any product takes (`set_widest_input`).
    pub(super) widest_input: Option<usize>,
}

impl CudaOps {
    pub fn new(dev: Arc<CudaDevice>) -> Self {
        CudaOps {
            dev,
            capture: None,
            rope_tables: Vec::new(),
            x8: None,
            x16: None,
            kept_logits: None,
            blas: BlasSlot::Untried,
            blas_scratch: None,
            moe_step: None,
            rows: None,
            rows_table: None,
            x8_cols: None,
            rows_x16: None,
            widest_input: None,
        }
    }

    /// Frees what a step kept in scratch between its products (x's f16
    /// parts): activations live no longer than their step.
    pub fn end_step(&mut self) {
        self.x16 = None;
    }

    /// Makes `keep_last_row` copy the last position's logits to `ptr`, a
    /// device buffer of `len` f32 that outlives these ops (and every graph
    /// captured through them).
    pub fn keep_logits_in(&mut self, ptr: CUdeviceptr, len: usize) {
        self.kept_logits = Some((ptr, len));
    }
}
