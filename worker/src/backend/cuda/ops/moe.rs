//! A mixture-of-experts feed-forward on `CudaOps` (gpt-oss's `Ops::moe`):
//! from the router's logits, the choice of experts and their weights on the
//! device (`moe_route`), the chosen experts' gate and up products
//! (`mv1e_*`: only their rows of the stacked expert matrices are read), the
//! clamped SwiGLU, their down products and the weighted sum. Nothing goes to
//! the host, so a decode step runs inside its CUDA graph.

use super::{check_bufs, check_weights, shape_error, BufMem, CudaBuf, CudaOps, CudaWeight};
use crate::backend::cuda::args::{ExpertMatVecArgs, MoeRouteArgs, MoeSumArgs, SwigluOaiArgs};
use crate::backend::cuda::device::{align_up, Purpose};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;
use crate::model::ops::MoeWeights;
use crate::quant::GgmlType;

/// The parts of one call's scratch, `rows` rows of x: each `(rows, cols)`.
fn scratch_parts(rows: usize, used: usize, n_ff: usize, d: usize) -> [(usize, usize); 6] {
    [
        (rows, used),        // chosen experts (i32)
        (rows, used),        // their weights
        (rows * used, n_ff), // gate
        (rows * used, n_ff), // up
        (rows * used, n_ff), // act
        (rows * used, d),    // down
    ]
}

/// Bytes of the scratch of [`scratch_parts`], each part on its own 256 bytes.
fn scratch_bytes(parts: &[(usize, usize)]) -> u64 {
    parts
        .iter()
        .map(|&(r, c)| align_up((r * c * 4) as u64))
        .sum()
}

/// The checked shapes of one `moe` call.
struct MoeShape {
    experts: usize,
    used: usize,
    n_ff: usize,
}

fn check_moe(
    x: &CudaBuf,
    logits: &CudaBuf,
    w: &MoeWeights<'_, CudaWeight>,
    out: &CudaBuf,
) -> Result<MoeShape, BackendError> {
    let (d, experts, used) = (x.cols, w.experts, w.used);
    let bad = |what: &str| shape_error(format!("moe: {what}"));
    if experts == 0 || used == 0 || used > experts || x.is_empty() {
        return Err(bad(&format!("{used} of {experts} experts")));
    }
    if out.rows != x.rows || out.cols != d {
        return Err(bad("output"));
    }
    if logits.rows != x.rows || logits.cols != experts {
        return Err(bad("router logits"));
    }
    let n_ff = w.gate.rows / experts;
    let stacked =
        |m: &CudaWeight, rows: usize, cols: usize| m.rows == experts * rows && m.cols == cols;
    if !stacked(w.gate, n_ff, d)
        || !stacked(w.up, n_ff, d)
        || !stacked(w.down, d, n_ff)
        || n_ff == 0
    {
        return Err(bad("expert matrices"));
    }
    let f32_rows = |b: &CudaWeight, rows: usize, cols: usize| {
        b.ty == GgmlType::F32 && b.rows == rows && b.cols == cols
    };
    if !f32_rows(w.gate_bias, experts, n_ff)
        || !f32_rows(w.up_bias, experts, n_ff)
        || !f32_rows(w.down_bias, experts, d)
    {
        return Err(bad("biases (f32, one row per expert)"));
    }
    check_weights(
        "moe",
        &[w.gate, w.gate_bias, w.up, w.up_bias, w.down, w.down_bias],
    )?;
    check_bufs("moe", &[x, logits, out])?;
    Ok(MoeShape {
        experts,
        used,
        n_ff,
    })
}

/// A view of `rows` rows of `cols` at `ptr` (inside a block the caller holds).
fn view(ptr: u64, rows: usize, cols: usize) -> CudaBuf {
    CudaBuf::new(BufMem::Arena(ptr), rows, cols)
}

