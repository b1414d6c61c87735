//! The argument structs of a mixture-of-experts feed-forward (gpt-oss): the
//! router's choice on the device, the chosen experts' mat-vecs, their
//! clamped SwiGLU and the weighted sum of their outputs.

use super::{plan, Stored, X8Bufs};
use crate::backend::cuda::launch::{
    has_mv8_experts, refusal, Kernel, KernelCall, Plan, Then, Work,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{f16_tiles, GTC_BK, MOE_MAX_EXPERTS};
use crate::backend::BackendError;
use half::f16;

/// `moe_route`: for each row of `logits`, the `used` highest (the lower
/// expert first on a tie) into `ids` and their softmax into `weights`.
#[derive(Clone, Copy, Debug)]
pub struct MoeRouteArgs {
    /// `[n, experts]` f32: the router's products and bias.
    pub logits: DevPtr<f32>,
    pub n: usize,
    pub experts: usize,
    /// At most `experts`.
    pub used: usize,
    /// `[n, used]` i32 and f32.
    pub ids: DevPtrMut<i32>,
    pub weights: DevPtrMut<f32>,
}

impl KernelCall for MoeRouteArgs {
    type Params = (DevPtr<f32>, i32, i32, i32, DevPtrMut<i32>, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        let dims = [
            ("n", self.n),
            ("experts", self.experts),
            ("used", self.used),
        ];
        let buffers = [
            ("logits", self.logits.addr()),
            ("ids", self.ids.addr()),
            ("weights", self.weights.addr()),
        ];
        let work = Work::Rows {
            rows: self.n,
            cols: self.experts,
        };
        plan(Kernel::MoeRoute, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.used > self.experts || self.experts > MOE_MAX_EXPERTS {
            let msg = format!(
                "{} of {} experts (at most {MOE_MAX_EXPERTS})",
                self.used, self.experts
            );
            return Err(refusal(Kernel::MoeRoute, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (
            self.logits,
            self.n as i32,
            self.experts as i32,
            self.used as i32,
            self.ids,
            self.weights,
        )
    }
}

/// `mv1e_<ty>`: for each slot `s` of `slots`, `out[s] = W_e x[s / x_div]
/// (+ bias[e])` with `e = ids[s]`, `W_e` expert `e`'s `rows` rows of `w`.
#[derive(Clone, Copy, Debug)]
pub struct ExpertMatVecArgs {
    /// `[experts * rows, cols]`: the experts' matrices one after another.
    pub w: Stored,
    pub experts: usize,
    /// `[slots]` i32, each below `experts` (`moe_route` writes them).
    pub ids: DevPtr<i32>,
    pub slots: usize,
    /// `[slots / x_div, cols]` f32: `x_div` slots share a row of x.
    pub x: DevPtr<f32>,
    pub x_div: usize,
    /// `[experts, rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[slots, rows]` f32.
    pub out: DevPtrMut<f32>,
    /// A second matrix of `w`'s shape and format, its bias and output, in
    /// the same launch (gate and up); or none.
    pub second: Option<(Stored, Option<DevPtr<f32>>, DevPtrMut<f32>)>,
}

/// Rows of one of the `experts` matrices stacked in `w`.
fn expert_rows(w: &Stored, experts: usize) -> usize {
    w.rows / experts.max(1)
}

/// Refuses a stacked matrix `w` that does not split into `experts` matrices.
fn check_stacked(k: Kernel, w: &Stored, experts: usize) -> Result<(), BackendError> {
    if experts == 0 || !w.rows.is_multiple_of(experts) {
        return Err(refusal(k, format!("{} rows for {experts} experts", w.rows)));
    }
    Ok(())
}

impl ExpertMatVecArgs {
    /// Rows of one expert's matrix.
    pub fn rows(&self) -> usize {
        expert_rows(&self.w, self.experts)
    }

    fn dims(&self) -> [(&'static str, usize); 6] {
        [
            ("rows", self.rows()),
            ("cols", self.w.cols),
            ("row_bytes", self.w.row_bytes),
            ("experts", self.experts),
            ("slots", self.slots),
            ("x_div", self.x_div),
        ]
    }

    fn work(&self) -> Work {
        Work::Experts {
            rows: self.rows(),
            cols: self.w.cols,
            slots: self.slots,
            matrices: 1 + usize::from(self.second.is_some()),
        }
    }

    /// The checks of either kernel `k` over these arguments: stacked
    /// matrices, a second one of the first's shape, whole rows of x.
    fn check_shapes(&self, k: Kernel) -> Result<(), BackendError> {
        check_stacked(k, &self.w, self.experts)?;
        if let Some((w2, _, out2)) = &self.second {
            let same = (w2.ty, w2.rows, w2.cols, w2.row_bytes)
                == (self.w.ty, self.w.rows, self.w.cols, self.w.row_bytes);
            if !same || w2.ptr.addr() == 0 || out2.addr() == 0 {
                return Err(refusal(k, "a second matrix of another shape".into()));
            }
        }
        if self.x_div == 0 || !self.slots.is_multiple_of(self.x_div) {
            let msg = format!(
                "{} slots over rows of x shared by {}",
                self.slots, self.x_div
            );
            return Err(refusal(k, msg));
        }
        Ok(())
    }

    /// The parameters both kernels open with: the weights and their shape,
    /// the experts and the slots' rows of x.
    fn head_params(&self) -> ExpertHead {
        (
            self.w.ptr,
            self.w.row_bytes as i64,
            self.rows() as i32,
            self.w.cols as i32,
            self.experts as i32,
            self.ids,
            self.x_div as i32,
        )
    }

    /// The parameters both kernels close with: the bias and output, then
    /// the second matrix's weights, bias and output (null without one).
    fn tail_params(&self) -> ExpertTail {
        (
            DevPtr::or_null(self.bias),
            self.out,
            DevPtr::or_null(self.second.map(|s| s.0.ptr)),
            DevPtr::or_null(self.second.and_then(|s| s.1)),
            DevPtrMut::or_null(self.second.map(|s| s.2)),
        )
    }
}

type ExpertHead = (DevPtr<u8>, i64, i32, i32, i32, DevPtr<i32>, i32);
type ExpertTail = (
    DevPtr<f32>,
    DevPtrMut<f32>,
    DevPtr<u8>,
    DevPtr<f32>,
    DevPtrMut<f32>,
);

impl KernelCall for ExpertMatVecArgs {
    /// `x` between the head and the tail.
    type Params = Then<ExpertHead, Then<(DevPtr<f32>,), ExpertTail>>;

    fn plan(&self) -> Plan {
        let buffers = [
            ("w", self.w.ptr.addr()),
            ("ids", self.ids.addr()),
            ("x", self.x.addr()),
            ("out", self.out.addr()),
        ];
        let k = Kernel::MatVecExperts(self.w.ty);
        plan(k, self.dims(), buffers, self.work())
    }
    fn validate(&self) -> Result<(), BackendError> {
        self.check_shapes(Kernel::MatVecExperts(self.w.ty))
    }
    fn params(&self) -> Self::Params {
        Then(self.head_params(), Then((self.x,), self.tail_params()))
    }
}

/// `mv8e_<ty>`: the products of [`ExpertMatVecArgs`] on the integer units,
/// reading x as `quantize_x8` (or `swiglu_oai`) split it into `x8` (`args.x`
/// itself is not read): rows of `cols` values one after another.
#[derive(Clone, Copy, Debug)]
pub struct ExpertMatVec8Call {
    pub args: ExpertMatVecArgs,
    pub x8: X8Bufs,
}

impl KernelCall for ExpertMatVec8Call {
    /// x's parts between the head and the tail.
    type Params =
        Then<ExpertHead, Then<(DevPtr<i8>, DevPtr<i8>, DevPtr<f32>, DevPtr<f32>), ExpertTail>>;

    fn plan(&self) -> Plan {
        let a = &self.args;
        let [hi, lo, d, sums] = self.x8.addrs();
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("ids", a.ids.addr()),
            hi,
            lo,
            d,
            sums,
            ("out", a.out.addr()),
        ];
        plan(Kernel::MatVec8Experts(a.w.ty), a.dims(), buffers, a.work())
    }
    fn validate(&self) -> Result<(), BackendError> {
        let a = &self.args;
        let k = Kernel::MatVec8Experts(a.w.ty);
        if !a.w.cols.is_multiple_of(32) || !has_mv8_experts(a.w.ty) {
            let msg = format!("{} {} columns", a.w.cols, a.w.ty.name());
            return Err(refusal(k, msg));
        }
        a.check_shapes(k)
    }
    fn params(&self) -> Self::Params {
        let a = &self.args;
        Then(a.head_params(), Then(self.x8.reads(), a.tail_params()))
    }
}

/// `moe_sum`: `out[t] = sum over k of weights[s] * y[pos[s]]`, `s = t *
/// used + k` (`y[s]` without `pos`).
#[derive(Clone, Copy, Debug)]
pub struct MoeSumArgs {
    /// `[rows * used, cols]` f32: each slot's expert output.
    pub y: DevPtr<f32>,
    /// `[rows * used]` i32: each slot's row of `y` (below `rows * used`),
    /// where `y` was gathered by expert; or none.
    pub pos: Option<DevPtr<i32>>,
    /// `[rows * used]` f32.
    pub weights: DevPtr<f32>,
    pub rows: usize,
    pub used: usize,
    pub cols: usize,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for MoeSumArgs {
    type Params = (
        DevPtr<f32>,
        DevPtr<i32>,
        DevPtr<f32>,
        i32,
        i32,
        i64,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let dims = [
            ("rows", self.rows),
            ("used", self.used),
            ("cols", self.cols),
        ];
        let buffers = [
            ("y", self.y.addr()),
            ("weights", self.weights.addr()),
            ("out", self.out.addr()),
        ];
        let len = self.rows.saturating_mul(self.cols);
        plan(Kernel::MoeSum, dims, buffers, Work::Elements(len))
    }
    fn params(&self) -> Self::Params {
        (
            self.y,
            DevPtr::or_null(self.pos),
            self.weights,
            self.used as i32,
            self.cols as i32,
            (self.rows * self.cols) as i64,
            self.out,
        )
    }
}

/// `moe_gather_f16`: row `i` of `hi`/`lo` is x's row `order[i] / used`,
/// split into f16 parts as `to_f16` splits it.
#[derive(Clone, Copy, Debug)]
pub struct MoeGatherF16Args {
    /// `[rows, cols]` f32, rows 32-byte aligned.
    pub x: DevPtr<f32>,
    /// `[m]` i32: each gathered row's slot (below `rows * used`).
    pub order: DevPtr<i32>,
    pub used: usize,
    /// A multiple of 8.
    pub cols: usize,
    pub m: usize,
    /// `[m, cols]` f16 each, 16-byte aligned.
    pub hi: DevPtrMut<f16>,
    pub lo: DevPtrMut<f16>,
}

impl KernelCall for MoeGatherF16Args {
    type Params = (
        DevPtr<f32>,
        DevPtr<i32>,
        i32,
        i32,
        i64,
        DevPtrMut<f16>,
        DevPtrMut<f16>,
    );

    fn plan(&self) -> Plan {
        let dims = [("used", self.used), ("cols", self.cols), ("m", self.m)];
        let buffers = [
            ("x", self.x.addr()),
            ("order", self.order.addr()),
            ("hi", self.hi.addr()),
            ("lo", self.lo.addr()),
        ];
        let len = self.m.saturating_mul(self.cols) / 8;
        plan(Kernel::MoeGatherF16, dims, buffers, Work::Elements(len))
    }
    fn validate(&self) -> Result<(), BackendError> {
        let aligned = self.x.addr().is_multiple_of(32)
            && self.hi.addr().is_multiple_of(16)
            && self.lo.addr().is_multiple_of(16);
        if !self.cols.is_multiple_of(8) || !aligned {
            let msg = format!("rows of {} values, x at {:#x}", self.cols, self.x.addr());
            return Err(refusal(Kernel::MoeGatherF16, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (
            self.x,
            self.order,
            self.used as i32,
            self.cols as i32,
            (self.m * self.cols / 8) as i64,
            self.hi,
            self.lo,
        )
    }
}

/// `gemm_moe_<ty>`: for each tile `y` of `tiles` (`[expert, first, rows,
/// 0]` i32), `out[first + i] = W_expert xh[first + i] (+ bias[expert])` for
/// `i < rows`, x in two f16 parts.
#[derive(Clone, Copy, Debug)]
pub struct ExpertGemmArgs {
    /// `[experts * rows, cols]` in a format with f16 tiles; `cols` a
    /// multiple of `GTC_BK`.
    pub w: Stored,
    pub experts: usize,
    /// `[n_tiles, 4]` i32, each tile's rows at most `GTC_BT`.
    pub tiles: DevPtr<i32>,
    pub n_tiles: usize,
    /// `[2, m, cols]` f16: the gathered rows' high parts, then their low.
    pub xh: DevPtr<f16>,
    pub m: usize,
    /// `[experts, rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[m, rows]` f32.
    pub out: DevPtrMut<f32>,
}

impl ExpertGemmArgs {
    fn rows(&self) -> usize {
        expert_rows(&self.w, self.experts)
    }
}

impl KernelCall for ExpertGemmArgs {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        DevPtr<f16>,
        i32,
        DevPtr<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let dims = [
            ("rows", self.rows()),
            ("cols", self.w.cols),
            ("row_bytes", self.w.row_bytes),
            ("experts", self.experts),
            ("n_tiles", self.n_tiles),
            ("m", self.m),
        ];
        let buffers = [
            ("w", self.w.ptr.addr()),
            ("tiles", self.tiles.addr()),
            ("xh", self.xh.addr()),
            ("out", self.out.addr()),
        ];
        let work = Work::ExpertTiles {
            rows: self.rows(),
            tiles: self.n_tiles,
        };
        plan(Kernel::GemmExperts(self.w.ty), dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Kernel::GemmExperts(self.w.ty);
        if !f16_tiles(self.w.ty) {
            return Err(refusal(k, format!("{} has no f16 tiles", self.w.ty)));
        }
        check_stacked(k, &self.w, self.experts)?;
        if !self.w.cols.is_multiple_of(GTC_BK as usize) || !self.xh.addr().is_multiple_of(16) {
            let msg = format!("rows of {} values, x at {:#x}", self.w.cols, self.xh.addr());
            return Err(refusal(k, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (
            self.w.ptr,
            self.w.row_bytes as i64,
            self.rows() as i32,
            self.w.cols as i32,
            self.experts as i32,
            self.tiles,
            self.xh,
            self.m as i32,
            DevPtr::or_null(self.bias),
            self.out,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    fn stored(ty: GgmlType, rows: usize, cols: usize) -> Stored {
        Stored {
            ty,
            ptr: DevPtr::new(0x1000),
            row_bytes: ty.bytes_for(cols as u64).unwrap_or(1) as usize,
            rows,
            cols,
        }
    }

    /// Every launch of the experts' kernels is checked before it is queued
    /// (M0-W-1431): shapes that do not split into experts, a second matrix
    /// of another shape, pairs over rows of x that do not divide, more
    /// experts than the router holds, formats without f16 tiles.
    #[test]
    fn expert_launches_refuse_shapes_that_do_not_fit() {
        let mxfp4 = GgmlType::Mxfp4;
        let mv = ExpertMatVecArgs {
            w: stored(mxfp4, 4 * 64, 256),
            experts: 4,
            ids: DevPtr::new(0x2000),
            slots: 6,
            x: DevPtr::new(0x3000),
            x_div: 2,
            bias: None,
            out: DevPtrMut::new(0x4000),
            second: None,
        };
        assert!(mv.check().is_ok());
        assert_eq!(mv.rows(), 64);
        assert!(ExpertMatVecArgs { experts: 3, ..mv }.check().is_err());
        assert!(ExpertMatVecArgs { x_div: 4, ..mv }.check().is_err());
        assert!(ExpertMatVecArgs { slots: 0, ..mv }.check().is_err());
        let second = |w: Stored| ExpertMatVecArgs {
            second: Some((w, None, DevPtrMut::new(0x5000))),
            ..mv
        };
        assert!(second(stored(mxfp4, 4 * 64, 256)).check().is_ok());
        assert!(second(stored(mxfp4, 4 * 32, 256)).check().is_err());
        assert!(second(stored(GgmlType::Q8_0, 4 * 64, 256)).check().is_err());
        // On the integer units: the same checks, and whole 32-value groups
        // of a format with a unit.
        let x8 = X8Bufs::at(0x6000, 6 * 256);
        let mv8 = |args: ExpertMatVecArgs| ExpertMatVec8Call { args, x8 }.check();
        assert!(mv8(mv).is_ok());
        assert!(mv8(ExpertMatVecArgs { x_div: 4, ..mv }).is_err());
        assert!(mv8(second(stored(mxfp4, 4 * 32, 256))).is_err());
        for (ty, cols, ok) in [(GgmlType::Q8_0, 256, true), (mxfp4, 240, false)] {
            let w = stored(ty, 4 * 64, cols);
            assert_eq!(mv8(ExpertMatVecArgs { w, ..mv }).is_ok(), ok, "{ty} {cols}");
        }
        assert!(mv8(ExpertMatVecArgs {
            w: stored(GgmlType::F16, 4 * 64, 256),
            ..mv
        })
        .is_err());

        let route = MoeRouteArgs {
            logits: DevPtr::new(0x1000),
            n: 3,
            experts: 32,
            used: 4,
            ids: DevPtrMut::new(0x2000),
            weights: DevPtrMut::new(0x3000),
        };
        assert!(route.check().is_ok());
        assert!(MoeRouteArgs { used: 33, ..route }.check().is_err());
        let too_many = MOE_MAX_EXPERTS + 1;
        assert!(MoeRouteArgs {
            experts: too_many,
            ..route
        }
        .check()
        .is_err());

        let gemm = ExpertGemmArgs {
            w: stored(mxfp4, 4 * 64, 256),
            experts: 4,
            tiles: DevPtr::new(0x2000),
            n_tiles: 5,
            xh: DevPtr::new(0x3000),
            m: 200,
            bias: None,
            out: DevPtrMut::new(0x4000),
        };
        assert!(gemm.check().is_ok());
        assert!(ExpertGemmArgs {
            w: stored(mxfp4, 4 * 64, 96),
            ..gemm
        }
        .check()
        .is_ok());
        assert!(ExpertGemmArgs {
            w: stored(mxfp4, 4 * 64, 80),
            ..gemm
        }
        .check()
        .is_err());
        assert!(ExpertGemmArgs {
            w: stored(GgmlType::F16, 4 * 64, 256),
            ..gemm
        }
        .check()
        .is_err());
        assert!(ExpertGemmArgs {
            xh: DevPtr::new(0x3008),
            ..gemm
        }
        .check()
        .is_err());

        let gather = MoeGatherF16Args {
            x: DevPtr::new(0x1000),
            order: DevPtr::new(0x2000),
            used: 4,
            cols: 256,
            m: 12,
            hi: DevPtrMut::new(0x3000),
            lo: DevPtrMut::new(0x4000),
        };
        assert!(gather.check().is_ok());
        assert!(MoeGatherF16Args { cols: 12, ..gather }.check().is_err());
        assert!(MoeGatherF16Args {
            x: DevPtr::new(0x1010),
            ..gather
        }
        .check()
        .is_err());
    }
}
