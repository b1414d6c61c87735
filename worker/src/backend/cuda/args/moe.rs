//! The argument structs of a mixture-of-experts feed-forward (gpt-oss): the
//! router's choice on the device, the chosen experts' mat-vecs, their
//! clamped SwiGLU and the weighted sum of their outputs.

use super::{plan, Stored};
use crate::backend::cuda::launch::{refusal, Kernel, KernelCall, Plan, Work};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::MOE_MAX_EXPERTS;
use crate::backend::BackendError;

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
}

impl ExpertMatVecArgs {
    /// Rows of one expert's matrix.
    pub fn rows(&self) -> usize {
        self.w.rows / self.experts.max(1)
    }
}

impl KernelCall for ExpertMatVecArgs {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        i32,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let dims = [
            ("rows", self.rows()),
            ("cols", self.w.cols),
            ("row_bytes", self.w.row_bytes),
            ("experts", self.experts),
            ("slots", self.slots),
            ("x_div", self.x_div),
        ];
        let buffers = [
            ("w", self.w.ptr.addr()),
            ("ids", self.ids.addr()),
            ("x", self.x.addr()),
            ("out", self.out.addr()),
        ];
        let work = Work::Experts {
            rows: self.rows(),
            slots: self.slots,
        };
        plan(Kernel::MatVecExperts(self.w.ty), dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Kernel::MatVecExperts(self.w.ty);
        if self.experts == 0 || !self.w.rows.is_multiple_of(self.experts) {
            let msg = format!("{} rows for {} experts", self.w.rows, self.experts);
            return Err(refusal(k, msg));
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
    fn params(&self) -> Self::Params {
        (
            self.w.ptr,
            self.w.row_bytes as i64,
            self.rows() as i32,
            self.w.cols as i32,
            self.experts as i32,
            self.ids,
            self.x_div as i32,
            self.x,
            DevPtr::or_null(self.bias),
            self.out,
        )
    }
}

/// `swiglu_oai`: gpt-oss's clamped SwiGLU, `out[i] = min(g, 7) *
/// sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`.
#[derive(Clone, Copy, Debug)]
pub struct SwigluOaiArgs {
    /// `[len]` f32 each.
    pub gate: DevPtr<f32>,
    pub up: DevPtr<f32>,
    pub len: usize,
    pub out: DevPtrMut<f32>,
}

impl KernelCall for SwigluOaiArgs {
    type Params = (DevPtr<f32>, DevPtr<f32>, i64, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        let buffers = [
            ("gate", self.gate.addr()),
            ("up", self.up.addr()),
            ("out", self.out.addr()),
        ];
        plan(Kernel::SwigluOai, [], buffers, Work::Elements(self.len))
    }
    fn params(&self) -> Self::Params {
        (self.gate, self.up, self.len as i64, self.out)
    }
}

/// `moe_sum`: `out[t] = sum over k of weights[t * used + k] * y[t * used + k]`.
#[derive(Clone, Copy, Debug)]
pub struct MoeSumArgs {
    /// `[rows * used, cols]` f32: each slot's expert output.
    pub y: DevPtr<f32>,
    /// `[rows * used]` f32.
    pub weights: DevPtr<f32>,
    pub rows: usize,
    pub used: usize,
    pub cols: usize,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for MoeSumArgs {
    type Params = (DevPtr<f32>, DevPtr<f32>, i32, i32, i64, DevPtrMut<f32>);

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
            self.weights,
            self.used as i32,
            self.cols as i32,
            (self.rows * self.cols) as i64,
            self.out,
        )
    }
}
