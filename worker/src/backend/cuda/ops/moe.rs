//! A mixture-of-experts feed-forward on `CudaOps` (`Ops::moe` of gpt-oss and
//! Qwen3-MoE):
//! from the router's logits, the choice of experts and their weights on the
//! device (`moe_route`), the chosen experts' gate and up products (`mv8e_*`,
//! or `mv1e_*` in formats without it: only their rows of the stacked expert
//! matrices are read), the gated activation, their down products and the
//! weighted sum. A decode step sends nothing to the host, so it runs inside
//! its CUDA graph; a prompt's (row, expert) pairs are sorted by expert on
//! the host for `gemm_moe_*`.

use super::buffers::{check_bufs, check_weights, shape_error, BufMem, CudaBuf, CudaWeight};
use super::CudaOps;
use half::f16;

use crate::backend::cuda::device::{align_up, Purpose};
use crate::backend::cuda::kernels::{
    ExpertGemmArgs, ExpertMatVec8Call, ExpertMatVecArgs, Glu, GluArgs, MoeGatherF16Args,
    MoeRouteArgs, MoeSumArgs, ToF16Args, X8Bufs,
};
use crate::backend::cuda::kernels::{Gemm, Kernel};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{GTC_BK, GTC_BT};
use crate::backend::BackendError;
use crate::model::ops::{ExpertAct, MoeWeights, Ops};
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
    let f32_rows = |b: Option<&CudaWeight>, rows: usize, cols: usize| {
        b.is_none_or(|b| b.ty == GgmlType::F32 && b.rows == rows && b.cols == cols)
    };
    if !f32_rows(w.gate_bias, experts, n_ff)
        || !f32_rows(w.up_bias, experts, n_ff)
        || !f32_rows(w.down_bias, experts, d)
    {
        return Err(bad("biases (f32, one row per expert)"));
    }
    let biases = [w.gate_bias, w.up_bias, w.down_bias];
    let mut weights = vec![w.gate, w.up, w.down];
    weights.extend(biases.into_iter().flatten());
    check_weights("moe", &weights)?;
    check_bufs("moe", &[x, logits, out])?;
    Ok(MoeShape {
        experts,
        used,
        n_ff,
    })
}

/// The experts' activation kernel.
fn glu(act: ExpertAct) -> Glu {
    match act {
        ExpertAct::SwiGlu => Glu::Silu,
        ExpertAct::SwiGluOai => Glu::SiluOai,
    }
}

/// A view of `rows` rows of `cols` at `ptr` (inside a block the caller holds).
fn view(ptr: u64, rows: usize, cols: usize) -> CudaBuf {
    CudaBuf::new(BufMem::Arena(ptr), rows, cols)
}

impl CudaOps {
    /// Room for a decode step's `moe` scratch, made at load: a step inside
    /// a CUDA graph may not allocate.
    pub fn reserve_moe(&mut self, used: usize, n_ff: usize, d: usize) -> Result<(), BackendError> {
        // The step's splits for `mv8e_*`: x, and the SwiGLU's `used` rows.
        self.reserve_x8_values(d.max(used * n_ff))?;
        let bytes = scratch_bytes(&scratch_parts(1, used, n_ff, d));
        if self.moe_step.as_ref().is_some_and(|b| b.bytes() >= bytes) {
            return Ok(());
        }
        self.dev.bind()?;
        // Held for the model's lifetime, as the x8 block is.
        self.moe_step = Some(self.dev.alloc(Purpose::Weights, bytes)?);
        Ok(())
    }

