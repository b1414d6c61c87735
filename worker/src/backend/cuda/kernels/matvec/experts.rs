//! The argument structs of `matvec.cu`'s products of a mixture of
//! experts' chosen experts: `mv1e_*` from f32 x, `mv8e_*` from x split for
//! the integer units.

use super::family::{has_mv8_experts, Matvec};
use crate::backend::cuda::kernels::launch::{
    kernel_params, param_group, plan, refusal, KernelCall, Named, Plan, Work,
};
use crate::backend::cuda::kernels::operands::{Stored, StoredParams, X8Bufs, X8Reads};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;

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
pub(crate) fn expert_rows(w: &Stored, experts: usize) -> usize {
    w.rows / experts.max(1)
}

/// Refuses a stacked matrix `w` that does not split into `experts` matrices.
pub(crate) fn check_stacked(k: impl Named, w: &Stored, experts: usize) -> Result<(), BackendError> {
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
    fn check_shapes(&self, k: Matvec) -> Result<(), BackendError> {
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
}

param_group! {
    /// The parameters both kernels open with: the weights and their shape,
    /// the experts and the slots' rows of x.
    type ExpertHead;
    impl ExpertMatVecArgs {
        fn head_params(&self) {
            // One expert's matrix: the stacked one's first `rows()` rows.
            ..StoredParams = Stored { rows: self.rows(), ..self.w }.params(),
            i32 = self.experts as i32,
            DevPtr<i32> = self.ids,
            i32 = self.x_div as i32,
        }
    }
}

param_group! {
    /// The parameters both kernels close with: the bias and output, then
    /// the second matrix's weights, bias and output (null without one).
    type ExpertTail;
    impl ExpertMatVecArgs {
        fn tail_params(&self) {
            DevPtr<f32> = DevPtr::or_null(self.bias),
            DevPtrMut<f32> = self.out,
            DevPtr<u8> = DevPtr::or_null(self.second.map(|s| s.0.ptr)),
            DevPtr<f32> = DevPtr::or_null(self.second.and_then(|s| s.1)),
            DevPtrMut<f32> = DevPtrMut::or_null(self.second.map(|s| s.2)),
        }
    }
}

impl KernelCall for ExpertMatVecArgs {
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [
            ("w", self.w.ptr.addr()),
            ("ids", self.ids.addr()),
            ("x", self.x.addr()),
            ("out", self.out.addr()),
        ];
        let k = Matvec::MatVecExperts(self.w.ty);
        plan(k, self.dims(), buffers, self.work())
    }
    fn validate(&self) -> Result<(), BackendError> {
        self.check_shapes(Matvec::MatVecExperts(self.w.ty))
    }
    kernel_params! { self =>
        ..ExpertHead = self.head_params(),
        DevPtr<f32> = self.x,
        ..ExpertTail = self.tail_params(),
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
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
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
        plan(Matvec::MatVec8Experts(a.w.ty), a.dims(), buffers, a.work())
    }
    fn validate(&self) -> Result<(), BackendError> {
        let a = &self.args;
        let k = Matvec::MatVec8Experts(a.w.ty);
        if !a.w.cols.is_multiple_of(32) || !has_mv8_experts(a.w.ty) {
            let msg = format!("{} {} columns", a.w.cols, a.w.ty.name());
            return Err(refusal(k, msg));
        }
        a.check_shapes(k)
    }
    kernel_params! { self =>
        ..ExpertHead = self.args.head_params(),
        ..X8Reads = self.x8.reads(),
        ..ExpertTail = self.args.tail_params(),
    }
}
