//! The kernels of `cuda/elementwise.cu`: a thread per element (the gated
//! activations, GELU, scale, add, column and row copies), and the small
//! kernels around a matrix product (`products.rs`: x split for `mv8_*` or
//! into f16 parts, a bias, column-range parts summed) and a mixture of
//! experts (`moe.rs`: the router, the gather, the weighted sum).
//!
//! `family.rs`: the family's enum (`Elementwise`) and the kernels of a thread per
//! element; `products.rs` and `moe.rs` import it. This file, above them all,
//! wires them in and holds the family's `Family` impl (which names their
//! argument structs, for the C types each kernel's launcher pushes).

mod family;
mod moe;
mod products;

pub use family::*;
pub use moe::*;
pub use products::*;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{blocks, grid_1d, Family, Work, ELEMENT_THREADS};
use crate::backend::cuda::source::{Module, MOE_ROUTE_ROWS};
use crate::backend::BackendError;
use cudarc::driver::LaunchConfig;

impl Family for Elementwise {
    const MODULE: Module = Module::Elementwise;

    fn all() -> Vec<Elementwise> {
        Elementwise::ALL.to_vec()
    }
    fn symbol(self) -> String {
        self.name().into()
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        match (self, work) {
            // Chunks of a row along x, rows along y.
            (Elementwise::KeepRows, Work::Rows { rows, cols }) => {
                if rows > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{rows} rows exceed one launch"
                    ))));
                }
                Some(Ok(blocks(
                    ((cols as u32).div_ceil(ELEMENT_THREADS), rows as u32),
                    ELEMENT_THREADS,
                )))
            }
            // A warp per row.
            (Elementwise::MoeRoute, Work::Rows { rows, .. }) => Some(Ok(blocks(
                ((rows as u32).div_ceil(MOE_ROUTE_ROWS), 1),
                MOE_ROUTE_ROWS * 32,
            ))),
            (Elementwise::KeepRows | Elementwise::MoeRoute, _) => None,
            (_, Work::Elements(n)) => Some(grid_1d(n as u64, ELEMENT_THREADS)),
            _ => None,
        }
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            Elementwise::Swiglu | Elementwise::SwigluOai | Elementwise::Geglu => {
                pushed::<GluArgs>()
            }
            Elementwise::MoeRoute => pushed::<MoeRouteArgs>(),
            Elementwise::MoeSum => pushed::<MoeSumArgs>(),
            Elementwise::MoeGatherF16 => pushed::<MoeGatherF16Args>(),
            Elementwise::Gelu => pushed::<GeluArgs>(),
            Elementwise::AddAssign => pushed::<AddAssignArgs>(),
            Elementwise::Scale => pushed::<ScaleArgs>(),
            Elementwise::CopyCols => pushed::<CopyColsArgs>(),
            Elementwise::KeepRows => pushed::<KeepRowsArgs>(),
            Elementwise::QuantizeX8 => pushed::<QuantizeX8Args>(),
            Elementwise::GemmSplitsSum => pushed::<GemmSplitsSumArgs>(),
            Elementwise::ToF16 => pushed::<ToF16Args>(),
            Elementwise::AddBias => pushed::<AddBiasArgs>(),
        }
    }
}
