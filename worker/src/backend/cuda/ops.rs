//! The graph operations (`model::ops::Ops`) on the GPU, so that
//! `llama::forward` runs unchanged on either backend.
//!
//! Weights are device blocks in their stored format; activations are f32
//! row-major device matrices taken from the stream-ordered pool; the KV cache
//! is f16, laid out `[layer][K|V][kv_head][capacity][head_dim]`. Every
//! operation checks shapes, and that each operand's device block holds its
//! stated shape, before it launches (M0-W-1431).

use std::sync::Arc;

use cudarc::driver::result as drv;
use cudarc::driver::sys::CUdeviceptr;

use half::f16;

use crate::backend::cuda::blas::{chunk_rows, Blas, F16Product};
use crate::backend::cuda::device::{driver_error, CudaDevice, DevBuf, Purpose};
use crate::backend::cuda::kernels::norm_cluster_blocks;
use crate::backend::cuda::kernels::{
    AddAssignArgs, AddBiasArgs, AddRmsNormArgs, AddRmsNormClusterArgs, CopyColsArgs,
    DequantF16Args, EmbedArgs, GeluArgs, Glu, GluArgs, LayerNormArgs, MatmulArgs, QuantizeX8Args,
    RmsNormArgs, RopeArgs, RopePairs, ScaleArgs, SplitsOutput, ToF16Args, X8Bufs,
};
use crate::backend::cuda::kernels::{Mv8Plan, MV8_LOOP_MAX_TOKENS};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;
use crate::model::config::RopeStyle;
use crate::model::ops::{
    attend_in_steps, project_attend_in_steps, rope_inv_freqs, AttentionShape, MoeWeights, Ops,
    Product, QkPrep, RopeParams,
};
use crate::quant::GgmlType;

mod attend;
mod buffers;
mod moe;
mod rows;
mod split;

pub(crate) use buffers::BufMem;
use buffers::{check_bufs, check_weights, is_f32_vector, shape_error};
pub use buffers::{CudaBuf, CudaCache, CudaWeight};
pub use rows::RowsPass;

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

/// Bytes every weight matrix's device block holds past its data: the Q8_0
/// decode mat-vec and `gemm_tck_*` read 2-byte aligned blocks as whole
/// 16-byte aligned chunks (`ld_a16` in dequant.cuh), up to 16 bytes past the
/// last block of a tensor.
pub const WEIGHT_TAIL_BYTES: usize = 16;

/// The device block size asked for a weight matrix of `len` bytes.
pub fn weight_block_bytes(len: usize) -> u64 {
    (len + WEIGHT_TAIL_BYTES) as u64
}

/// `freq_base^(-2i / n_rot) / factors[i]` for one (base, n_rot, factors),
/// on the device as f64.
struct RopeTable {
    base_bits: u32,
    n_rot: usize,
    /// The frequency factors' bits, or none.
    factors: Option<Vec<u32>>,
    mem: DevBuf,
}

