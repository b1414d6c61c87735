//! The argument structs of the attention path: RoPE, the KV store, attention
//! over the cache, and the split-context decode attention with its merge.

use cudarc::driver::sys::CUdeviceptr;
use half::f16;

use super::{plan, CacheWindow, SplitsOutput, X8Bufs};
use crate::backend::cuda::launch::{refusal, Kernel, KernelCall, Plan, Then, Work};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    ATC_HEAD_DIMS, ATS_MAX_GROUP, ATS_MAX_SPLITS, ATT_MAX_HEAD_DIM,
};
use crate::backend::BackendError;

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
    type Params = (
        DevPtrMut<f32>,
        DevPtrMut<f32>,
        i32,
        i32,
        i32,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        DevPtr<f64>,
        f32,
        f32,
        f32,
        i32,
    );

    fn plan(&self) -> Plan {
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
        plan(Kernel::Rope, dims, [("x", self.x.addr())], work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.n_rot.is_multiple_of(2) || self.n_rot > self.head_dim {
            let msg = format!(
                "{} rotated dims of a {}-dim head",
                self.n_rot, self.head_dim
            );
            return Err(refusal(Kernel::Rope, msg));
        }
        if self.x2.is_some() != (self.n_head2 > 0) || self.n_head2 > i32::MAX as usize {
            let msg = format!("a second matrix of {} heads", self.n_head2);
            return Err(refusal(Kernel::Rope, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let style = self.style();
        let (rows, heads, hd, n_rot) = (
            self.rows as i32,
            self.n_head as i32,
            self.head_dim as i32,
            self.n_rot as i32,
        );
        let (pos, table) = (
            DevPtr::or_null(self.pos_ptr),
            DevPtr::or_null(self.inv_freq),
        );
        let start = self.start_pos as i32;
        (
            self.x,
            DevPtrMut::or_null(self.x2),
            rows,
            heads,
            self.n_head2 as i32,
            hd,
            n_rot,
            start,
            pos,
            table,
            self.freq_base,
            self.freq_scale,
            self.mscale,
            style,
        )
    }
}

/// Q's and K's head-norm weights (`[head_dim]` f32 each) and epsilon.
pub type HeadNormArgs = (DevPtr<f32>, DevPtr<f32>, f32);

/// The parameters `qk_rope_store` and `qk_rope_store_rows` begin with, in
/// order: q, k, v, the head counts and size, the head norms (null weights
/// and 0 without), the rotation (`n_rot` 0 without).
pub type QkPrepParams = (
    DevPtrMut<f32>,
    DevPtrMut<f32>,
    DevPtr<f32>,
    i32,
    i32,
    i32,
    DevPtr<f32>,
    DevPtr<f32>,
    f32,
    i32,
    DevPtr<f64>,
    f32,
    f32,
    f32,
    i32,
);

/// [`QkPrepParams`] of a launch's q, k, v, heads, norms and rotation.
#[allow(clippy::too_many_arguments)]
pub(super) fn qk_prep_params(
    q: DevPtrMut<f32>,
    k: DevPtrMut<f32>,
    v: DevPtr<f32>,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    norms: &Option<HeadNormArgs>,
    rope: &Option<RopeArgs>,
) -> QkPrepParams {
    let (qw, kw, eps) = (
        DevPtr::or_null(norms.map(|n| n.0)),
        DevPtr::or_null(norms.map(|n| n.1)),
        norms.map_or(0.0, |n| n.2),
    );
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
    (
        q,
        k,
        v,
        n_head as i32,
        n_head_kv as i32,
        head_dim as i32,
        qw,
        kw,
        eps,
        n_rot,
        table,
        base,
        scale,
        mscale,
        style,
    )
}

/// `qk_rope_store`: before attention, in one launch, each head of Q and K
/// normed (where `norms` are given) and rotated (where `rope` is), in place,
/// then K's and V's rows stored in the cache as [`KvStoreArgs`] stores them.
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
    type Params = Then<QkPrepParams, (i32, DevPtr<i32>, i32, DevPtrMut<f16>, DevPtrMut<f16>)>;

    fn plan(&self) -> Plan {
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
        plan(Kernel::QkRopeStore, dims, buffers, work)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Kernel::QkRopeStore;
        if let Some(r) = &self.rope {
            let (q, n) = (self.q.addr(), self.n);
            if !r.turns_only(q, n, self.n_head, self.head_dim, &self.window) {
                return Err(refusal(k, "a rotation of other rows or positions".into()));
            }
            r.validate()?;
        }
        self.window.check(k, self.n)
    }
    fn params(&self) -> Self::Params {
        let (start, pos, cap) = self.window.params();
        let prep = qk_prep_params(
            self.q,
            self.k,
            self.v,
            self.n_head,
            self.n_head_kv,
            self.head_dim,
            &self.norms,
            &self.rope,
        );
        Then(prep, (start, pos, cap, self.k_cache, self.v_cache))
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
    type Params = (
        DevPtr<f32>,
        DevPtr<f32>,
        i32,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        i32,
        DevPtrMut<f16>,
        DevPtrMut<f16>,
    );

    fn plan(&self) -> Plan {
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
            Kernel::KvStore,
            dims,
            buffers,
            Work::Elements(n.saturating_mul(n_head_kv).saturating_mul(head_dim)),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        self.window.check(Kernel::KvStore, self.n)
    }
    fn params(&self) -> Self::Params {
        let (start, pos, cap) = self.window.params();
        let (n, n_head_kv, head_dim) = (self.n as i32, self.n_head_kv as i32, self.head_dim as i32);
        (
            self.k,
            self.v,
            n,
            n_head_kv,
            head_dim,
            start,
            pos,
            cap,
            self.k_cache,
            self.v_cache,
        )
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
    /// `attention_tc` (heads of [`ATC_HEAD_DIMS`] dims), else `attention`.
    pub tensor_cores: bool,
    /// Where `out` is also split for `mv8_*` (`attention`, one row, heads
    /// of a multiple of 32 dims), or none.
    pub x8: Option<X8Bufs>,
}

impl AttentionArgs {
    fn kernel(&self) -> Kernel {
        if self.tensor_cores {
            Kernel::AttentionTc
        } else {
            Kernel::Attention
        }
    }
}

impl KernelCall for AttentionArgs {
    type Params = (
        DevPtr<f32>,
        i32,
        i32,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        i32,
        DevPtr<f16>,
        DevPtr<f16>,
        f32,
        i32,
        DevPtr<f32>,
        DevPtrMut<f32>,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
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
    fn params(&self) -> Self::Params {
        let (start, pos, cap) = self.window.params();
        let (n, heads, kv_heads) = (self.n as i32, self.n_head as i32, self.n_head_kv as i32);
        let hd = self.head_dim as i32;
        let (hi, lo, d, sums) = X8Bufs::writes_or_null(self.x8);
        (
            self.q,
            n,
            heads,
            kv_heads,
            hd,
            start,
            pos,
            cap,
            self.k_cache,
            self.v_cache,
            self.scale,
            self.sliding as i32,
            DevPtr::or_null(self.sinks),
            self.out,
            hi,
            lo,
            d,
            sums,
        )
    }
}

impl SplitsOutput for AttentionArgs {
    fn x8(&self) -> Option<X8Bufs> {
        self.x8
    }
}

/// Attention's output is split for `mv8_*` only for one row (decode), by
/// kernels whose warps each take 32 dims of one head.
fn validate_head_split(
    k: Kernel,
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

/// The `attention_split_*` instance for heads of `head_dim` and `group`
/// query heads per KV head: the tensor-core kernel for heads of 64 or 128
/// dims; else dim pairs per lane, 1, 2 or 4, and most heads, 4 or 8 (larger
/// heads and groups are refused by `validate`).
pub(super) fn split_kernel(head_dim: usize, group: usize) -> Kernel {
    let pairs = crate::backend::cuda::source::head_pairs(head_dim);
    if crate::backend::cuda::source::split_on_tensor_cores(head_dim) {
        return Kernel::AttentionSplitTc(pairs);
    }
    Kernel::AttentionSplit(pairs, if group <= 4 { 4 } else { 8 })
}

/// Refuses heads the split kernels do not take: a group of more than
/// `ATS_MAX_GROUP` query heads per KV head, heads not of whole 8-value
/// chunks or wider than `ATT_MAX_HEAD_DIM`.
pub(super) fn check_split_heads(
    k: Kernel,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
) -> Result<(), BackendError> {
    let group = n_head / n_head_kv.max(1);
    if n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) || group > ATS_MAX_GROUP {
        return Err(refusal(k, format!("{n_head}/{n_head_kv} heads")));
    }
    if !head_dim.is_multiple_of(8) || head_dim > ATT_MAX_HEAD_DIM {
        return Err(refusal(k, format!("heads of {head_dim}")));
    }
    Ok(())
}

/// `attention_split`: one query row (decode) over a long context split into
/// `nsplit` chunks of equal length (fixed at run time from the position);
/// block (KV head, chunk) writes the softmax state of its chunk for every
/// query head of the group to `part`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSplitArgs {
    /// `[n_head * head_dim]` f32, at position `start_pos`.
    pub q: DevPtr<f32>,
    /// A multiple of `n_head_kv`, at most `ATS_MAX_GROUP` times it.
    pub n_head: usize,
    pub n_head_kv: usize,
    /// A multiple of 8, at most `ATT_MAX_HEAD_DIM`.
    pub head_dim: usize,
    pub window: CacheWindow,
    /// `[n_head_kv, capacity, head_dim]` f16 each, filled up to `start_pos + 1`.
    pub k_cache: DevPtr<f16>,
    pub v_cache: DevPtr<f16>,
    pub scale: f32,
    /// As [`AttentionArgs::sliding`]; the chunks cover only the visible positions.
    pub sliding: usize,
    /// At least 1, at most `ATS_MAX_SPLITS`.
    pub nsplit: usize,
    /// `[n_head, nsplit, head_dim + 2]` f32: max, sum of weights, then the unnormalised output.
    pub part: DevPtrMut<f32>,
}

impl KernelCall for AttentionSplitArgs {
    type Params = (
        DevPtr<f32>,
        i32,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        i32,
        DevPtr<f16>,
        DevPtr<f16>,
        f32,
        i32,
        i32,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let (kv, hd, capacity) = (self.n_head_kv, self.head_dim, self.window.capacity);
        let dims = [
            ("n_head", self.n_head),
            ("n_head_kv", kv),
            ("head_dim", hd),
            ("capacity", capacity),
        ];
        let dims = [dims[0], dims[1], dims[2], dims[3], ("nsplit", self.nsplit)];
        let (q, kc, vc, part) = (
            self.q.addr(),
            self.k_cache.addr(),
            self.v_cache.addr(),
            self.part.addr(),
        );
        let buffers = [("q", q), ("k_cache", kc), ("v_cache", vc), ("part", part)];
        plan(
            split_kernel(hd, self.n_head / kv.max(1)),
            dims,
            buffers,
            Work::Chunks {
                n_head_kv: kv,
                nsplit: self.nsplit,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let group = self.n_head / self.n_head_kv.max(1);
        let k = split_kernel(self.head_dim, group);
        check_split_heads(k, self.n_head, self.n_head_kv, self.head_dim)?;
        if self.sliding > self.window.capacity {
            return Err(refusal(k, format!("a window of {}", self.sliding)));
        }
        if self.nsplit == 0 || self.nsplit > ATS_MAX_SPLITS {
            return Err(refusal(k, format!("{} chunks", self.nsplit)));
        }
        self.window.check(k, 1)
    }
    fn params(&self) -> Self::Params {
        let (start, pos, cap) = self.window.params();
        let (heads, kv_heads, hd) = (
            self.n_head as i32,
            self.n_head_kv as i32,
            self.head_dim as i32,
        );
        let nsplit = self.nsplit as i32;
        (
            self.q,
            heads,
            kv_heads,
            hd,
            start,
            pos,
            cap,
            self.k_cache,
            self.v_cache,
            self.scale,
            self.sliding as i32,
            nsplit,
            self.part,
        )
    }
}

/// `attention_combine`: `out[h]` = the merge of head `h`'s `nsplit` chunk
/// states in `part`, in chunk order.
#[derive(Clone, Copy, Debug)]
pub struct AttentionCombineArgs {
    /// `[n_head, nsplit, head_dim + 2]` f32, as `attention_split` wrote it.
    pub part: DevPtr<f32>,
    pub n_head: usize,
    pub head_dim: usize,
    /// At most `ATS_MAX_SPLITS`.
    pub nsplit: usize,
    /// As [`AttentionArgs::sinks`].
    pub sinks: Option<DevPtr<f32>>,
    /// `[n_head * head_dim]` f32.
    pub out: DevPtrMut<f32>,
    /// As [`AttentionArgs::x8`].
    pub x8: Option<X8Bufs>,
}

impl KernelCall for AttentionCombineArgs {
    type Params = (
        DevPtr<f32>,
        i32,
        i32,
        i32,
        DevPtr<f32>,
        DevPtrMut<f32>,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let dims = [
            ("n_head", self.n_head),
            ("head_dim", self.head_dim),
            ("nsplit", self.nsplit),
        ];
        let buffers = [("part", self.part.addr()), ("out", self.out.addr())];
        plan(
            Kernel::AttentionCombine,
            dims,
            buffers,
            Work::Rows {
                rows: self.n_head,
                cols: self.head_dim,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.nsplit > ATS_MAX_SPLITS {
            return Err(refusal(
                Kernel::AttentionCombine,
                format!("{} chunks", self.nsplit),
            ));
        }
        validate_head_split(Kernel::AttentionCombine, self.x8, 1, self.head_dim, false)
    }
    fn params(&self) -> Self::Params {
        let (hi, lo, d, sums) = X8Bufs::writes_or_null(self.x8);
        (
            self.part,
            self.n_head as i32,
            self.head_dim as i32,
            self.nsplit as i32,
            DevPtr::or_null(self.sinks),
            self.out,
            hi,
            lo,
            d,
            sums,
        )
    }
}
