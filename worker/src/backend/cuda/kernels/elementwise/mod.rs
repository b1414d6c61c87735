//! The kernels of `cuda/elementwise.cu`: a thread per element (the gated
//! activations, GELU, scale, add, column and row copies), and the small
//! kernels around a matrix product (`products.rs`: x split for `mv8_*` or
//! into f16 parts, a bias, column-range parts summed) and a mixture of
//! experts (`moe.rs`: the router, the gather, the weighted sum).
//!
//! `family.rs`: the family's enum with its `Family` impl, and the kernels of a
//! thread per element. The other files import it and it imports none
//! of them (but in tests, for the C types each kernel's launcher pushes);
//! this file only wires them in.

mod family;
mod moe;
mod products;

pub use family::*;
pub use moe::*;
pub use products::*;
