//! The kernel of `cuda/attention_tc.cu`: prefill attention on tensor
//! cores (flash attention; heads of 64 or 128 dims), launched through
//! `attention.rs`'s `AttentionArgs`, and the fewest rows that take it
//! (the choice: `select.rs`).

use cudarc::driver::LaunchConfig;

#[cfg(test)]
use crate::backend::cuda::kernels::attention::AttentionArgs;
#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{blocks, unit_kernels, Family, Work};
use crate::backend::cuda::source::{Module, ATC_BQ, ATC_SMEM_BYTES, ATC_THREADS};
use crate::backend::BackendError;

unit_kernels! {
    /// The kernel of `attention_tc.cu`.
    pub enum AttentionTc {
        /// `attention_tc`: `attention` for many query rows at once, on tensor
        /// cores (flash attention; heads of 64 or 128 dims).
        AttentionTc = "attention_tc",
    }
}

impl Family for AttentionTc {
    const MODULE: Module = Module::AttentionTc;

    fn all() -> Vec<AttentionTc> {
        AttentionTc::ALL.to_vec()
    }
    fn symbol(self) -> String {
        self.name().into()
    }
    fn dynamic_smem(self) -> Option<u32> {
        Some(ATC_SMEM_BYTES)
    }
    fn prefers_shared_memory(self) -> bool {
        true
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        let Work::Heads { n, n_head } = work else {
            return None;
        };
        let tiles = (n as u32).div_ceil(ATC_BQ);
        if n_head > 65535 {
            return Some(Err(BackendError::Shape(
                "attention shape exceeds one launch".into(),
            )));
        }
        Some(Ok(LaunchConfig {
            shared_mem_bytes: ATC_SMEM_BYTES,
            ..blocks((tiles, n_head as u32), ATC_THREADS)
        }))
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        pushed::<AttentionArgs>()
    }
}

/// The fewest query rows (prefill) that go to `attention_tc`: from two rows
/// on, one block reading each key once for 64 rows beats a block per row.
pub const ATC_MIN_ROWS: usize = 2;
