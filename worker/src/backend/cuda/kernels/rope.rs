//! The kernels of `cuda/rope.cu`: RoPE in place, and the per-head norms
//! and RoPE of Q and K with the KV store in one launch before attention
//! (`qk_rope_store`; `_rows` for a batched decode step).

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::LaunchConfig;
use half::f16;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    blocks, grid_1d, kernel_params, param_group, plan, refusal, unit_kernels, Family, KernelCall,
    Plan, Work, ELEMENT_THREADS,
};
use crate::backend::cuda::kernels::norm::norm_threads;
use crate::backend::cuda::kernels::operands::{CacheWindow, RowSeq, WindowParams};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::Module;
use crate::backend::BackendError;

unit_kernels! {
    /// The kernels of `rope.cu`.
    pub enum Rope {
        Plain = "rope",
        /// `qk_rope_store`: per-head norms and RoPE of Q and K in place, and
        /// the KV store, in one launch (before attention).
        QkRopeStore = "qk_rope_store",
        /// `qk_rope_store_rows`: the same for a batched decode step, each row
        /// at its own sequence's position and into its own cache.
        QkRopeStoreRows = "qk_rope_store_rows",
    }
}

impl Family for Rope {
    const MODULE: Module = Module::Rope;

    fn all() -> Vec<Rope> {
        Rope::ALL.to_vec()
    }
    fn symbol(self) -> String {
        self.name().into()
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        match (self, work) {
            (Rope::Plain, Work::Elements(n)) => Some(grid_1d(n as u64, ELEMENT_THREADS)),
            (Rope::QkRopeStore | Rope::QkRopeStoreRows, Work::HeadRows { n, heads, head_dim }) => {
                if n > i32::MAX as usize || heads > 65535 {
                    return Some(Err(BackendError::Shape(
                        "attention shape exceeds one launch".into(),
                    )));
                }
                Some(Ok(blocks((n as u32, heads as u32), norm_threads(head_dim))))
            }
            _ => None,
        }
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            Rope::Plain => pushed::<RopeArgs>(),
            Rope::QkRopeStore => pushed::<QkRopeStoreArgs>(),
            Rope::QkRopeStoreRows => pushed::<QkRopeStoreRowsArgs>(),
        }
    }
}

/// Which dims RoPE rotates together (the kernel's `style`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopePairs {
    /// `(2i, 2i + 1)`: llama's normal layout (style 0).
    Adjacent,
    /// `(i, i + n_rot / 2)`: the NEOX layout (style 1).
    Halves,
}

/// `rope`, in place: rotates dims `0..n_rot` of every head of every row;
/// row `t` is at position `start_pos + t` (or `*pos_ptr`, graph replay).
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs {
    /// `[rows, n_head * head_dim]` f32.
    pub x: DevPtrMut<f32>,
    /// `[rows, n_head2 * head_dim]` f32 rotated in the same launch (K with
    /// Q), or none (`n_head2` 0).
    pub x2: Option<DevPtrMut<f32>>,
    pub n_head2: usize,
    pub rows: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// Even, at most `head_dim`.
    pub n_rot: usize,
    pub start_pos: usize,
    pub pos_ptr: Option<DevPtr<i32>>,
    /// `[n_rot / 2]` f64 `freq_base^(-2i / n_rot)` (divided by the model's
    /// frequency factors), or none (computed per thread; no factors).
    pub inv_freq: Option<DevPtr<f64>>,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// The factor on cosines and sines.
    pub mscale: f32,
    pub pairs: RopePairs,
}

impl RopeArgs {
    /// The kernels' `style` argument.
    pub(super) fn style(&self) -> i32 {
        match self.pairs {
            RopePairs::Adjacent => 0,
            RopePairs::Halves => 1,
        }
    }

    /// Whether `other` turns its heads as these do (same rows, positions,
    /// frequencies, scaling and pairing), so one launch can take both.
    pub fn rotates_like(&self, other: &RopeArgs) -> bool {
        self.rows == other.rows
            && self.head_dim == other.head_dim
            && self.n_rot == other.n_rot
            && self.start_pos == other.start_pos
            && self.pos_ptr.map(|p| p.addr()) == other.pos_ptr.map(|p| p.addr())
            && self.inv_freq.map(|p| p.addr()) == other.inv_freq.map(|p| p.addr())
            && self.freq_base.to_bits() == other.freq_base.to_bits()
            && self.freq_scale.to_bits() == other.freq_scale.to_bits()
            && self.mscale.to_bits() == other.mscale.to_bits()
            && self.pairs == other.pairs
            && self.x2.is_none()
            && other.x2.is_none()
    }

