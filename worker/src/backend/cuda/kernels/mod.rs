//! The kernels and their launch (M0-W-1430, M0-W-1431), a file per kernel
//! family: `kernels/<family>.rs` beside `cuda/<family>.cu` holds that
//! family's kernels (an enum whose [`Family`] impl gives each kernel's
//! symbol, module part, shared memory and launch geometry), their argument
//! structs with the [`KernelCall`] that maps each to its C signature, and
//! the choice among its variants. Adding a kernel touches its `.cu` file
//! and its family's file (and, for a new family, the list below).
//!
//! - `launch.rs`: what a launch is apart from any kernel (the checks every
//!   launch makes, the problem sizes grids are laid over, parameter lists);
//! - `operands.rs`: the operands several families share;
//! - `loader.rs`: the loaded kernels of one context ([`Kernels`]) and the
//!   one generic launcher.

mod attention;
mod attention_split;
mod attention_tc;
mod elementwise;
mod embed;
mod gemm;
mod launch;
mod loader;
mod matmul;
mod matvec;
mod norm;
mod operands;
mod rope;
mod sample;

use cudarc::driver::LaunchConfig;

use crate::backend::cuda::source::Module;
use crate::backend::BackendError;
use crate::quant::GgmlType;

pub use attention::*;
pub use attention_split::*;
pub use attention_tc::*;
pub use elementwise::*;
pub use embed::*;
pub use gemm::*;
#[cfg(test)]
pub use launch::{check_args, launch_config};
pub use launch::{Family, KernelCall, Work};
pub use loader::*;
pub use matmul::*;
pub use matvec::*;
pub use norm::*;
pub use operands::*;
pub use rope::*;
pub use sample::*;

/// Declares [`Kernel`], a variant per family, and hands each question
/// about a kernel to its family's [`Family`] impl.
macro_rules! families {
    ($($family:ident),+ $(,)?) => {
        /// Every kernel the backend launches, by family (`cuda/<family>.cu`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $($family($family)),+
        }

        $(impl From<$family> for Kernel {
            fn from(k: $family) -> Kernel {
                Kernel::$family(k)
            }
        })+

        impl Kernel {
            /// Every kernel, for loading them all at start.
            pub fn all() -> Vec<Kernel> {
                let mut v = Vec::new();
                $(v.extend($family::all().into_iter().map(Kernel::$family));)+
                v
            }
            /// The module the kernel is compiled in.
            pub fn module(self) -> Module {
                match self {
                    $(Kernel::$family(_) => $family::MODULE),+
                }
            }
            /// See [`Family::symbol`].
            pub fn symbol(self) -> String {
                match self {
                    $(Kernel::$family(k) => k.symbol()),+
                }
            }
            /// See [`Family::format`].
            pub fn format(self) -> Option<GgmlType> {
                match self {
                    $(Kernel::$family(k) => k.format()),+
                }
            }
            /// See [`Family::part`].
            pub fn part(self) -> Option<u8> {
                match self {
                    $(Kernel::$family(k) => k.part()),+
                }
            }
            /// See [`Family::dynamic_smem`].
            pub fn dynamic_smem(self) -> Option<u32> {
                match self {
                    $(Kernel::$family(k) => k.dynamic_smem()),+
                }
            }
            /// See [`Family::prefers_shared_memory`].
            pub fn prefers_shared_memory(self) -> bool {
                match self {
                    $(Kernel::$family(k) => k.prefers_shared_memory()),+
                }
            }
            /// See [`Family::head_pairs`].
            pub fn head_pairs(self) -> Option<u8> {
                match self {
                    $(Kernel::$family(k) => k.head_pairs()),+
                }
            }
            /// See [`Family::config`].
            pub fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
                match self {
                    $(Kernel::$family(k) => k.config(work)),+
                }
            }
            /// See [`Family::pushed`].
            #[cfg(test)]
            pub fn pushed(self) -> Vec<String> {
                match self {
                    $(Kernel::$family(k) => k.pushed()),+
                }
            }
            /// See [`Family::definition`].
            #[cfg(test)]
            pub fn definition(self) -> (&'static str, Vec<String>) {
                match self {
                    $(Kernel::$family(k) => k.definition()),+
                }
            }
        }
    };
}

families! {
    Embed,
    Matmul,
    Matvec,
    Gemm,
    Norm,
    Rope,
    Attention,
    AttentionSplit,
    AttentionTc,
    Elementwise,
    Sample,
}
