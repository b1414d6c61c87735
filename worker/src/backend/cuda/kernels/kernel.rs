//! [`Kernel`]: every kernel the backend launches, a variant per family
//! (`kernels/<family>.rs`), each question about a kernel handed to its
//! family's [`Family`] impl. It sits above the family files: they name
//! their kernels by their own types, and the loader turns those into
//! [`Kernel`]s (`From`).

use cudarc::driver::LaunchConfig;

use super::attention::Attention;
use super::attention_split::AttentionSplit;
use super::attention_tc::AttentionTc;
use super::elementwise::Elementwise;
use super::embed::Embed;
use super::gemm::Gemm;
use super::launch::{Either, Family, Named, Work};
use super::matmul::Matmul;
use super::matvec::Matvec;
use super::norm::Norm;
use super::rope::Rope;
use super::sample::Sample;
use crate::backend::cuda::source::Module;
use crate::backend::BackendError;
use crate::quant::GgmlType;

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
                    $(Kernel::$family(k) => Family::symbol(k)),+
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

impl<A: Into<Kernel>, B: Into<Kernel>> From<Either<A, B>> for Kernel {
    fn from(k: Either<A, B>) -> Kernel {
        match k {
            Either::A(k) => k.into(),
            Either::B(k) => k.into(),
        }
    }
}

impl Named for Kernel {
    fn symbol(self) -> String {
        Kernel::symbol(self)
    }
}

/// The grid and block of kernel `k` over `work` (its family's
/// [`Family::config`]).
pub fn launch_config(k: Kernel, work: Work) -> Result<LaunchConfig, BackendError> {
    k.config(work).unwrap_or_else(|| {
        Err(BackendError::KernelLaunchFailed(format!(
            "{} is not laid out over {work:?}",
            k.symbol()
        )))
    })
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
