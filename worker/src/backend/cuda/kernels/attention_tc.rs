//! The kernel of `cuda/attention_tc.cu`: prefill attention on tensor
//! cores (flash attention; heads of 64 or 128 dims), the launch of
//! `attention.rs`'s `AttentionArgs` on it or on `attention` (as its
//! `tensor_cores` says: this file sits above `attention.rs` and names both
//! families), and the fewest rows that take it (the choice: `select.rs`).

use cudarc::driver::LaunchConfig;

use half::f16;

use crate::backend::cuda::kernels::attention::{validate_head_split, Attention, AttentionArgs};
#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    blocks, kernel_params, plan, refusal, unit_kernels, Either, Family, KernelCall, Plan, Work,
};
use crate::backend::cuda::kernels::operands::{WindowParams, X8Bufs, X8Writes};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    Module, ATC_BQ, ATC_HEAD_DIMS, ATC_SMEM_BYTES, ATC_THREADS, ATT_MAX_HEAD_DIM,
};
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

impl AttentionArgs {
    fn kernel(&self) -> Either<Attention, AttentionTc> {
        if self.tensor_cores {
            Either::B(AttentionTc::AttentionTc)
        } else {
            Either::A(Attention::Attention)
        }
    }
}

impl KernelCall for AttentionArgs {
    type Kernel = Either<Attention, AttentionTc>;
    fn plan(&self) -> Plan<Self::Kernel> {
        let (n, n_head, capacity) = (self.n, self.n_head, self.window.capacity);
        let (kv, hd) = (self.n_head_kv, self.head_dim);
        let dims = [
            ("n", n),
            ("n_head", n_head),
            ("n_head_kv", kv),
            ("head_dim", hd),
            ("capacity", capacity),
        ];
        let (q, kc, vc, out) = (
            self.q.addr(),
            self.k_cache.addr(),
            self.v_cache.addr(),
            self.out.addr(),
        );
        let buffers = [("q", q), ("k_cache", kc), ("v_cache", vc), ("out", out)];
        plan(self.kernel(), dims, buffers, Work::Heads { n, n_head })
    }
    fn validate(&self) -> Result<(), BackendError> {
        let head_ok = if self.tensor_cores {
            ATC_HEAD_DIMS.contains(&self.head_dim)
        } else {
            self.head_dim <= ATT_MAX_HEAD_DIM
        };
        if self.sliding > self.window.capacity {
            return Err(refusal(
                self.kernel(),
                format!("a window of {}", self.sliding),
            ));
        }
        if !head_ok || !self.n_head.is_multiple_of(self.n_head_kv) {
            let msg = format!(
                "{}/{} heads of {}",
                self.n_head, self.n_head_kv, self.head_dim
            );
            return Err(refusal(self.kernel(), msg));
        }
        validate_head_split(
            self.kernel(),
            self.x8,
            self.n,
            self.head_dim,
            self.tensor_cores,
        )?;
        self.window.check(self.kernel(), self.n)
    }
    kernel_params! { self =>
        DevPtr<f32> = self.q,
        i32 = self.n as i32,
        i32 = self.n_head as i32,
        i32 = self.n_head_kv as i32,
        i32 = self.head_dim as i32,
        ..WindowParams = self.window.params(),
        DevPtr<f16> = self.k_cache,
        DevPtr<f16> = self.v_cache,
        f32 = self.scale,
        i32 = self.sliding as i32,
        DevPtr<f32> = DevPtr::or_null(self.sinks),
        DevPtrMut<f32> = self.out,
        ..X8Writes = X8Bufs::writes_or_null(self.x8),
    }
}