    /// `Ops::moe`, in slices of rows whose (row, expert) pairs fit one
    /// launch: many rows (prefill) grouped by expert through `gemm_moe_*`,
    /// a few (decode, and inside a graph) through `mv1e_*`.
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
            if self.grouped(&xs, w) {
                self.experts_grouped(&xs, &ls, w, &shape, &mut os)?;
            } else {
                self.experts_rows(&xs, &ls, w, &shape, &mut os)?;
            }
        }
        Ok(())
    }

    /// Whether `gemm_moe_*` takes these rows: enough of them, outside a
    /// capture (the grouping is made on the host), experts in a format with
    /// f16 tiles and widths of whole 32-column steps.
    fn grouped(&self, x: &CudaBuf, w: &MoeWeights<'_, CudaWeight>) -> bool {
        let k = Kernel::Gemm(Gemm::Moe(w.gate.ty));
        x.rows >= MOE_GROUPED_MIN_ROWS
            && self.capture.is_none()
            && !self.in_rows()
            && [w.gate, w.up, w.down]
                .iter()
                .all(|m| m.ty == w.gate.ty && m.cols.is_multiple_of(GTC_BK as usize))
            && x.cols.is_multiple_of(8)
            && self.dev.kernels.has(k)
    }

    /// The scratch of one call: `parts` carved from one block (inside a
    /// capture, the one reserved at load; else from the pool).
    fn moe_scratch(
        &mut self,
        parts: &[(usize, usize)],
    ) -> Result<(Option<CudaBuf>, Vec<CudaBuf>), BackendError> {
        let bytes = scratch_bytes(parts);
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
        for &(r, c) in parts {
            views.push(view(at, r, c));
            at += align_up((r * c * 4) as u64);
        }
        Ok((pooled, views))
    }

    /// The router's choice of `used` experts per row and their weights.
    fn route(
        &self,
        logits: &CudaBuf,
        used: usize,
        ids: &CudaBuf,
        weights: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        self.dev.kernels.launch(
            &self.dev.stream,
            &MoeRouteArgs {
                logits: logits.input(),
                n: logits.rows,
                experts: logits.cols,
                used,
                ids: DevPtrMut::new(ids.ptr()),
                weights: weights.output(),
            },
        )
    }

    /// A few rows: each (row, chosen expert) pair's products by `mv8e_*`
    /// where the experts' format has it (x split once for gate and up, the
    /// activation's output split by its kernel for down), else `mv1e_*`.
    fn experts_rows(
        &mut self,
        x: &CudaBuf,
        logits: &CudaBuf,
        w: &MoeWeights<'_, CudaWeight>,
        s: &MoeShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let (rows, d, used) = (x.rows, x.cols, s.used);
        let (_block, views) = self.moe_scratch(&scratch_parts(rows, used, s.n_ff, d))?;
        let [ids, mut weights, mut gate, mut up, mut act, mut down]: [CudaBuf; 6] = views
            .try_into()
            .map_err(|_| shape_error("moe scratch".into()))?;
        self.dev.bind()?;
        self.route(logits, used, &ids, &mut weights)?;
        let ids_r = DevPtr::<i32>::new(ids.ptr());
        let slots = rows * used;
        let product = |m: &CudaWeight,
                       bias: Option<&CudaWeight>,
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
                bias: bias.map(|b| b.vector()),
                out,
                second: None,
            }
        };
        // Room for both splits first: the block is not replaced between them.
        let integer =
            self.integer_experts(w, d, s.n_ff) && self.x8_room(x.len().max(act.len()))?.is_some();
        let x8 = if integer { self.quantized_x(x)? } else { None };
        // Gate and up in one launch where they are stored alike.
        let mut gate_up = product(w.gate, w.gate_bias, x.input(), used, gate.output());
        let up_args = product(w.up, w.up_bias, x.input(), used, up.output());
        if (w.up.ty, w.up.rows, w.up.row_bytes) == (w.gate.ty, w.gate.rows, w.gate.row_bytes) {
            gate_up.second = Some((up_args.w, up_args.bias, up_args.out));
            self.expert_product(gate_up, x8)?;
        } else {
            self.expert_product(gate_up, x8)?;
            self.expert_product(up_args, x8)?;
        }
        if x8.is_some() {
            self.x8_still_holds(x, &[&gate, &up]);
        }
        let act_x8 = if integer {
            self.x8_room(act.len())?
        } else {
            None
        };
        let glu = GluArgs {
            act: glu(w.act),
            gate: gate.input(),
            up: up.input(),
            len: slots * s.n_ff,
            out: act.output(),
            x8: act_x8,
        };
        self.launch_splitting(&glu, &act)?;
        let down_args = product(w.down, w.down_bias, act.input(), 1, down.output());
        self.expert_product(down_args, act_x8)?;
        if act_x8.is_some() {
            self.x8_still_holds(&act, &[&down]);
        }
        let sum = MoeSumArgs {
            y: down.input(),
            pos: None,
            weights: weights.input(),
            rows,
            used,
            cols: d,
            out: out.output(),
        };
        self.dev.kernels.launch(&self.dev.stream, &sum)
    }

    /// Whether the experts' products take `mv8e_*`: the integer mat-vec on
    /// and compiled for their one format, rows of x of whole 32-value groups.
    fn integer_experts(&self, w: &MoeWeights<'_, CudaWeight>, d: usize, n_ff: usize) -> bool {
        let ty = w.gate.ty;
        [w.up, w.down].iter().all(|m| m.ty == ty)
            && d.is_multiple_of(32)
            && n_ff.is_multiple_of(32)
            && self.dev.kernels.mv8_experts_ready(ty)
    }

    /// One launch of the chosen experts' products: `mv8e_*` from x split
    /// into `x8`, or `mv1e_*` from x itself.
    fn expert_product(
        &self,
        args: ExpertMatVecArgs,
        x8: Option<X8Bufs>,
    ) -> Result<(), BackendError> {
        let (k, st) = (&self.dev.kernels, &self.dev.stream);
        match x8 {
            Some(x8) => k.launch(st, &ExpertMatVec8Call { args, x8 }),
            None => k.launch(st, &args),
        }
    }

    /// Many rows: the (row, chosen expert) pairs sorted by expert on the
    /// host (the choice is copied back: prefill only), x's rows gathered in
    /// that order, and each product one `gemm_moe_*` launch over every
    /// expert's tiles of rows; the weighted sum reads each pair's row back.
    fn experts_grouped(
        &mut self,
        x: &CudaBuf,
        logits: &CudaBuf,
        w: &MoeWeights<'_, CudaWeight>,
        s: &MoeShape,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        let (rows, d, used, ff) = (x.rows, x.cols, s.used, s.n_ff);
        let m = rows * used;
        // ids, weights, gate, up, act, down, then x and act in f16 parts.
        let mut parts = scratch_parts(rows, used, ff, d).to_vec();
        parts.extend([(m, d), (m, ff)]);
        let (_block, views) = self.moe_scratch(&parts)?;
        let [ids, mut weights, mut gate, mut up, mut act, mut down, xh, acth]: [CudaBuf; 8] = views
            .try_into()
            .map_err(|_| shape_error("moe scratch".into()))?;
        self.dev.bind()?;
        self.route(logits, used, &ids, &mut weights)?;
        let mut chosen = Vec::new();
        self.to_host(&ids, &mut chosen)?;
        let chosen: Vec<usize> = chosen.iter().map(|v| v.to_bits() as usize).collect();
        let groups = ExpertGroups::new(&chosen, s.experts)?;
        let index = self.upload_words(&groups.words())?;
        let (order, pos, tiles) = groups.pointers(index.ptr());
        let k = &self.dev.kernels;
        let st = &self.dev.stream;
        let half = |b: &CudaBuf, cols: usize| {
            let p = b.ptr();
            (
                DevPtrMut::<f16>::new(p),
                DevPtrMut::<f16>::new(p + (m * cols * 2) as u64),
            )
        };
        let (xhi, xlo) = half(&xh, d);
        k.launch(
            st,
            &MoeGatherF16Args {
                x: x.input(),
                order,
                used,
                cols: d,
                m,
                hi: xhi,
                lo: xlo,
            },
        )?;
        let product = |mat: &CudaWeight,
                       bias: Option<&CudaWeight>,
                       xh: DevPtrMut<f16>,
                       out: DevPtrMut<f32>| ExpertGemmArgs {
            w: mat.stored(),
            experts: s.experts,
            tiles,
            n_tiles: groups.tiles.len(),
            xh: xh.as_const(),
            m,
            bias: bias.map(|b| b.vector()),
            out,
        };
        k.launch(st, &product(w.gate, w.gate_bias, xhi, gate.output()))?;
        k.launch(st, &product(w.up, w.up_bias, xhi, up.output()))?;
        let glu = GluArgs {
            act: glu(w.act),
            gate: gate.input(),
            up: up.input(),
            len: m * ff,
            out: act.output(),
            x8: None,
        };
        k.launch(st, &glu)?;
        let (ahi, alo) = half(&acth, ff);
        k.launch(
            st,
            &ToF16Args {
                x: act.input(),
                len: m * ff,
                hi: ahi,
                lo: alo,
            },
        )?;
        k.launch(st, &product(w.down, w.down_bias, ahi, down.output()))?;
        let sum = MoeSumArgs {
            y: down.input(),
            pos: Some(pos),
            weights: weights.input(),
            rows,
            used,
            cols: d,
            out: out.output(),
        };
        k.launch(st, &sum)
    }
}

