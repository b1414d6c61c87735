//! The kernels of `cuda/attention.cu`: the KV store and causal GQA of
//! each query row over the cache, one block per (row, head). Its argument
//! struct `AttentionArgs` also launches `attention_tc.cu`'s prefill kernel:
//! its `KernelCall`, which names both families, is in `attention_tc.rs`.

use cudarc::driver::LaunchConfig;
use half::f16;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    blocks, grid_1d, kernel_params, plan, refusal, unit_kernels, Family, KernelCall, Named, Plan,
    Work, ELEMENT_THREADS,
};
use crate::backend::cuda::kernels::operands::{CacheWindow, SplitsOutput, WindowParams, X8Bufs};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{Module, ATT_THREADS};
use crate::backend::BackendError;

unit_kernels! {
    /// The kernels of `attention.cu`.
    pub enum Attention {
        KvStore = "kv_store",
        Attention = "attention",
    }
}

impl Family for Attention {
    const MODULE: Module = Module::Attention;

    fn all() -> Vec<Attention> {
        Attention::ALL.to_vec()
    }
    fn symbol(self) -> String {
        self.name().into()
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        match (self, work) {
            (Attention::KvStore, Work::Elements(n)) => Some(grid_1d(n as u64, ELEMENT_THREADS)),
            (Attention::Attention, Work::Heads { n, n_head }) => {
                if n > 65535 * 1024 || n_head > 65535 {
                    return Some(Err(BackendError::Shape(
                        "attention shape exceeds one launch".into(),
                    )));
                }
                Some(Ok(blocks((n as u32, n_head as u32), ATT_THREADS)))
            }
            _ => None,
        }
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            Attention::KvStore => pushed::<KvStoreArgs>(),
            Attention::Attention => pushed::<AttentionArgs>(),
        }
    }
}

/// `kv_store`: writes K and V rows into one layer's cache planes as f16.
#[derive(Clone, Copy, Debug)]
pub struct KvStoreArgs {
    /// `[n, n_head_kv * head_dim]` f32 each.
    pub k: DevPtr<f32>,
    pub v: DevPtr<f32>,
    pub n: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Rows go to positions `start_pos..start_pos + n`.
    pub window: CacheWindow,
    /// `[n_head_kv, capacity, head_dim]` f16 each.
    pub k_cache: DevPtrMut<f16>,
    pub v_cache: DevPtrMut<f16>,
}

impl KernelCall for KvStoreArgs {
    type Kernel = Attention;
    fn plan(&self) -> Plan<Self::Kernel> {
        let (n, n_head_kv, head_dim) = (self.n, self.n_head_kv, self.head_dim);
        let dims = [
            ("n", n),
            ("n_head_kv", n_head_kv),
            ("head_dim", head_dim),
            ("capacity", self.window.capacity),
        ];
        let (k, v, kc, vc) = (
            self.k.addr(),
            self.v.addr(),
            self.k_cache.addr(),
            self.v_cache.addr(),
        );
        let buffers = [("k", k), ("v", v), ("k_cache", kc), ("v_cache", vc)];
        plan(
            Attention::KvStore,
            dims,
            buffers,
            Work::Elements(n.saturating_mul(n_head_kv).saturating_mul(head_dim)),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        self.window.check(Attention::KvStore, self.n)
    }
    kernel_params! { self =>
        DevPtr<f32> = self.k,
        DevPtr<f32> = self.v,
        i32 = self.n as i32,
        i32 = self.n_head_kv as i32,
        i32 = self.head_dim as i32,
        ..WindowParams = self.window.params(),
        DevPtrMut<f16> = self.k_cache,
        DevPtrMut<f16> = self.v_cache,
    }
}

/// `attention`: causal GQA of each query row over the cache.
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    /// `[n, n_head * head_dim]` f32, row `t` at position `start_pos + t`.
    pub q: DevPtr<f32>,
    pub n: usize,
    /// A multiple of `n_head_kv`.
    pub n_head: usize,
    pub n_head_kv: usize,
    /// At most `ATT_MAX_HEAD_DIM`.
    pub head_dim: usize,
    pub window: CacheWindow,
    /// `[n_head_kv, capacity, head_dim]` f16 each, filled up to `start_pos + n`.
    pub k_cache: DevPtr<f16>,
    pub v_cache: DevPtr<f16>,
    pub scale: f32,
    /// A sliding window: row `t` sees only the `sliding` positions up to
    /// `start_pos + t`; 0 for all of them. At most the capacity.
    pub sliding: usize,
    /// `[n_head]` f32: each head's sink logit (gpt-oss), counted in its
    /// softmax's denominator; or none.
    pub sinks: Option<DevPtr<f32>>,
    /// `[n, n_head * head_dim]` f32.
    pub out: DevPtrMut<f32>,
    /// `attention_tc` (heads of `ATC_HEAD_DIMS` dims), else `attention`.
    pub tensor_cores: bool,
    /// Where `out` is also split for `mv8_*` (`attention`, one row, heads
    /// of a multiple of 32 dims), or none.
    pub x8: Option<X8Bufs>,
}

impl SplitsOutput for AttentionArgs {
    fn x8(&self) -> Option<X8Bufs> {
        self.x8
    }
}

/// Attention's output is split for `mv8_*` only for one row (decode), by
/// kernels whose warps each take 32 dims of one head.
pub(crate) fn validate_head_split(
    k: impl Named,
    x8: Option<X8Bufs>,
    n: usize,
    head_dim: usize,
    tensor_cores: bool,
) -> Result<(), BackendError> {
    if x8.is_some() && (n != 1 || !head_dim.is_multiple_of(32) || tensor_cores) {
        let msg = format!("splitting {n} rows of heads of {head_dim}");
        return Err(refusal(k, msg));
    }
    Ok(())
}
