//! The graph operations (`model::ops::Ops`) on the GPU, so that
//! `llama::forward` runs unchanged on either backend.
//!
//! Weights are device blocks in their stored format; activations are f32
//! row-major device matrices taken from the stream-ordered pool; the KV cache
//! is f16, laid out `[layer][K|V][kv_head][capacity][head_dim]`. Every
//! operation checks shapes, and that each operand's device block holds its
//! stated shape, before it launches (M0-W-1431).
//!
//! [`CudaOps`] and its graph-capture mode are in `cuda_ops`, what it keeps
//! between operations in `state`, its `Ops` implementation in `model_ops`;
//! the values it works on in `buffers`, and how it allocates them in `alloc`.

mod alloc;
mod attend;
mod buffers;
mod cuda_ops;
mod model_ops;
mod moe;
mod norm;
mod products;
mod rows;
mod split;
mod state;

#[cfg(test)]
pub use buffers::WEIGHT_TAIL_BYTES;
pub use buffers::{weight_block_bytes, CudaBuf, CudaCache, CudaWeight};
pub use cuda_ops::CudaOps;
pub(crate) use cuda_ops::GraphCapture;
pub use state::RowsPass;