/// Rows of x from which a mixture of experts is grouped (`gemm_moe_*`);
/// fewer go through `mv1e_*` pair by pair.
const MOE_GROUPED_MIN_ROWS: usize = 8;

/// The (row, chosen expert) pairs of a call sorted by expert, stably: the
/// order `gemm_moe_*` reads them in, each pair's place in it, and the
/// tiles of at most `GTC_BT` pairs of one expert each.
struct ExpertGroups {
    /// `order[i]`: the pair (`row * used + choice`) at place `i`.
    order: Vec<u32>,
    /// `pos[pair]`: its place.
    pos: Vec<u32>,
    /// `[expert, first place, pairs, 0]`.
    tiles: Vec<[u32; 4]>,
}

impl ExpertGroups {
    fn new(chosen: &[usize], experts: usize) -> Result<ExpertGroups, BackendError> {
        let mut count = vec![0usize; experts];
        for &e in chosen {
            *count.get_mut(e).ok_or_else(|| {
                BackendError::InferenceFailed(format!("moe: expert {e} of {experts} chosen"))
            })? += 1;
        }
        let mut next = Vec::with_capacity(experts);
        let mut tiles = Vec::new();
        let mut at = 0usize;
        for (e, &c) in count.iter().enumerate() {
            next.push(at);
            for t0 in (0..c).step_by(GTC_BT as usize) {
                let n = (GTC_BT as usize).min(c - t0);
                tiles.push([e as u32, (at + t0) as u32, n as u32, 0]);
            }
            at += c;
        }
        let (mut order, mut pos) = (vec![0u32; chosen.len()], vec![0u32; chosen.len()]);
        for (pair, &e) in chosen.iter().enumerate() {
            order[next[e]] = pair as u32;
            pos[pair] = next[e] as u32;
            next[e] += 1;
        }
        Ok(ExpertGroups { order, pos, tiles })
    }

