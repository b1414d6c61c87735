//! Weight formats: the ggml block layouts and their CPU decoding.
//!
//! GGUF tensors store their values in ggml's formats: plain `F32`, `F16`,
//! `BF16`, the 32-value blocks `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0` and
//! `MXFP4`, and the 256-value super-blocks `Q4_K`, `Q5_K` and `Q6_K`. The block
//! layouts and the value each stored code stands for follow ggml exactly
//! (`ggml/src/ggml-common.h` for the structs, `ggml-quants.c` for the
//! arithmetic); [`blocks`] documents every layout next to its struct.
//!
//! What this module offers:
//! - [`dequantize`]: decode a run of stored values into `f32`.
//! - [`vec_dot`]: dot product of one stored row with `f32` activations,
//!   decoding in registers. It is the inner loop of the CPU backend's
//!   matrix-vector product and uses AVX2/FMA/F16C when the CPU has them,
//!   with [`vec_dot_portable`] as the fallback and the reference the
//!   vectorised kernels are tested against.
//! - [`quantize`]: a reference round-to-nearest quantizer for every type
//!   (what the synthetic-model generator and the tests use; not tuned).
//!
//! Tensor data comes from a memory map at arbitrary byte offsets, so blocks
//! are always read from `&[u8]` with little-endian byte reads, never by
//! casting the bytes to block structs.

pub mod blocks;
mod dequant;
mod dot;
mod error;
mod quantize;
mod types;

pub use blocks::{
    BlockMxfp4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
};
pub use dequant::dequantize;
pub use dot::{vec_dot, vec_dot_portable};
pub use error::QuantError;
pub use quantize::quantize;
pub use types::GgmlType;

#[cfg(test)]
mod tests;