impl CudaOps {
    /// Room for a decode step's `moe` scratch, made at load: a step inside
    /// a CUDA graph may not allocate.
    pub fn reserve_moe(&mut self, used: usize, n_ff: usize, d: usize) -> Result<(), BackendError> {
        let bytes = scratch_bytes(&scratch_parts(1, used, n_ff, d));
        if self.moe_step.as_ref().is_some_and(|b| b.bytes() >= bytes) {
            return Ok(());
        }
        self.dev.bind()?;
        // Held for the model's lifetime, as the x8 block is.
        self.moe_step = Some(self.dev.alloc(Purpose::Weights, bytes)?);
        Ok(())
    }

    /// `Ops::moe`, in slices of rows whose (row, expert) pairs fit one launch.
    pub(super) fn experts(
        &mut self,
        x: &CudaBuf,
        logits: &CudaBuf,
        w: &MoeWeights<'_, CudaWeight>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let shape = check_moe(x, logits, w, out)?;
        let step = (65535 / shape.used).max(1);
        for t0 in (0..x.rows).step_by(step) {
            let rows = step.min(x.rows - t0);
            let xs = view(x.row_ptr(t0), rows, x.cols);
            let ls = view(logits.row_ptr(t0), rows, logits.cols);
            let mut os = view(out.row_ptr(t0), rows, out.cols);
            self.experts_rows(&xs, &ls, w, &shape, &mut os)?;
        }
        Ok(())
    }

    fn experts_rows(
        &mut self,
        x: &CudaBuf,
        logits: &CudaBuf,
        w: &MoeWeights<'_, CudaWeight>,
        s: &MoeShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let (rows, d, used) = (x.rows, x.cols, s.used);
        let parts = scratch_parts(rows, used, s.n_ff, d);
        let bytes = scratch_bytes(&parts);
        // Inside a capture, the block reserved at load (one row); else the pool.
        let pooled = match self.capture {
            Some(_) => None,
            None => Some(self.alloc_buf(1, (bytes / 4) as usize)?),
        };
        let base = match (&pooled, &self.moe_step) {
            (Some(b), _) => b.ptr(),
            (None, Some(b)) if b.bytes() >= bytes => b.ptr(),
            _ => {
                return Err(BackendError::InferenceFailed(
                    "moe: no room reserved for a captured step".into(),
                ))
            }
        };
        let mut views = Vec::with_capacity(parts.len());
        let mut at = base;
        for &(r, c) in &parts {
            views.push(view(at, r, c));
            at += align_up((r * c * 4) as u64);
        }
        let [ids, mut weights, mut gate, mut up, mut act, mut down]: [CudaBuf; 6] = views
            .try_into()
            .map_err(|_| shape_error("moe scratch".into()))?;
        self.dev.bind()?;
        let k = &self.dev.kernels;
        let st = &self.dev.stream;
        let ids_w = DevPtrMut::<i32>::new(ids.ptr());
        k.launch(
            st,
            &MoeRouteArgs {
                logits: logits.input(),
                n: rows,
                experts: s.experts,
                used,
                ids: ids_w,
                weights: weights.output(),
            },
        )?;
        let ids_r = DevPtr::<i32>::new(ids.ptr());
        let slots = rows * used;
        let product = |m: &CudaWeight,
                       bias: &CudaWeight,
                       x: DevPtr<f32>,
                       x_div: usize,
                       out: DevPtrMut<f32>| {
            ExpertMatVecArgs {
                w: m.stored(),
                experts: s.experts,
                ids: ids_r,
                slots,
                x,
                x_div,
                bias: Some(bias.vector()),
                out,
            }
        };
        k.launch(
            st,
            &product(w.gate, w.gate_bias, x.input(), used, gate.output()),
        )?;
        k.launch(st, &product(w.up, w.up_bias, x.input(), used, up.output()))?;
        k.launch(
            st,
            &SwigluOaiArgs {
                gate: gate.input(),
                up: up.input(),
                len: slots * s.n_ff,
                out: act.output(),
            },
        )?;
        k.launch(
            st,
            &product(w.down, w.down_bias, act.input(), 1, down.output()),
        )?;
        k.launch(
            st,
            &MoeSumArgs {
                y: down.input(),
                weights: weights.input(),
                rows,
                used,
                cols: d,
                out: out.output(),
            },
        )?;
        Ok(())
    }
}