    /// Whether these turn exactly `x` (`rows` rows of `n_head` heads of
    /// `head_dim`) at the positions of `window`, and nothing beside: what a
    /// kernel that rotates and stores in one launch takes.
    pub fn turns_only(
        &self,
        x: CUdeviceptr,
        rows: usize,
        n_head: usize,
        head_dim: usize,
        window: &CacheWindow,
    ) -> bool {
        self.x.addr() == x
            && self.rows == rows
            && self.n_head == n_head
            && self.head_dim == head_dim
            && self.x2.is_none()
            && self.start_pos == window.start_pos
            && self.pos_ptr.map(|p| p.addr()) == window.pos_ptr.map(|p| p.addr())
    }
}

impl KernelCall for RopeArgs {
    type Kernel = Rope;
    fn plan(&self) -> Plan<Self::Kernel> {
        let dims = [
            ("rows", self.rows),
            ("n_head", self.n_head),
            ("head_dim", self.head_dim),
            ("n_rot", self.n_rot),
        ];
        // Saturating: the plan is made before the dimensions are checked.
        let work = Work::Elements(
            self.rows
                .saturating_mul(self.n_head.saturating_add(self.n_head2))
                .saturating_mul(self.n_rot / 2),
        );
        plan(Rope::Plain, dims, [("x", self.x.addr())], work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.n_rot.is_multiple_of(2) || self.n_rot > self.head_dim {
            let msg = format!(
                "{} rotated dims of a {}-dim head",
                self.n_rot, self.head_dim
            );
            return Err(refusal(Rope::Plain, msg));
        }
        if self.x2.is_some() != (self.n_head2 > 0) || self.n_head2 > i32::MAX as usize {
            let msg = format!("a second matrix of {} heads", self.n_head2);
            return Err(refusal(Rope::Plain, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        DevPtrMut<f32> = self.x,
        DevPtrMut<f32> = DevPtrMut::or_null(self.x2),
        i32 = self.rows as i32,
        i32 = self.n_head as i32,
        i32 = self.n_head2 as i32,
        i32 = self.head_dim as i32,
        i32 = self.n_rot as i32,
        i32 = self.start_pos as i32,
        DevPtr<i32> = DevPtr::or_null(self.pos_ptr),
        DevPtr<f64> = DevPtr::or_null(self.inv_freq),
        f32 = self.freq_base,
        f32 = self.freq_scale,
        f32 = self.mscale,
        i32 = self.style(),
    }
}

/// Q's and K's head-norm weights (`[head_dim]` f32 each) and epsilon.
pub type HeadNormArgs = (DevPtr<f32>, DevPtr<f32>, f32);

param_group! {
    /// The parameters `qk_rope_store` and `qk_rope_store_rows` begin with, in
    /// order: q, k, v, the head counts and size, the head norms (null weights
    /// and 0 without), the rotation (`n_rot` 0 without).
    pub type QkPrepParams;
    /// [`QkPrepParams`] of a launch's q, k, v, heads, norms and rotation.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qk_prep_params(
        q: DevPtrMut<f32>,
        k: DevPtrMut<f32>,
        v: DevPtr<f32>,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        norms: &Option<HeadNormArgs>,
        rope: &Option<RopeArgs>,
    ) {
        let (n_rot, table, base, scale, mscale, style) = match rope {
            Some(r) => (
                r.n_rot as i32,
                DevPtr::or_null(r.inv_freq),
                r.freq_base,
                r.freq_scale,
                r.mscale,
                r.style(),
            ),
            None => (0, DevPtr::or_null(None), 0.0, 0.0, 0.0, 0),
        };
        DevPtrMut<f32> = q,
        DevPtrMut<f32> = k,
        DevPtr<f32> = v,
        i32 = n_head as i32,
        i32 = n_head_kv as i32,
        i32 = head_dim as i32,
        DevPtr<f32> = DevPtr::or_null(norms.map(|n| n.0)),
        DevPtr<f32> = DevPtr::or_null(norms.map(|n| n.1)),
        f32 = norms.map_or(0.0, |n| n.2),
        i32 = n_rot,
        DevPtr<f64> = table,
        f32 = base,
        f32 = scale,
        f32 = mscale,
        i32 = style,
    }
}

/// `qk_rope_store`: before attention, in one launch, each head of Q and K
/// normed (where `norms` are given) and rotated (where `rope` is), in place,
/// then K's and V's rows stored in the cache as [`KvStoreArgs`](crate::backend::cuda::kernels::attention::KvStoreArgs)
/// stores them.
#[derive(Clone, Copy, Debug)]
pub struct QkRopeStoreArgs {
    /// `[n, n_head * head_dim]` f32.
    pub q: DevPtrMut<f32>,
    /// `[n, n_head_kv * head_dim]` f32 each.
    pub k: DevPtrMut<f32>,
    pub v: DevPtr<f32>,
    pub n: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// `[head_dim]` f32 RMSNorm weights of Q's heads and of K's, and epsilon.
    pub norms: Option<HeadNormArgs>,
    /// Q's rotation ([`RopeArgs::rotates_like`] K's; its positions the
    /// window's), or none.
    pub rope: Option<RopeArgs>,
    /// Rows go to positions `start_pos..start_pos + n`.
    pub window: CacheWindow,
    /// `[n_head_kv, capacity, head_dim]` f16 each.
    pub k_cache: DevPtrMut<f16>,
    pub v_cache: DevPtrMut<f16>,
}

impl KernelCall for QkRopeStoreArgs {
    type Kernel = Rope;
    fn plan(&self) -> Plan<Self::Kernel> {
        let (n, n_head, n_head_kv, head_dim) = (self.n, self.n_head, self.n_head_kv, self.head_dim);
        let dims = [
            ("n", n),
            ("n_head", n_head),
            ("n_head_kv", n_head_kv),
            ("head_dim", head_dim),
            ("capacity", self.window.capacity),
        ];
        let buffers = [
            ("q", self.q.addr()),
            ("k", self.k.addr()),
            ("v", self.v.addr()),
            ("k_cache", self.k_cache.addr()),
            ("v_cache", self.v_cache.addr()),
        ];
        let heads = n_head.saturating_add(n_head_kv);
        let work = Work::HeadRows { n, heads, head_dim };
        plan(Rope::QkRopeStore, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Rope::QkRopeStore;
        if let Some(r) = &self.rope {
            let (q, n) = (self.q.addr(), self.n);
            if !r.turns_only(q, n, self.n_head, self.head_dim, &self.window) {
                return Err(refusal(k, "a rotation of other rows or positions".into()));
            }
            r.validate()?;
        }
        self.window.check(k, self.n)
    }
    kernel_params! { self =>
        ..QkPrepParams = qk_prep_params(
            self.q,
            self.k,
            self.v,
            self.n_head,
            self.n_head_kv,
            self.head_dim,
            &self.norms,
            &self.rope,
        ),
        ..WindowParams = self.window.params(),
        DevPtrMut<f16> = self.k_cache,
        DevPtrMut<f16> = self.v_cache,
    }
}

/// `qk_rope_store_rows`: [`super::QkRopeStoreArgs`] for a batched step,
/// row `r` at `seqs[r]`'s position and into its cache's layer `layer`.
#[derive(Clone, Copy, Debug)]
pub struct QkRopeStoreRowsArgs {
    /// `[rows, n_head * head_dim]` f32.
    pub q: DevPtrMut<f32>,
    /// `[rows, n_head_kv * head_dim]` f32 each.
    pub k: DevPtrMut<f32>,
    pub v: DevPtr<f32>,
    pub rows: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// As [`super::QkRopeStoreArgs::norms`].
    pub norms: Option<HeadNormArgs>,
    /// The rotation's frequencies and pairing (its rows and positions are
    /// the table's), or none.
    pub rope: Option<RopeArgs>,
    /// `[rows]` [`RowSeq`].
    pub seqs: DevPtr<RowSeq>,
    pub layer: usize,
}

impl KernelCall for QkRopeStoreRowsArgs {
    type Kernel = Rope;
    fn plan(&self) -> Plan<Self::Kernel> {
        let (n, n_head, n_head_kv, head_dim) =
            (self.rows, self.n_head, self.n_head_kv, self.head_dim);
        let dims = [
            ("rows", n),
            ("n_head", n_head),
            ("n_head_kv", n_head_kv),
            ("head_dim", head_dim),
        ];
        let buffers = [
            ("q", self.q.addr()),
            ("k", self.k.addr()),
            ("v", self.v.addr()),
            ("seqs", self.seqs.addr()),
        ];
        let heads = n_head.saturating_add(n_head_kv);
        let work = Work::HeadRows { n, heads, head_dim };
        plan(Rope::QkRopeStoreRows, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        if let Some(r) = &self.rope {
            r.validate()?;
        }
        if self.layer > i32::MAX as usize {
            let msg = format!("layer {}", self.layer);
            return Err(refusal(Rope::QkRopeStoreRows, msg));
        }
        Ok(())
    }
    kernel_params! { self =>
        ..QkPrepParams = qk_prep_params(
            self.q,
            self.k,
            self.v,
            self.n_head,
            self.n_head_kv,
            self.head_dim,
            &self.norms,
            &self.rope,
        ),
        DevPtr<RowSeq> = self.seqs,
        i32 = self.layer as i32,
    }
}
