//! Matrix products on the device (`Ops::matmul`, `Ops::matmuls`): which
//! path a product takes (cuBLAS over f16, the short-prompt kernels over x's
//! f16 parts, the integer mat-vecs from x split once for all the products
//! that read it, or `Kernels::matmul`), and the blocks those splits of x are
//! kept in.

use half::f16;

use super::buffers::{
    check_bufs, check_weights, is_f32_vector, shape_check, shape_error, CudaBuf, CudaWeight,
};
use super::state::{BlasSlot, SplitX};
use super::CudaOps;
use crate::backend::cuda::blas::{chunk_rows, Blas, F16Product};
use crate::backend::cuda::device::{DevBuf, Purpose};
use crate::backend::cuda::kernels::{
    AddBiasArgs, DequantF16Args, MatmulArgs, QuantizeX8Args, ToF16Args, X8Bufs,
};
use crate::backend::cuda::kernels::{Mv8Plan, MV8_LOOP_MAX_TOKENS};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;
use crate::model::ops::{Ops, Product};
use crate::quant::GgmlType;

/// Whether no buffer of `outs` overlaps x (a product that wrote x itself
/// leaves a split of x stale).
pub(super) fn apart(x: &CudaBuf, outs: &[&CudaBuf]) -> bool {
    let (xs, xe) = (x.ptr(), x.ptr() + x.len() as u64 * 4);
    outs.iter().all(|out| {
        let (os, oe) = (out.ptr(), out.ptr() + out.len() as u64 * 4);
        oe <= xs || xe <= os
    })
}

impl CudaOps {
    /// `Ops::matmul`: cuBLAS, the short-prompt kernels, `mv8_*` from x
    /// split once, or `Kernels::matmul`, as the product allows.
    pub(super) fn product(
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
    pub(super) fn products(
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
    pub(super) fn blas_ready(&mut self) -> bool {
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
    pub(super) fn reserve_blas_scratch(
        &mut self,
        values: usize,
    ) -> Result<DevPtrMut<f16>, BackendError> {
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
    pub(super) fn launch_to_f16(
        &self,
        m: &MatmulArgs,
        hi: DevPtrMut<f16>,
    ) -> Result<(), BackendError> {
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
    pub(super) fn split_x_f16(
        &mut self,
        m: &MatmulArgs,
    ) -> Result<(DevBuf, DevPtrMut<f16>), BackendError> {
        let mem = self
            .dev
            .alloc_async(Purpose::Scratch, (4 * m.n * m.w.cols) as u64)?;
        let hi = DevPtrMut::<f16>::new(mem.ptr());
        self.launch_to_f16(m, hi)?;
        Ok((mem, hi))
    }

    /// x of `m` in two f16 parts for `gemm_tck_*`, in the `x16` block:
    /// split unless the block holds this x already (Q, K and V read one).
    pub(super) fn x_f16(
        &mut self,
        x: &CudaBuf,
        m: &MatmulArgs,
    ) -> Result<DevPtr<f16>, BackendError> {
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
    pub(super) fn matmul_blas(&mut self, m: &MatmulArgs) -> Result<bool, BackendError> {
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

    pub(super) fn reserve_x8_values(&mut self, len: usize) -> Result<(), BackendError> {
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
    pub(super) fn quantized_x(&mut self, x: &CudaBuf) -> Result<Option<X8Bufs>, BackendError> {
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
    pub(super) fn x8_room(&mut self, len: usize) -> Result<Option<X8Bufs>, BackendError> {
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
    pub(super) fn x8_for(&self, out: &CudaBuf) -> Option<X8Bufs> {
        let block = self.x8.as_ref()?;
        let fits = out.rows == 1 && out.cols.is_multiple_of(32) && block.len >= out.len();
        (fits && self.dev.kernels.mv8_enabled()).then(|| X8Bufs::at(block.mem.ptr(), out.len()))
    }

    /// After the launch that split `out` into the x8 block.
    pub(super) fn x8_now_holds(&mut self, out: &CudaBuf) {
        let writes = self.dev.kernels.writes();
        if let Some(b) = self.x8.as_mut() {
            b.holds = Some((out.id(), out.rows, out.cols, writes));
        }
    }

    /// `out = x W^T (+ bias)` through `mv8_*`, when it applies; `false`:
    /// it does not, nothing was launched.
    pub(super) fn matmul_x8(
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
    pub(super) fn matmul_x8_plan(
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
    pub(super) fn x8_still_holds(&mut self, x: &CudaBuf, outs: &[&CudaBuf]) {
        let kernels = &self.dev.kernels;
        let block = self.x8.as_mut().expect("quantized_x reserved it");
        block.holds = apart(x, outs).then_some((x.id(), x.rows, x.cols, kernels.writes()));
    }
}

/// The checked launch arguments of `out = x w^T (+ bias)` (shapes, weights
/// and buffers as `matmul` refuses them).
pub(super) fn matmul_args(
    x: &CudaBuf,
    w: &CudaWeight,
    bias: Option<&CudaWeight>,
    out: &mut CudaBuf,
) -> Result<MatmulArgs, BackendError> {
    shape_check(
        x.cols != w.cols || out.rows != x.rows || out.cols != w.rows || x.is_empty() || w.rows == 0,
        || {
            format!(
                "matmul: x {}x{}, w {}x{}, out {}x{}",
                x.rows, x.cols, w.rows, w.cols, out.rows, out.cols
            )
        },
    )?;
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
