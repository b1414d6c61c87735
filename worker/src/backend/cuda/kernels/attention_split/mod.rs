//! The kernels of `cuda/attention_split.cu`: decode attention over a long
//! context split into chunks across blocks (scalar instances per head-size
//! class and group, tensor-core ones for heads of 64 and 128 dims), the
//! merge of the chunks (`attention_combine`), their batched decode step's
//! forms (`rows.rs`), and the bounds of how a context is split (the
//! split itself: `select.rs`).
//!
//! `family.rs`: the family's enum with its `Family` impl, the split kernels and
//! their merge. The other files import it and it imports none
//! of them (but in tests, for the C types each kernel's launcher pushes);
//! this file only wires them in.

mod family;
mod rows;

pub use family::*;
pub use rows::*;