impl RopeTable {
    fn is_for(&self, freq_base: f32, n_rot: usize, factors: Option<&[f32]>) -> bool {
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
struct SplitX {
    mem: DevBuf,
    len: usize,
    holds: Option<(u64, usize, usize, u64)>,
}

/// cuBLAS for prefill products, made on first use (or at load).
enum BlasSlot {
    Untried,
    /// No libcublas, or no handle could be made: `gemm_tc_*` serves.
    Missing,
    Ready(Blas),
}

/// The `Ops` implementation over one device.
pub struct CudaOps {
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) capture: Option<GraphCapture>,
    rope_tables: Vec<RopeTable>,
    x8: Option<SplitX>,
    /// x in two f16 parts for `gemm_tck_*` (short prompts).
    x16: Option<SplitX>,
    /// Where `keep_last_row` copies the last position's logits: a device
    /// buffer of this many f32 (the sampler's); none: nowhere.
    kept_logits: Option<(CUdeviceptr, usize)>,
    blas: BlasSlot,
    /// Rows of a weight matrix decoded to f16 for cuBLAS, and its room in
    /// values (held for the model's lifetime, as the x8 block is).
    blas_scratch: Option<(DevBuf, usize)>,
    /// A decode step's `moe` scratch (mixture-of-experts models), made at load.
    moe_step: Option<DevBuf>,
    /// A batched decode step's sequences, while one runs (`rows.rs`).
    rows: Option<RowsPass>,
    /// The device table of a rows-mode pass's sequences (`rows.rs`), kept
    /// for the next pass.
    rows_table: Option<rows::RowsTable>,
    /// The widest row of x `mv8_*` splits (`reserve_x8`).
    x8_cols: Option<usize>,
    /// A batched step's rows of x in f16 parts for `gemm_few_*` (`rows.rs`).
    rows_x16: Option<DevBuf>,
    /// The widest row of x any product takes (`set_widest_input`).
    widest_input: Option<usize>,
}

/// Whether no buffer of `outs` overlaps x (a product that wrote x itself
/// leaves a split of x stale).
fn apart(x: &CudaBuf, outs: &[&CudaBuf]) -> bool {
    let (xs, xe) = (x.ptr(), x.ptr() + x.len() as u64 * 4);
    outs.iter().all(|out| {
        let (os, oe) = (out.ptr(), out.ptr() + out.len() as u64 * 4);
        oe <= xs || xe <= os
    })
}

/// `embed` of `n` token ids at `tokens` from `table` into `out`.
fn embed_args(table: &CudaWeight, tokens: DevPtr<u32>, n: usize, out: &mut CudaBuf) -> EmbedArgs {
    EmbedArgs {
        table: table.stored(),
        tokens,
        n,
        out: out.output(),
    }
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

    /// Makes the cuBLAS handle and the f16 scratch for the largest chunk of
    /// any of these `(rows, cols)` matrices (done at load, so that neither
    /// counts against a request, and the scratch is in the load's VRAM).
    /// Without cuBLAS, or without room for it, prefill keeps to `gemm_tc_*`.
    pub fn prepare_blas(&mut self, shapes: impl IntoIterator<Item = (usize, usize)>) {
        if !self.blas_ready() {
            return;
        }
        let most = shapes.into_iter().map(|(r, c)| chunk_rows(r, c) * c).max();
        if let Some(Err(e)) = most.map(|values| self.reserve_blas_scratch(values)) {
            // Short of memory (a VRAM cap): the model still serves, on
            // the worker's own GEMM kernels.
            tracing::warn!(error = %e, "no room for cuBLAS's scratch: prefill runs on the worker's own GEMM kernels");
            self.blas = BlasSlot::Missing;
        }
    }

    /// Bytes held for cuBLAS (its workspace and the f16 scratch), counted
    /// with the weights.
    #[cfg(test)]
    pub(crate) fn blas_bytes(&self) -> u64 {
        use crate::backend::cuda::{blas::BLAS_WORKSPACE_BYTES, device::align_up};
        let workspace = match self.blas {
            BlasSlot::Ready(_) => align_up(BLAS_WORKSPACE_BYTES),
            _ => 0,
        };
        workspace + self.blas_scratch.as_ref().map_or(0, |(m, _)| m.bytes())
    }

    /// Whether cuBLAS is there, making its handle on first use.
    fn blas_ready(&mut self) -> bool {
        if let BlasSlot::Untried = self.blas {
            self.blas = match Blas::new(&self.dev) {
                Ok(Some(b)) => BlasSlot::Ready(b),
                Ok(None) => BlasSlot::Missing,
                Err(e) => {
                    tracing::warn!(error = %e, "cuBLAS unavailable: prefill runs on the worker's own GEMM kernels");
                    BlasSlot::Missing
                }
            };
        }
        matches!(self.blas, BlasSlot::Ready(_))
    }

    /// The f16 scratch, grown to hold `values` values.
    fn reserve_blas_scratch(&mut self, values: usize) -> Result<DevPtrMut<f16>, BackendError> {
        if self.blas_scratch.as_ref().is_none_or(|(_, v)| *v < values) {
            if self.blas_scratch.is_some() {
                // Queued products may still read the old block: let them
                // finish before it is freed (a rare path: an LM head
                // multiplied for many rows grows it once).
                self.dev.synchronize()?;
            }
            self.blas_scratch = None;
            let mem = self.dev.alloc(Purpose::Weights, (values * 2) as u64)?;
            self.blas_scratch = Some((mem, values));
        }
        let (mem, _) = self.blas_scratch.as_ref().expect("just reserved");
        Ok(DevPtrMut::new(mem.ptr()))
    }

    /// x of `m` as two f16 parts (`to_f16`: x rounded, then the rounding
    /// of the rest) at `hi` and right after it (each 16-byte aligned: n x
    /// cols is a multiple of 8), for cuBLAS and `gemm_tck_*`.
    fn launch_to_f16(&self, m: &MatmulArgs, hi: DevPtrMut<f16>) -> Result<(), BackendError> {
        let len = m.n * m.w.cols;
        let args = ToF16Args {
            x: m.x,
            len,
            hi,
            lo: hi.offset(len),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    /// [`Self::launch_to_f16`] into a scratch block of its own, freed in
    /// stream order when dropped.
    fn split_x_f16(&mut self, m: &MatmulArgs) -> Result<(DevBuf, DevPtrMut<f16>), BackendError> {
        let mem = self
            .dev
            .alloc_async(Purpose::Scratch, (4 * m.n * m.w.cols) as u64)?;
        let hi = DevPtrMut::<f16>::new(mem.ptr());
        self.launch_to_f16(m, hi)?;
        Ok((mem, hi))
    }

    /// Frees what a step kept in scratch between its products (x's f16
    /// parts): activations live no longer than their step.
    pub fn end_step(&mut self) {
        self.x16 = None;
    }

    /// x of `m` in two f16 parts for `gemm_tck_*`, in the `x16` block:
    /// split unless the block holds this x already (Q, K and V read one).
    fn x_f16(&mut self, x: &CudaBuf, m: &MatmulArgs) -> Result<DevPtr<f16>, BackendError> {
        let len = m.n * m.w.cols;
        let kernels = &self.dev.kernels;
        let held = (x.id(), x.rows, x.cols, kernels.writes());
        if let Some(b) = self.x16.as_ref().filter(|b| b.len >= len) {
            if b.holds == Some(held) {
                return Ok(DevPtr::new(b.mem.ptr()));
            }
        }
        if self.x16.as_ref().is_none_or(|b| b.len < len) {
            // Scratch, freed in stream order when replaced.
            let mem = self.dev.alloc_async(Purpose::Scratch, (4 * len) as u64)?;
            self.x16 = Some(SplitX {
                mem,
                len,
                holds: None,
            });
        }
        let block = self.x16.as_mut().expect("made above");
        block.holds = None;
        let hi = DevPtrMut::<f16>::new(block.mem.ptr());
        self.launch_to_f16(m, hi)?;
        Ok(hi.as_const())
    }

    /// `m` on cuBLAS over f16 (`blas.rs`): x rounded to f16 once, the
    /// weights decoded chunk by chunk into the scratch (F16 weights are
    /// read where they are), each chunk's product written into its columns
    /// of `out`, then the bias. `false` when cuBLAS is missing.
    fn matmul_blas(&mut self, m: &MatmulArgs) -> Result<bool, BackendError> {
        if !self.blas_ready() {
            return Ok(false);
        }
        let (rows, cols, n) = (m.w.rows, m.w.cols, m.n);
        let direct = m.w.ty == GgmlType::F16;
        let chunk = if direct { rows } else { chunk_rows(rows, cols) };
        let scratch = if direct {
            None
        } else {
            Some(self.reserve_blas_scratch(chunk * cols)?)
        };
        // Freed in stream order when this returns, after the products.
        let (_xh_mem, xh) = self.split_x_f16(m)?;
        let xl = xh.offset(n * cols);
        let (k, st) = (&self.dev.kernels, &self.dev.stream);
        let BlasSlot::Ready(blas) = &self.blas else {
            unreachable!("blas_ready said so");
        };
        for r0 in (0..rows).step_by(chunk) {
            let nrows = chunk.min(rows - r0);
            let w = match scratch {
                None => DevPtr::new(m.w.ptr.addr()),
                Some(out) => {
                    k.launch(
                        st,
                        &DequantF16Args {
                            w: m.w,
                            r0,
                            nrows,
                            out,
                        },
                    )?;
                    out.as_const()
                }
            };
            // The small part of x first, then the large one added to it.
            for (x, accumulate) in [(xl, false), (xh, true)] {
                let product = F16Product {
                    w,
                    rows: nrows,
                    cols,
                    x: x.as_const(),
                    n,
                    out: m.out.offset(r0),
                    ld_out: rows,
                    accumulate,
                };
                // SAFETY: w holds nrows x cols f16 (the stored F16 matrix,
                // or the chunk just decoded), xh and xl n x cols each, out
                // n x rows f32 (checked by `matmul`), all on this device.
                unsafe { blas.gemm_f16(&product) }?;
            }
            k.note_write();
        }
        if let Some(bias) = m.bias {
            let len = n * rows;
            k.launch(
                st,
                &AddBiasArgs {
                    out: m.out,
                    bias,
                    len,
                    rows,
                },
            )?;
        }
        Ok(true)
    }

    /// Makes room for up to `MV8_LOOP_MAX_TOKENS` rows of x of up to `cols`
    /// columns in the block that `mv8_*` reads (done at load, so that no
    /// decode graph needs to allocate; without it the first such matmul
    /// allocates).
    pub fn reserve_x8(&mut self, cols: usize) -> Result<(), BackendError> {
        self.x8_cols = Some(cols);
        self.reserve_x8_values(cols * MV8_LOOP_MAX_TOKENS)
    }

    fn reserve_x8_values(&mut self, len: usize) -> Result<(), BackendError> {
        if self.x8.as_ref().is_some_and(|b| b.len >= len) {
            return Ok(());
        }
        self.dev.bind()?;
        // Held for the model's lifetime, as the sampler's buffers are.
        let mem = self
            .dev
            .alloc(Purpose::Weights, X8Bufs::bytes(len) as u64)?;
        self.x8 = Some(SplitX {
            mem,
            len,
            holds: None,
        });
        Ok(())
    }

    /// x split for `mv8_*`, split now unless the block holds it already;
    /// `None` inside a graph capture when the block is too small (nothing
    /// may be allocated there: `mv1_*` runs instead).
    fn quantized_x(&mut self, x: &CudaBuf) -> Result<Option<X8Bufs>, BackendError> {
        let Some(bufs) = self.x8_room(x.len())? else {
            return Ok(None);
        };
        let kernels = &self.dev.kernels;
        let block = self.x8.as_ref().expect("x8_room reserved it");
        if block.holds != Some((x.id(), x.rows, x.cols, kernels.writes())) {
            let args = QuantizeX8Args {
                x: x.input(),
                cols: x.len(),
                out: bufs,
            };
            kernels.launch(&self.dev.stream, &args)?;
        }
        Ok(Some(bufs))
    }

    /// The block's parts for `len` values, grown to hold them outside a
    /// graph capture; `None` inside one when it is too small (nothing may
    /// be allocated there).
    fn x8_room(&mut self, len: usize) -> Result<Option<X8Bufs>, BackendError> {
        if self.x8.as_ref().is_none_or(|b| b.len < len) {
            if self.capture.is_some() {
                return Ok(None);
            }
            self.reserve_x8_values(len)?;
        }
        let block = self.x8.as_ref().expect("reserved above");
        Ok(Some(X8Bufs::at(block.mem.ptr(), len)))
    }

    /// Where a kernel writing `out` may also split it for `mv8_*`, saving
    /// `quantize_x8`'s launch before the next matmul of `out` (decode: the
    /// norms and SwiGLU feed mat-vecs): one row of whole 32-value groups,
    /// the integer mat-vec on, and a block reserved for that many values.
    fn x8_for(&self, out: &CudaBuf) -> Option<X8Bufs> {
        let block = self.x8.as_ref()?;
        let fits = out.rows == 1 && out.cols.is_multiple_of(32) && block.len >= out.len();
        (fits && self.dev.kernels.mv8_enabled()).then(|| X8Bufs::at(block.mem.ptr(), out.len()))
    }

    /// `out = act(gate) * up`.
    fn glu(
        &mut self,
        act: Glu,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if gate.len() != up.len() || out.len() != up.len() || up.is_empty() {
            return Err(shape_error(format!(
                "glu: {} {} {}",
                gate.len(),
                up.len(),
                out.len()
            )));
        }
        check_bufs("glu", &[gate, up, out])?;
        self.dev.bind()?;
        let x8 = self.x8_for(out);
        let args = GluArgs {
            act,
            gate: gate.input(),
            up: up.input(),
            len: up.len(),
            out: out.output(),
            x8,
        };
        self.launch_splitting(&args, out)
    }

    /// Launches a kernel that writes `out` and, when `args.x8()` says so,
    /// splits it into the block; the block then holds `out` as it is now
    /// (until the next launch or copy).
    fn launch_splitting<C: SplitsOutput>(
        &mut self,
        args: &C,
        out: &CudaBuf,
    ) -> Result<(), BackendError> {
        self.dev.kernels.launch(&self.dev.stream, args)?;
        if args.x8().is_some() {
            self.x8_now_holds(out);
        }
        Ok(())
    }

    /// `x += y` (or `rms_norm(y) * y_weight`), then `out = rms_norm(x) * weight`.
    fn add_rms_norm_launch(
        &mut self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        y_weight: Option<&CudaWeight>,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let same = |b: &CudaBuf| b.rows == x.rows && b.cols == x.cols;
        let yw_ok = y_weight.is_none_or(|w| is_f32_vector(w, x.cols));
        if !is_f32_vector(weight, x.cols) || !yw_ok || !same(y) || !same(out) || x.is_empty() {
            return Err(shape_error(format!(
                "add_rms_norm: x {}x{}, y {}x{}, w {}, y's w {:?}, out {}x{}",
                x.rows,
                x.cols,
                y.rows,
                y.cols,
                weight.cols,
                y_weight.map(|w| w.cols),
                out.rows,
                out.cols
            )));
        }
        check_weights("add_rms_norm", &[weight])?;
        if let Some(w) = y_weight {
            check_weights("add_rms_norm", &[w])?;
        }
        check_bufs("add_rms_norm", &[x, y, out])?;
        self.dev.bind()?;
        let x8 = self.x8_for(out);
        if let Some(x8) = x8.filter(|_| {
            y_weight.is_none()
                && self.dev.kernels.clusters()
                && norm_cluster_blocks(x.cols).is_some()
        }) {
            let args = AddRmsNormClusterArgs {
                x: x.output(),
                y: y.input(),
                w: weight.vector(),
                cols: x.cols,
                eps,
                out: out.output(),
                x8,
            };
            return self.launch_splitting(&args, out);
        }
        let args = AddRmsNormArgs {
            x: x.output(),
            y: y.input(),
            yw: y_weight.map(CudaWeight::vector),
            w: weight.vector(),
            rows: x.rows,
            cols: x.cols,
            eps,
            out: out.output(),
            x8,
        };
        self.launch_splitting(&args, out)
    }

    /// After the launch that split `out` into the x8 block.
    fn x8_now_holds(&mut self, out: &CudaBuf) {
        let writes = self.dev.kernels.writes();
        if let Some(b) = self.x8.as_mut() {
            b.holds = Some((out.id(), out.rows, out.cols, writes));
        }
    }

    /// `out = x W^T (+ bias)` through `mv8_*`, when it applies; `false`:
    /// it does not, nothing was launched.
    fn matmul_x8(
        &mut self,
        x: &CudaBuf,
        args: &MatmulArgs,
        out: &CudaBuf,
    ) -> Result<bool, BackendError> {
        match self.dev.kernels.mv8_choice(args) {
            Some(plan) => self.matmul_x8_plan(x, args, plan, out),
            None => Ok(false),
        }
    }

    /// `matmul_x8` on `plan`; `false` where x cannot be split (inside a
    /// capture without room).
    fn matmul_x8_plan(
        &mut self,
        x: &CudaBuf,
        args: &MatmulArgs,
        plan: Mv8Plan,
        out: &CudaBuf,
    ) -> Result<bool, BackendError> {
        let Some(x8) = self.quantized_x(x)? else {
            return Ok(false);
        };
        self.dev.kernels.matvec8(&self.dev.stream, args, plan, x8)?;
        self.x8_still_holds(x, &[out]);
        Ok(true)
    }

    /// After products of x split in the x8 block wrote `outs`: the block
    /// still holds x, unless a product overwrote x itself.
    fn x8_still_holds(&mut self, x: &CudaBuf, outs: &[&CudaBuf]) {
        let kernels = &self.dev.kernels;
        let block = self.x8.as_mut().expect("quantized_x reserved it");
        block.holds = apart(x, outs).then_some((x.id(), x.rows, x.cols, kernels.writes()));
    }

    /// The checked launch of `rope` on x (`None`: nothing to rotate).
    fn rope_args(
        &mut self,
        x: &mut CudaBuf,
        p: RopeParams<'_>,
    ) -> Result<Option<RopeArgs>, BackendError> {
        if x.cols != p.n_head * p.head_dim
            || p.n_rot > p.head_dim
            || !p.n_rot.is_multiple_of(2)
            || !p.factors_fit()
            || x.is_empty()
        {
            return Err(shape_error(format!(
                "rope: x {}x{}, {} heads of {}, {:?} frequency factors",
                x.rows,
                x.cols,
                p.n_head,
                p.head_dim,
                p.freq_factors.map(<[f32]>::len)
            )));
        }
        check_bufs("rope", &[x])?;
        if p.n_rot == 0 {
            return Ok(None);
        }
        let pairs = match p.style {
            RopeStyle::Normal => RopePairs::Adjacent,
            RopeStyle::Neox => RopePairs::Halves,
        };
        // Frequency factors live only in the table: made here on first use
        // (never inside a graph capture, which may not allocate; the prefill
        // before it has made it).
        if p.freq_factors.is_some() && self.capture.is_none() {
            self.prepare_rope(p.freq_base, p.n_rot, p.freq_factors)?;
        }
        let inv_freq = self
            .rope_tables
            .iter()
            .find(|t| t.is_for(p.freq_base, p.n_rot, p.freq_factors))
            .map(|t| DevPtr::new(t.mem.ptr()));
        if inv_freq.is_none() && p.freq_factors.is_some() {
            return Err(BackendError::InferenceFailed(
                "rope: no table for these frequency factors inside a graph capture".into(),
            ));
        }
        self.dev.bind()?;
        Ok(Some(RopeArgs {
            x: x.output(),
            x2: None,
            n_head2: 0,
            rows: x.rows,
            n_head: p.n_head,
            head_dim: p.head_dim,
            n_rot: p.n_rot,
            start_pos: p.start_pos,
            pos_ptr: self.pos_ptr(),
            inv_freq,
            freq_base: p.freq_base,
            freq_scale: p.freq_scale,
            mscale: p.mscale,
            pairs,
        }))
    }

    /// Makes `keep_last_row` copy the last position's logits to `ptr`, a
    /// device buffer of `len` f32 that outlives these ops (and every graph
    /// captured through them).
    pub fn keep_logits_in(&mut self, ptr: CUdeviceptr, len: usize) {
        self.kept_logits = Some((ptr, len));
    }

    /// Uploads the RoPE frequencies for (`freq_base`, `n_rot`), computed as
    /// the CPU reference computes them, so that `rope` need not compute them
    /// per thread. Without a table the kernel computes them itself.
    pub fn prepare_rope(
        &mut self,
        freq_base: f32,
        n_rot: usize,
        factors: Option<&[f32]>,
    ) -> Result<(), BackendError> {
        if n_rot < 2
            || factors.is_some_and(|f| f.len() != n_rot / 2)
            || self
                .rope_tables
                .iter()
                .any(|t| t.is_for(freq_base, n_rot, factors))
        {
            return Ok(());
        }
        let table = rope_inv_freqs(freq_base, n_rot, factors);
        self.dev.bind()?;
        let mem = self.dev.alloc(Purpose::Weights, (table.len() * 8) as u64)?;
        // SAFETY: the block holds the table.
        unsafe { drv::memcpy_htod_async(mem.ptr(), &table, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying the RoPE table", e))?;
        self.dev.synchronize()?;
        self.rope_tables.push(RopeTable {
            base_bits: freq_base.to_bits(),
            n_rot,
            factors: factors.map(factor_bits),
            mem,
        });
        Ok(())
    }

    /// The device position slot while capturing, else none.
    fn pos_ptr(&self) -> Option<DevPtr<i32>> {
        self.capture.as_ref().map(|c| DevPtr::new(c.step + 4))
    }

    /// Uploads an f32 host matrix (for tests and small inputs).
    pub fn upload(
        &mut self,
        rows: usize,
        cols: usize,
        data: &[f32],
    ) -> Result<CudaBuf, BackendError> {
        self.upload_values(rows, cols, data)
    }

    /// `words` in a new buffer (index lists for kernels that read `int`s).
    pub(super) fn upload_words(&mut self, words: &[u32]) -> Result<CudaBuf, BackendError> {
        self.upload_values(1, words.len(), words)
    }

    /// `rows x cols` 4-byte values in a new buffer.
    fn upload_values<T: cudarc::driver::DeviceRepr>(
        &mut self,
        rows: usize,
        cols: usize,
        data: &[T],
    ) -> Result<CudaBuf, BackendError> {
        if data.len() != rows * cols || std::mem::size_of::<T>() != 4 {
            return Err(shape_error(format!(
                "upload: {} values for {rows}x{cols}",
                data.len()
            )));
        }
        let b = self.alloc_buf(rows, cols)?;
        // SAFETY: the block holds `data.len()` 4-byte values; pageable host
        // memory is staged before the call returns.
        unsafe { drv::memcpy_htod_async(b.ptr(), data, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying to the device", e))?;
        self.dev.kernels.note_write();
        Ok(b)
    }

    /// Uploads a weight from its stored bytes (`rows` rows of `cols` values
    /// of `ty`), synchronously. Vectors must be F32 with one row.
    pub fn upload_weight(
        &mut self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<CudaWeight, BackendError> {
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| {
            shape_error(format!(
                "upload_weight: {cols} values are not whole {ty} blocks"
            ))
        })? as usize;
        if row_bytes * rows != bytes.len() || rows == 0 || (rows == 1 && ty != GgmlType::F32) {
            return Err(shape_error(format!(
                "upload_weight: {} bytes for {rows}x{cols} {ty}",
                bytes.len()
            )));
        }
        self.dev.bind()?;
        let mem = self
            .dev
            .alloc(Purpose::Weights, weight_block_bytes(bytes.len()))?;
        // SAFETY: the block holds `bytes.len()` bytes.
        unsafe { drv::memcpy_htod_async(mem.ptr(), bytes, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying a weight", e))?;
        self.dev.synchronize()?;
        Ok(CudaWeight {
            mem,
            ty,
            rows,
            cols,
            row_bytes,
        })
    }

    fn alloc_buf(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        self.dev.bind()?;
        let bytes = (rows * cols * 4) as u64;
        if let Some(c) = &mut self.capture {
            let size = super::device::align_up(bytes);
            if c.arena_used + size > c.arena_bytes {
                return Err(BackendError::OutOfMemory {
                    needed: size,
                    available: c.arena_bytes - c.arena_used,
                });
            }
            let ptr = c.arena + c.arena_used;
            c.arena_used += size;
            return Ok(CudaBuf::new(BufMem::Arena(ptr), rows, cols));
        }
        let mem = self.dev.alloc_async(Purpose::Scratch, bytes)?;
        Ok(CudaBuf::new(BufMem::Owned(mem), rows, cols))
    }

    /// A buffer that lives until the next launch has read it (a product's
    /// column-range parts): inside a capture the arena block of the last
    /// such buffer when it is large enough (the launches run in stream
    /// order), otherwise a buffer of its own.
    fn temp_buf(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        let bytes = (rows * cols * 4) as u64;
        if let Some((ptr, held)) = self.capture.as_ref().and_then(|c| c.temp) {
            if held >= bytes {
                return Ok(CudaBuf::new(BufMem::Arena(ptr), rows, cols));
            }
        }
        let b = self.alloc_buf(rows, cols)?;
        if let Some(c) = &mut self.capture {
            c.temp = Some((b.ptr(), bytes));
        }
        Ok(b)
    }

    /// Zeroes a buffer just made (no other buffer's contents change, so no
    /// write is counted for `mv8_*`'s block).
    fn zero(&self, b: &CudaBuf) -> Result<(), BackendError> {
        // SAFETY: the range is the buffer's own.
        unsafe { drv::memset_d8_async(b.ptr(), 0, b.len() * 4, self.dev.cu_stream()) }
            .map_err(|e| driver_error("zeroing device memory", e))
    }
}

impl Ops for CudaOps {
    type Weight = CudaWeight;
    type Buf = CudaBuf;
    type Cache = CudaCache;
    type Error = BackendError;

    /// Zeroed, except inside a decode-step capture: there a memset node
    /// per buffer would run at every replay (and hold up the next kernel's
    /// early launch), while every architecture writes each buffer before it
    /// reads it. The graph test checks replays against eager steps, whose
    /// buffers are zeroed, bit for bit.
    fn buf(&mut self, rows: usize, cols: usize) -> Result<CudaBuf, BackendError> {
        let b = self.alloc_buf(rows, cols)?;
        if self.capture.is_none() {
            self.zero(&b)?;
        }
        Ok(b)
    }

    fn dims(&self, x: &CudaBuf) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn embed(
        &mut self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if tokens.is_empty()
            || out.rows != tokens.len()
            || out.cols != table.cols
            || table.cols == 0
        {
            return Err(shape_error(format!(
                "embed: {} tokens, table {}x{}, out {}x{}",
                tokens.len(),
                table.rows,
                table.cols,
                out.rows,
                out.cols
            )));
        }
        check_weights("embed", &[table])?;
        check_bufs("embed", &[out])?;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= table.rows) {
            return Err(BackendError::InferenceFailed(format!(
                "token id {id} is outside the vocabulary ({})",
                table.rows
            )));
        }
        if self.in_rows() {
            return self.embed_rows(table, out);
        }
        self.dev.bind()?;
        if let Some(c) = &self.capture {
            // The token id is written to the step's device slot before each replay.
            if tokens.len() != 1 {
                return Err(BackendError::InferenceFailed(
                    "a decode graph takes one token".into(),
                ));
            }
            let args = embed_args(table, DevPtr::new(c.step), 1, out);
            return self.dev.kernels.launch(&self.dev.stream, &args);
        }
        let ids = self
            .dev
            .alloc_async(Purpose::Scratch, (tokens.len() * 4) as u64)?;
        // SAFETY: `ids` holds `tokens.len()` u32 values; pageable memory is
        // staged before the call returns.
        unsafe { drv::memcpy_htod_async(ids.ptr(), tokens, self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying token ids", e))?;
        let args = embed_args(table, DevPtr::new(ids.ptr()), tokens.len(), out);
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn embed_positions(
        &mut self,
        table: &CudaWeight,
        start_pos: usize,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.embed_positions_rows(table, out);
        }
        let end = start_pos + out.rows;
        if end > table.rows {
            return Err(BackendError::InferenceFailed(format!(
                "position {} is past the {} learned positions",
                end - 1,
                table.rows
            )));
        }
        let Some(c) = &self.capture else {
            let positions: Vec<u32> = (start_pos..end).map(|p| p as u32).collect();
            return self.embed(table, &positions, out);
        };
        // A decode graph reads its position from the step's slot, the word
        // after the token (the model's context, checked at load, is within
        // the table).
        if out.rows != 1 || out.cols != table.cols {
            return Err(shape_error(format!(
                "embed_positions: a decode graph takes one row of {}, not {}x{}",
                table.cols, out.rows, out.cols
            )));
        }
        check_weights("embed_positions", &[table])?;
        check_bufs("embed_positions", &[out])?;
        self.dev.bind()?;
        let args = embed_args(table, DevPtr::new(c.step + 4), 1, out);
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn copy_cols(
        &mut self,
        x: &CudaBuf,
        start: usize,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if out.rows != x.rows || start + out.cols > x.cols || out.is_empty() {
            return Err(shape_error(format!(
                "copy_cols: x {}x{} from {start}, out {}x{}",
                x.rows, x.cols, out.rows, out.cols
            )));
        }
        check_bufs("copy_cols", &[x, out])?;
        self.dev.bind()?;
        let args = CopyColsArgs {
            x: x.input(),
            rows: x.rows,
            x_cols: x.cols,
            start,
            cols: out.cols,
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn rms_norm(
        &mut self,
        x: &CudaBuf,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let width = weight.cols;
        if !is_f32_vector(weight, width)
            || width == 0
            || !x.cols.is_multiple_of(width)
            || out.rows != x.rows
            || out.cols != x.cols
            || x.is_empty()
        {
            return Err(shape_error(format!(
                "rms_norm: x {}x{}, w {}, out {}x{}",
                x.rows, x.cols, weight.cols, out.rows, out.cols
            )));
        }
        check_weights("rms_norm", &[weight])?;
        check_bufs("rms_norm", &[x, out])?;
        self.dev.bind()?;
        // A narrower weight normalises each group of a row: the kernel sees
        // the groups as rows of their own (the buffer is contiguous).
        let groups = x.cols / width;
        let (w, rows, cols) = (weight.vector(), x.rows * groups, width);
        let x8 = if groups == 1 { self.x8_for(out) } else { None };
        let args = RmsNormArgs {
            x: x.input(),
            w,
            rows,
            cols,
            eps,
            out: out.output(),
            x8,
        };
        self.launch_splitting(&args, out)
    }

    fn matmul(
        &mut self,
        x: &CudaBuf,
        w: &CudaWeight,
        bias: Option<&CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.matmul_rows(x, w, bias, out);
        }
        let args = matmul_args(x, w, bias, out)?;
        self.dev.bind()?;
        if self.capture.is_none()
            && self.dev.kernels.blas_choice(&args)
            && self.matmul_blas(&args)?
        {
            return Ok(());
        }
        // Short prompts, quantized formats: tensor cores over split columns
        // (never inside a capture, which may not allocate; decode is n = 1).
        if let Some(plan) = self
            .dev
            .kernels
            .gemm_splits(&args)
            .filter(|_| self.capture.is_none())
        {
            let xh = self.x_f16(x, &args)?;
            let mut part = self.alloc_buf(plan.splits * x.rows, w.rows)?;
            let st = &self.dev.stream;
            self.dev
                .kernels
                .gemm_split(st, &args, xh, plan, part.output())?;
            let block = self.x16.as_mut().expect("x_f16 made it");
            block.holds = apart(x, &[out]).then(|| {
                let writes = self.dev.kernels.writes();
                (x.id(), x.rows, x.cols, writes)
            });
            return Ok(());
        }
        if self.matmul_x8(x, &args, out)? {
            return Ok(());
        }
        self.dev.kernels.matmul(&self.dev.stream, &args)
    }

    /// Products of one row of x in one format with `mv8_*` run as one
    /// `mv8m_*` launch per format (Q and K apart from a V in another
    /// format); every other product as `matmul` runs it.
    fn matmuls(
        &mut self,
        x: &CudaBuf,
        products: &mut [Product<'_, CudaWeight, CudaBuf>],
    ) -> Result<(), BackendError> {
        let mut fused = vec![false; products.len()];
        if x.rows == 1 && products.len() > 1 && !self.in_rows() {
            let mut args = Vec::with_capacity(products.len());
            for p in products.iter_mut() {
                args.push(matmul_args(x, p.w, p.bias, p.out)?);
            }
            self.dev.bind()?;
            for (i, a) in args.iter().enumerate() {
                if fused[i] || self.dev.kernels.mv8_choice(a) != Some(Mv8Plan::One) {
                    continue;
                }
                let group: Vec<usize> = (i..args.len())
                    .filter(|&j| {
                        !fused[j]
                            && args[j].w.ty == a.w.ty
                            && self.dev.kernels.mv8_choice(&args[j]) == Some(Mv8Plan::One)
                    })
                    .take(3)
                    .collect();
                if group.len() < 2 {
                    continue;
                }
                let Some(x8) = self.quantized_x(x)? else {
                    break;
                };
                let chosen: Vec<MatmulArgs> = group.iter().map(|&j| args[j]).collect();
                self.dev
                    .kernels
                    .matvec8_many(&self.dev.stream, &chosen, x8)?;
                let outs: Vec<&CudaBuf> = group.iter().map(|&j| &*products[j].out).collect();
                self.x8_still_holds(x, &outs);
                for j in group {
                    fused[j] = true;
                }
            }
        }
        for (p, done) in products.iter_mut().zip(fused) {
            if !done {
                self.matmul(x, p.w, p.bias, p.out)?;
            }
        }
        Ok(())
    }

    fn rope(&mut self, x: &mut CudaBuf, p: RopeParams<'_>) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.rope_rows(x, p);
        }
        match self.rope_args(x, p)? {
            Some(args) => self.dev.kernels.launch(&self.dev.stream, &args),
            None => Ok(()),
        }
    }

    /// Q and K in one `rope` launch where they turn alike (every layer of
    /// the models here: the same positions, frequencies and style).
    fn rope_qk(
        &mut self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        pq: RopeParams<'_>,
        pk: RopeParams<'_>,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.rope_qk_rows(q, k, pq, pk);
        }
        let (a, b) = (self.rope_args(q, pq)?, self.rope_args(k, pk)?);
        match (a, b) {
            (Some(a), Some(b)) if a.rotates_like(&b) => {
                let both = RopeArgs {
                    x2: Some(b.x),
                    n_head2: b.n_head,
                    ..a
                };
                self.dev.kernels.launch(&self.dev.stream, &both)
            }
            (a, b) => {
                for args in [a, b].into_iter().flatten() {
                    self.dev.kernels.launch(&self.dev.stream, &args)?;
                }
                Ok(())
            }
        }
    }

    fn attention(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.attention_rows(q, k, v, cache, s, None, out);
        }
        self.store_attend(q, k, v, cache, s, None, out)
    }

    /// The sinks in the softmax's denominator: a term of the attention
    /// kernels' final normalisation (`sinks` argument).
    fn attention_sinks(
        &mut self,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        cache: &mut CudaCache,
        s: AttentionShape,
        sinks: &CudaWeight,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if !is_f32_vector(sinks, s.n_head) {
            return Err(shape_error(format!(
                "attention sinks: {} values for {} heads",
                sinks.cols, s.n_head
            )));
        }
        check_weights("attention sinks", &[sinks])?;
        if self.in_rows() {
            return self.attention_rows(q, k, v, cache, s, Some(sinks), out);
        }
        self.store_attend(q, k, v, cache, s, Some(sinks.vector()), out)
    }

    fn moe(
        &mut self,
        x: &CudaBuf,
        logits: &CudaBuf,
        w: MoeWeights<'_, CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.experts(x, logits, &w, out)
    }

    /// Q's and K's norms and rotations and the KV store in one
    /// `qk_rope_store` launch where Q and K turn alike, then attention.
    fn attend(
        &mut self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        prep: QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            return self.attend_rows(q, k, v, &prep, cache, s, out);
        }
        let Some(args) = self.qk_rope_store_args(q, k, v, &prep, cache, &s, out)? else {
            return attend_in_steps(self, q, k, v, prep, cache, s, out);
        };
        self.dev.kernels.launch(&self.dev.stream, &args)?;
        self.attend_cached(q, cache, s, None, out)
    }

    /// One row of x: Q, K and V, Q's and K's rotations and the KV store in
    /// one `mv8q_*` launch where they can, then attention.
    fn project_attend(
        &mut self,
        x: &CudaBuf,
        mut qkv: [Product<'_, CudaWeight, CudaBuf>; 3],
        prep: QkPrep<'_, CudaWeight>,
        cache: &mut CudaCache,
        s: AttentionShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if self.in_rows() {
            // Q, K and V of every row at once, then each row alone.
            self.matmuls(x, &mut qkv)?;
            let [q, k, v] = qkv;
            return self.attend_rows(q.out, k.out, v.out, &prep, cache, s, out);
        }
        if let Some(call) = self.qkv_rope_call(x, &mut qkv, &prep, cache, &s, out)? {
            self.dev.kernels.launch(&self.dev.stream, &call)?;
            let [q, k, v] = qkv;
            self.x8_still_holds(x, &[&*q.out, &*k.out, &*v.out]);
            return self.attend_cached(q.out, cache, s, None, out);
        }
        project_attend_in_steps(self, x, qkv, prep, cache, s, out)
    }

    fn swiglu(
        &mut self,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.glu(Glu::Silu, gate, up, out)
    }

    fn geglu(
        &mut self,
        gate: &CudaBuf,
        up: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.glu(Glu::Gelu, gate, up, out)
    }

    fn scale(&mut self, x: &mut CudaBuf, factor: f32) -> Result<(), BackendError> {
        if x.is_empty() {
            return Err(shape_error("scale: an empty buffer".into()));
        }
        check_bufs("scale", &[x])?;
        self.dev.bind()?;
        let args = ScaleArgs {
            x: x.output(),
            len: x.len(),
            factor,
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn layer_norm(
        &mut self,
        x: &CudaBuf,
        weight: &CudaWeight,
        bias: Option<&CudaWeight>,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if !is_f32_vector(weight, x.cols)
            || bias.is_some_and(|b| !is_f32_vector(b, x.cols))
            || out.rows != x.rows
            || out.cols != x.cols
            || x.is_empty()
        {
            return Err(shape_error(format!(
                "layer_norm: x {}x{}, w {}, bias {:?}, out {}x{}",
                x.rows,
                x.cols,
                weight.cols,
                bias.map(|b| b.cols),
                out.rows,
                out.cols
            )));
        }
        check_weights("layer_norm", &[weight])?;
        if let Some(b) = bias {
            check_weights("layer_norm bias", &[b])?;
        }
        check_bufs("layer_norm", &[x, out])?;
        self.dev.bind()?;
        let (w, b) = (weight.vector(), bias.map(CudaWeight::vector));
        let args = LayerNormArgs {
            x: x.input(),
            w,
            b,
            rows: x.rows,
            cols: x.cols,
            eps,
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn gelu(&mut self, x: &CudaBuf, out: &mut CudaBuf) -> Result<(), BackendError> {
        if out.len() != x.len() || x.is_empty() {
            return Err(shape_error(format!(
                "gelu: x {}x{}, out {}x{}",
                x.rows, x.cols, out.rows, out.cols
            )));
        }
        check_bufs("gelu", &[x, out])?;
        self.dev.bind()?;
        let args = GeluArgs {
            x: x.input(),
            len: x.len(),
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn add_assign(&mut self, x: &mut CudaBuf, y: &CudaBuf) -> Result<(), BackendError> {
        if x.len() != y.len() || x.is_empty() {
            return Err(shape_error("add".into()));
        }
        check_bufs("add", &[x, y])?;
        self.dev.bind()?;
        let args = AddAssignArgs {
            len: x.len(),
            x: x.output(),
            y: y.input(),
        };
        self.dev.kernels.launch(&self.dev.stream, &args)
    }

    fn add_rms_norm(
        &mut self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.add_rms_norm_launch(x, y, None, weight, eps, out)
    }

    /// One `add_rms_norm` launch with `y`'s own norm.
    fn norm_add_rms_norm(
        &mut self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        y_weight: &CudaWeight,
        weight: &CudaWeight,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.add_rms_norm_launch(x, y, Some(y_weight), weight, eps, out)
    }

    fn take_row(&mut self, x: &CudaBuf, row: usize) -> Result<CudaBuf, BackendError> {
        if row >= x.rows {
            return Err(shape_error("take_row".into()));
        }
        check_bufs("take_row", &[x])?;
        let out = self.alloc_buf(1, x.cols)?;
        // SAFETY: both ranges are `cols` f32 values inside their blocks.
        unsafe {
            drv::memcpy_dtod_async(out.ptr(), x.row_ptr(row), x.cols * 4, self.dev.cu_stream())
        }
        .map_err(|e| driver_error("copying a row", e))?;
        self.dev.kernels.note_write();
        Ok(out)
    }

    fn to_host(&mut self, x: &CudaBuf, out: &mut Vec<f32>) -> Result<(), BackendError> {
        check_bufs("to_host", &[x])?;
        out.clear();
        out.resize(x.len(), 0.0);
        self.dev.bind()?;
        if self.capture.is_some() {
            return Err(BackendError::InferenceFailed(
                "a decode graph keeps its logits on the device".into(),
            ));
        }
        // SAFETY: `out` holds exactly the block's `len` values.
        unsafe { drv::memcpy_dtoh_async(out.as_mut_slice(), x.ptr(), self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying to the host", e))?;
        self.dev.synchronize()
    }

    /// An asynchronous device-to-device copy (captured into a decode graph
    /// like any other step); without a buffer set by `keep_logits_in`, nothing.
    fn keep_last_row(&mut self, x: &CudaBuf) -> Result<(), BackendError> {
        let Some((dst, len)) = self.kept_logits else {
            return Ok(());
        };
        if self.in_rows() {
            return self.keep_rows(x, len);
        }
        if x.rows == 0 || x.cols != len {
            return Err(shape_error(format!(
                "keep_last_row: {}x{} for {len} logits",
                x.rows, x.cols
            )));
        }
        self.dev.bind()?;
        self.dev.kernels.note_write();
        // SAFETY: one row of `len` f32 inside the block, into a buffer of `len` f32.
        unsafe { drv::memcpy_dtod_async(dst, x.row_ptr(x.rows - 1), len * 4, self.dev.cu_stream()) }
            .map_err(|e| driver_error("keeping the logits on the device", e))
    }

    fn row_to_host(
        &mut self,
        x: &CudaBuf,
        row: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), BackendError> {
        if row >= x.rows {
            return Err(shape_error("row_to_host".into()));
        }
        check_bufs("row_to_host", &[x])?;
        if self.capture.is_some() {
            return Err(BackendError::InferenceFailed(
                "checkpoints are not recorded in a decode graph".into(),
            ));
        }
        out.clear();
        out.resize(x.cols, 0.0);
        self.dev.bind()?;
        // SAFETY: one row of `cols` f32 values inside the block.
        unsafe { drv::memcpy_dtoh_async(out.as_mut_slice(), x.row_ptr(row), self.dev.cu_stream()) }
            .map_err(|e| driver_error("copying to the host", e))?;
        self.dev.synchronize()
    }
}

/// The checked launch arguments of `out = x w^T (+ bias)` (shapes, weights
/// and buffers as `matmul` refuses them).
fn matmul_args(
    x: &CudaBuf,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: &mut CudaBuf,
) -> Result<MatmulArgs, BackendError> {
    if x.cols != w.cols || out.rows != x.rows || out.cols != w.rows || x.is_empty() || w.rows == 0 {
        return Err(shape_error(format!(
            "matmul: x {}x{}, w {}x{}, out {}x{}",
            x.rows, x.cols, w.rows, w.cols, out.rows, out.cols
        )));
    }
    check_weights("matmul", &[w])?;
    check_bufs("matmul", &[x, out])?;
    let bias = match bias {
        Some(b) if is_f32_vector(b, w.rows) => {
            check_weights("matmul bias", &[b])?;
            Some(b.vector())
        }
        Some(b) => {
            return Err(shape_error(format!(
                "matmul bias of {} values for {} rows",
                b.cols, w.rows
            )))
        }
        None => None,
    };
    Ok(MatmulArgs {
        w: w.stored(),
        x: x.input(),
        n: x.rows,
        bias,
        out: out.output(),
    })
}
