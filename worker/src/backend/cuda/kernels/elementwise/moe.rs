//! The argument structs of `elementwise.cu`'s kernels of a mixture of
//! experts (gpt-oss): the router's choice on the device, a prompt's rows
//! gathered by expert, and the weighted sum of the chosen experts' outputs.

use half::f16;

use super::family::Elementwise;
use crate::backend::cuda::kernels::launch::{kernel_params, plan, refusal, KernelCall, Plan, Work};
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
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
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
        plan(Elementwise::MoeRoute, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.used > self.experts || self.experts > MOE_MAX_EXPERTS {
            let msg = format!(
                "{} of {} experts (at most {MOE_MAX_EXPERTS})",
                self.used, self.experts
            );
            return Err(refusal(Elementwise::MoeRoute, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.logits,
        i32 = self.n as i32,
        i32 = self.experts as i32,
        i32 = self.used as i32,
        DevPtrMut<i32> = self.ids,
        DevPtrMut<f32> = self.weights,
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
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
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
        plan(Elementwise::MoeSum, dims, buffers, Work::Elements(len))
    }
    kernel_params! { self =>
        DevPtr<f32> = self.y,
        DevPtr<i32> = DevPtr::or_null(self.pos),
        DevPtr<f32> = self.weights,
        i32 = self.used as i32,
        i32 = self.cols as i32,
        i64 = (self.rows * self.cols) as i64,
        DevPtrMut<f32> = self.out,
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
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        let dims = [("used", self.used), ("cols", self.cols), ("m", self.m)];
        let buffers = [
            ("x", self.x.addr()),
            ("order", self.order.addr()),
            ("hi", self.hi.addr()),
            ("lo", self.lo.addr()),
        ];
        let len = self.m.saturating_mul(self.cols) / 8;
        plan(
            Elementwise::MoeGatherF16,
            dims,
            buffers,
            Work::Elements(len),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let aligned = self.x.addr().is_multiple_of(32)
            && self.hi.addr().is_multiple_of(16)
            && self.lo.addr().is_multiple_of(16);
        if !self.cols.is_multiple_of(8) || !aligned {
            let msg = format!("rows of {} values, x at {:#x}", self.cols, self.x.addr());
            return Err(refusal(Elementwise::MoeGatherF16, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.x,
        DevPtr<i32> = self.order,
        i32 = self.used as i32,
        i32 = self.cols as i32,
        i64 = (self.m * self.cols / 8) as i64,
        DevPtrMut<f16> = self.hi,
        DevPtrMut<f16> = self.lo,
    }
}
