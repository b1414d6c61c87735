//! The graph operations in plain Rust, f32 arithmetic, spread over the cores
//! with rayon. This is the numerical reference the CUDA kernels are checked
//! against, so each operation is written the obvious way; speed comes only
//! from parallel rows and dot products the compiler can vectorize.
//!
//! The [`Ops`] implementation is in `cpu_ops`; what it works on is in
//! `storage`, the arithmetic the files share in `arith`, and the two
//! operations that are more than a loop in `attention` and `moe`.
//!
//! [`Ops`]: crate::model::ops::Ops

mod arith;
mod attention;
mod cpu_ops;
mod moe;
mod storage;
#[cfg(test)]
mod tests;

pub use arith::dot_f32;
pub use cpu_ops::CpuOps;
pub use storage::{CpuBuf, CpuCache, CpuWeight};
