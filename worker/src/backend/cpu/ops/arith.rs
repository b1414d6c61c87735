//! The arithmetic the operations share: the f32 dot product, GELU, and the
//! error a shape mismatch reports.

use crate::backend::BackendError;
use crate::quant::{self, GgmlType};

pub(super) fn shape_error(what: &str) -> BackendError {
    BackendError::InferenceFailed(format!("shape mismatch in {what}"))
}

/// f32 dot product through the F32 kernel of `quant::vec_dot`, which uses
/// AVX2/FMA when the CPU has them (this crate is built for baseline x86-64,
/// so a plain loop would get SSE2 only). An f32 slice is that kernel's
/// stored form on a little-endian host.
#[cfg(target_endian = "little")]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: any f32 slice is a valid byte slice of four times its length.
    let bytes =
        unsafe { std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), std::mem::size_of_val(a)) };
    quant::vec_dot(GgmlType::F32, bytes, b)
}

/// SiLU, `x * sigmoid(x)`, written as the kernels write it: the gate of
/// SwiGLU, dense (`Ops::swiglu`) and in experts (`Ops::moe`).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GPT-2's tanh-approximated GELU in f32 (M0-W-1433), written as the
/// kernel writes it: `tanh` of a large or infinite argument is exactly +-1
/// (Rust's `tanh` is not a ratio of exponentials that would give inf/inf), so
/// large positive x give x and large negative x give -0.
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x);
    0.5 * x * (1.0 + u.tanh())
}
