//! Of `elementwise.cu`'s family (`elementwise/mod.rs` says what each file holds):
//! the family's enum (`Elementwise`) and the kernels of a thread per
//! element.

use crate::backend::cuda::kernels::launch::{
    kernel_params, plan, refusal, unit_kernels, KernelCall, Plan, Work,
};
use crate::backend::cuda::kernels::operands::{
    validate_x8_output, RowSeq, SplitsOutput, X8Bufs, X8Writes,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::BackendError;

unit_kernels! {
    /// The kernels of `elementwise.cu`.
    pub enum Elementwise {
        Swiglu = "swiglu",
        /// `swiglu_oai`: gpt-oss's clamped SwiGLU.
        SwigluOai = "swiglu_oai",
        /// `moe_route`: the router's choice of experts and their weights.
        MoeRoute = "moe_route",
        /// `moe_sum`: the chosen experts' outputs, weighed and added.
        MoeSum = "moe_sum",
        /// `moe_gather_f16`: rows of x gathered by expert, split into f16 parts.
        MoeGatherF16 = "moe_gather_f16",
        /// `geglu`: `swiglu` with the tanh-approximated GELU (Gemma's feed-forward).
        Geglu = "geglu",
        /// `gelu`: GPT-2's tanh-approximated GELU (M0-W-1433).
        Gelu = "gelu",
        AddAssign = "add_assign",
        /// `scale`: `x *= factor` (Gemma's embeddings).
        Scale = "scale",
        /// `copy_cols`: a column range of each row (fused projections' parts).
        CopyCols = "copy_cols",
        /// `keep_rows`: each row of a batched step's logits to its sequence's
        /// sampler.
        KeepRows = "keep_rows",
        /// `quantize_x8`: rows of x as `mv8_*` reads them.
        QuantizeX8 = "quantize_x8",
        /// `gemm_splits_sum`: the column-range parts of `gemm_tck_*` or
        /// `gemm_few_*` added up.
        GemmSplitsSum = "gemm_splits_sum",
        /// `to_f16`: x as two f16 parts, for cuBLAS and `gemm_tck_*`.
        ToF16 = "to_f16",
        /// `add_bias`: a bias added to each row of a cuBLAS product.
        AddBias = "add_bias",
    }
}

/// The activation of a gated feed-forward ([`GluArgs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `swiglu`: `out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]`.
    Silu,
    /// `geglu`: `out[i] = gelu(gate[i]) * up[i]`.
    Gelu,
    /// `swiglu_oai`: gpt-oss's clamped SwiGLU, `out[i] = min(g, 7) *
    /// sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`.
    SiluOai,
}

/// A gated activation of `gate` times `up` (one kernel per [`Glu`]).
#[derive(Clone, Copy, Debug)]
pub struct GluArgs {
    pub act: Glu,
    /// `[len]` f32 each.
    pub gate: DevPtr<f32>,
    pub up: DevPtr<f32>,
    pub len: usize,
    pub out: DevPtrMut<f32>,
    /// Where `out` is also split for `mv8_*` (`len` a multiple of 32: the
    /// split is by 32-value groups, so any whole rows of them), or none.
    pub x8: Option<X8Bufs>,
}

impl KernelCall for GluArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        let buffers = [
            ("gate", self.gate.addr()),
            ("up", self.up.addr()),
            ("out", self.out.addr()),
        ];
        plan(self.kernel(), [], buffers, Work::Elements(self.len))
    }
    fn validate(&self) -> Result<(), BackendError> {
        validate_x8_output(self.kernel(), self.x8, 1, self.len)
    }
    kernel_params! { self =>
        DevPtr<f32> = self.gate,
        DevPtr<f32> = self.up,
        i64 = self.len as i64,
        DevPtrMut<f32> = self.out,
        ..X8Writes = X8Bufs::writes_or_null(self.x8),
    }
}

impl GluArgs {
    fn kernel(&self) -> Elementwise {
        match self.act {
            Glu::Silu => Elementwise::Swiglu,
            Glu::Gelu => Elementwise::Geglu,
            Glu::SiluOai => Elementwise::SwigluOai,
        }
    }
}