    /// `order`, `pos` and `tiles` one after another, for one upload.
    fn words(&self) -> Vec<u32> {
        let mut w = self.order.clone();
        w.extend(&self.pos);
        w.extend(self.tiles.iter().flatten());
        w
    }

    /// Where `order`, `pos` and `tiles` lie in the upload at `base`.
    fn pointers(&self, base: u64) -> (DevPtr<i32>, DevPtr<i32>, DevPtr<i32>) {
        let m = self.order.len() as u64;
        (
            DevPtr::new(base),
            DevPtr::new(base + 4 * m),
            DevPtr::new(base + 8 * m),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs sorted by expert, stably; each pair's place; tiles of one
    /// expert each, at most `GTC_BT` pairs; an expert out of range refused.
    #[test]
    fn expert_groups_sort_pairs_stably_and_tile_them() {
        let g = ExpertGroups::new(&[2, 0, 2, 1, 0, 2], 4).unwrap();
        assert_eq!(g.order, [1, 4, 3, 0, 2, 5]);
        assert_eq!(g.pos, [3, 0, 4, 2, 1, 5]);
        assert_eq!(g.tiles, [[0, 0, 2, 0], [1, 2, 1, 0], [2, 3, 3, 0]]);
        let words = g.words();
        assert_eq!(words.len(), 6 + 6 + 3 * 4);
        let (order, pos, tiles) = g.pointers(0x1000);
        assert_eq!(
            (order.addr(), pos.addr(), tiles.addr()),
            (0x1000, 0x1018, 0x1030)
        );

        let bt = GTC_BT as usize;
        let many = vec![1usize; 2 * bt + 2];
        let g = ExpertGroups::new(&many, 2).unwrap();
        let t = GTC_BT;
        assert_eq!(g.tiles, [[1, 0, t, 0], [1, t, t, 0], [1, 2 * t, 2, 0]]);
        assert!(ExpertGroups::new(&[0, 3], 3).is_err());
    }
}
