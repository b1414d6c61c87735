//! The kernels and their launch (M0-W-1430, M0-W-1431), a file per kernel
//! family: `kernels/<family>.rs` beside `cuda/<family>.cu` holds that
//! family's kernels (an enum whose `Family` impl gives each kernel's
//! symbol, module part, shared memory and launch geometry), their argument
//! structs with the `KernelCall` that maps each to its C signature, and
//! the bounds the choice among them compares with. Adding a kernel
//! touches its `.cu` file and its family's file (and, for a new family, a
//! `mod` line below and the `families!` list in `kernel.rs`; for a kernel
//! that a product or an attention picks by shape, its rule in `select.rs`).
//!
//! - `launch.rs`: what a launch is apart from any kernel (what a family
//!   tells about its kernels, the checks every launch makes, the problem
//!   sizes grids are laid over, parameter lists);
//! - `operands.rs`: the operands several families share;
//! - `kernel.rs`: [`Kernel`], every kernel by family, each question about
//!   a kernel handed to its family;
//! - `loader.rs`: the loaded kernels of one context ([`Kernels`]) and the
//!   one generic launcher;
//! - `select.rs`: which kernel a product or an attention takes, within a
//!   family and across families, on the switches [`Kernels`] holds.
//!
//! The imports run one way, in that order: `launch.rs` and `operands.rs`
//! at the bottom, then the family files (which name their kernels by their
//! own enums, never [`Kernel`], and import one another without a circle:
//! `gemm` uses `matvec` and `matmul`, `matvec` uses `matmul` and `rope`,
//! `rope` uses `norm`, `attention_tc` and `attention_split` use
//! `attention`), then `kernel.rs`, `loader.rs` and `select.rs`. Inside
//! `kernels/` a file imports from the file that defines a name, never
//! through this one, which only wires them in (`ci/check-layers --strict`).

mod attention;
mod attention_split;
mod attention_tc;
mod elementwise;
mod embed;
mod gemm;
mod kernel;
mod launch;
mod loader;
mod matmul;
mod matvec;
mod norm;
mod operands;
mod rope;
mod sample;
mod select;

pub use attention::*;
pub use attention_split::*;
// Outside kernels/, only tests name `attention_tc.rs`'s items.
#[cfg(test)]
pub use attention_tc::*;
pub use elementwise::*;
pub use embed::*;
pub use gemm::*;
pub use kernel::*;
#[cfg(test)]
pub use launch::{check_args, KernelCall, Work};
pub use loader::*;
pub use matmul::*;
pub use matvec::*;
pub use norm::*;
pub use operands::*;
pub use rope::*;
pub use sample::*;