impl SplitsOutput for GluArgs {
    fn x8(&self) -> Option<X8Bufs> {
        self.x8
    }
}

/// `gelu`: `out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, `x = x[i]`.
#[derive(Clone, Copy, Debug)]
pub struct GeluArgs {
    /// `[len]` f32 (may be the same buffer as `out`).
    pub x: DevPtr<f32>,
    pub len: usize,
    /// `[len]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for GeluArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::Gelu,
            [],
            [("x", self.x.addr()), ("out", self.out.addr())],
            Work::Elements(self.len),
        )
    }
    kernel_params! { self =>
        DevPtr<f32> = self.x,
        i64 = self.len as i64,
        DevPtrMut<f32> = self.out,
    }
}

/// `scale`: `x[i] *= factor`.
#[derive(Clone, Copy, Debug)]
pub struct ScaleArgs {
    /// `[len]` f32.
    pub x: DevPtrMut<f32>,
    pub len: usize,
    pub factor: f32,
}

impl KernelCall for ScaleArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::Scale,
            [],
            [("x", self.x.addr())],
            Work::Elements(self.len),
        )
    }
    kernel_params! { self =>
        DevPtrMut<f32> = self.x,
        i64 = self.len as i64,
        f32 = self.factor,
    }
}

/// `copy_cols`: `out[t][c] = x[t][start + c]` for `c < cols`.
#[derive(Clone, Copy, Debug)]
pub struct CopyColsArgs {
    /// `[rows, x_cols]` f32.
    pub x: DevPtr<f32>,
    pub rows: usize,
    pub x_cols: usize,
    /// `start + cols <= x_cols`.
    pub start: usize,
    pub cols: usize,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for CopyColsArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::CopyCols,
            [("x_cols", self.x_cols), ("cols", self.cols)],
            [("x", self.x.addr()), ("out", self.out.addr())],
            Work::Elements(self.rows.saturating_mul(self.cols)),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.start + self.cols > self.x_cols {
            return Err(refusal(
                Elementwise::CopyCols,
                format!(
                    "columns {}..{} of {}",
                    self.start,
                    self.start + self.cols,
                    self.x_cols
                ),
            ));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtr<f32> = self.x,
        i32 = self.x_cols as i32,
        i32 = self.start as i32,
        i32 = self.cols as i32,
        DevPtrMut<f32> = self.out,
        i64 = (self.rows * self.cols) as i64,
    }
}

/// `add_assign`: `x[i] += y[i]`.
#[derive(Clone, Copy, Debug)]
pub struct AddAssignArgs {
    /// `[len]` f32 each.
    pub x: DevPtrMut<f32>,
    pub y: DevPtr<f32>,
    pub len: usize,
}

impl KernelCall for AddAssignArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::AddAssign,
            [],
            [("x", self.x.addr()), ("y", self.y.addr())],
            Work::Elements(self.len),
        )
    }
    kernel_params! { self =>
        DevPtrMut<f32> = self.x,
        DevPtr<f32> = self.y,
        i64 = self.len as i64,
    }
}

/// `keep_rows`: row `r` of a batched step's logits to `seqs[r].logits`.
#[derive(Clone, Copy, Debug)]
pub struct KeepRowsArgs {
    /// `[rows, cols]` f32.
    pub x: DevPtr<f32>,
    pub rows: usize,
    pub cols: usize,
    /// `[rows]` [`RowSeq`], each `logits` a buffer of `cols` f32.
    pub seqs: DevPtr<RowSeq>,
}

impl KernelCall for KeepRowsArgs {
    type Kernel = Elementwise;
    fn plan(&self) -> Plan<Self::Kernel> {
        plan(
            Elementwise::KeepRows,
            [("rows", self.rows), ("cols", self.cols)],
            [("x", self.x.addr()), ("seqs", self.seqs.addr())],
            Work::Rows {
                rows: self.rows,
                cols: self.cols,
            },
        )
    }
    kernel_params! { self =>
        DevPtr<f32> = self.x,
        i32 = self.cols as i32,
        DevPtr<RowSeq> = self.seqs,
    }
}
