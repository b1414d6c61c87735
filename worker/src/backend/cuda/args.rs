//! One argument struct per kernel: named, typed fields whose doc comments
//! give every argument's shape and dtype, and the [`KernelCall`] that maps
//! them to the kernel's C signature, its checks and its problem size.
//! Launch them with `Kernels::launch` (`Kernels::matmul` for [`MatmulArgs`],
//! which picks among three kernels).
//!
//! Dimensions are `usize` here and `int` in CUDA: `KernelCall::check` has
//! refused anything outside `1..=i32::MAX` before `params` converts them.

use cudarc::driver::sys::CUdeviceptr;
use half::f16;

use crate::backend::cuda::launch::{refusal, Kernel, KernelCall, Plan, Work};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{
    ATS_MAX_CHUNK, ATS_MAX_GROUP, ATS_MAX_SPLITS, ATT_MAX_HEAD_DIM, SAMPLE_MAX_LOGPROBS,
};
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// The plan of a kernel over `work` with these dimensions and buffers.
fn plan<const D: usize, const B: usize>(
    kernel: Kernel,
    dims: [(&'static str, usize); D],
    buffers: [(&'static str, CUdeviceptr); B],
    work: Work,
) -> Plan {
    Plan {
        kernel,
        dims: dims.to_vec(),
        buffers: buffers.to_vec(),
        work,
    }
}

/// Both norms: rows of `x` normalized into `out`, scaled by `w`.
fn norm_plan(
    kernel: Kernel,
    x: DevPtr<f32>,
    w: DevPtr<f32>,
    rows: usize,
    cols: usize,
    out: DevPtrMut<f32>,
) -> Plan {
    let buffers = [("x", x.addr()), ("w", w.addr()), ("out", out.addr())];
    plan(
        kernel,
        [("rows", rows), ("cols", cols)],
        buffers,
        Work::Rows { rows, cols },
    )
}

/// Where rows go in (or come from) a KV cache of `capacity` positions: row
/// `t` at `start_pos + t`, unless `pos_ptr` is given, a device i32 that
/// replaces `start_pos` when a decode graph replays.
#[derive(Clone, Copy, Debug)]
pub struct CacheWindow {
    pub start_pos: usize,
    pub pos_ptr: Option<DevPtr<i32>>,
    pub capacity: usize,
}

impl CacheWindow {
    /// `n` rows fit (checked only when the position is known on the host).
    fn check(&self, k: Kernel, n: usize) -> Result<(), BackendError> {
        if self.pos_ptr.is_none() && self.start_pos + n > self.capacity {
            let end = self.start_pos + n;
            return Err(refusal(
                k,
                format!("positions {}..{end} of {}", self.start_pos, self.capacity),
            ));
        }
        Ok(())
    }

    fn params(&self) -> (i32, DevPtr<i32>, i32) {
        (
            self.start_pos as i32,
            DevPtr::or_null(self.pos_ptr),
            self.capacity as i32,
        )
    }
}

/// A matrix in its stored GGUF format on the device: `rows` rows of
/// `row_bytes` bytes, each `cols` values of `ty` (an embedding table, a
/// weight matrix).
#[derive(Clone, Copy, Debug)]
pub struct Stored {
    pub ty: GgmlType,
    pub ptr: DevPtr<u8>,
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Stored {
    /// The checked dimensions of a kernel over `n` rows of input and this matrix.
    fn dims(&self, n: usize) -> [(&'static str, usize); 4] {
        [
            ("rows", self.rows),
            ("cols", self.cols),
            ("n", n),
            ("row_bytes", self.row_bytes),
        ]
    }

    /// `(const u8* table, i64 row_bytes, int rows, int cols)`, as every kernel over one takes them.
    fn params(&self) -> (DevPtr<u8>, i64, i32, i32) {
        (
            self.ptr,
            self.row_bytes as i64,
            self.rows as i32,
            self.cols as i32,
        )
    }
}

/// `embed_<ty>`: `out[t] = decode(table[tokens[t]])`.
#[derive(Clone, Copy, Debug)]
pub struct EmbedArgs {
    pub table: Stored,
    /// `[n]` u32, each `< table.rows` (checked by the caller; the kernel writes zeros otherwise).
    pub tokens: DevPtr<u32>,
    pub n: usize,
    /// `[n, table.cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for EmbedArgs {
    type Params = (DevPtr<u8>, i64, i32, i32, DevPtr<u32>, i32, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        let t = &self.table;
        let buffers = [
            ("table", t.ptr.addr()),
            ("tokens", self.tokens.addr()),
            ("out", self.out.addr()),
        ];
        plan(
            Kernel::Embed(t.ty),
            t.dims(self.n),
            buffers,
            Work::Rows {
                rows: self.n,
                cols: t.cols,
            },
        )
    }
    fn params(&self) -> Self::Params {
        let (table, row_bytes, rows, cols) = self.table.params();
        (
            table,
            row_bytes,
            rows,
            cols,
            self.tokens,
            self.n as i32,
            self.out,
        )
    }
}

/// `out[t][r] = sum_c x[t][c] * W[r][c] (+ bias[r])` through `mv_<ty>`,
/// `mvw_<ty>` or `gemm_<ty>` (`Kernels::matmul` chooses).
#[derive(Clone, Copy, Debug)]
pub struct MatmulArgs {
    pub w: Stored,
    /// `[n, w.cols]` f32.
    pub x: DevPtr<f32>,
    pub n: usize,
    /// `[w.rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[n, w.rows]` f32, not overlapping `x`.
    pub out: DevPtrMut<f32>,
}

impl MatmulArgs {
    /// The same product for rows `t0..t0 + n` of x only.
    pub fn rows_of_x(&self, t0: usize, n: usize) -> MatmulArgs {
        MatmulArgs {
            x: self.x.offset(t0 * self.w.cols),
            n,
            out: self.out.offset(t0 * self.w.rows),
            ..*self
        }
    }

    /// As run by `kernel`, one of the three matmul kernels of `w.ty`.
    pub(crate) fn with_kernel(self, kernel: Kernel) -> MatmulCall {
        MatmulCall { kernel, args: self }
    }

    /// The launch checks (M0-W-1431), made once before the kernel is chosen
    /// and any group is launched; named after `gemm_*`.
    pub fn check(&self) -> Result<(), BackendError> {
        self.with_kernel(Kernel::Gemm(self.w.ty))
            .check()
            .map(|_| ())
    }
}

/// A matmul with its kernel chosen (only `Kernels::matmul` chooses):
/// `mv_*`, `mvw_*`, `gemm_*` and `gemm_tc_*` share one signature.
#[derive(Clone, Copy, Debug)]
pub struct MatmulCall {
    kernel: Kernel,
    args: MatmulArgs,
}

impl KernelCall for MatmulCall {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        DevPtr<f32>,
        i32,
        DevPtr<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let a = &self.args;
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("x", a.x.addr()),
            ("out", a.out.addr()),
        ];
        plan(
            self.kernel,
            a.w.dims(a.n),
            buffers,
            Work::Matrix {
                rows: a.w.rows,
                n: a.n,
            },
        )
    }
    fn params(&self) -> Self::Params {
        let a = &self.args;
        let (w, row_bytes, rows, cols) = a.w.params();
        (
            w,
            row_bytes,
            rows,
            cols,
            a.x,
            a.n as i32,
            DevPtr::or_null(a.bias),
            a.out,
        )
    }
}

/// A matmul of one row of x through `mv1_*`, whose signature has no row count.
#[derive(Clone, Copy, Debug)]
pub struct MatVec1Call {
    args: MatmulArgs,
}

impl MatmulArgs {
    /// As run by `mv1_*`; `n` must be 1.
    pub(crate) fn one_row(self) -> MatVec1Call {
        MatVec1Call { args: self }
    }
}

impl KernelCall for MatVec1Call {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let a = &self.args;
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("x", a.x.addr()),
            ("out", a.out.addr()),
        ];
        plan(
            Kernel::MatVec1(a.w.ty),
            a.w.dims(a.n),
            buffers,
            Work::Matrix {
                rows: a.w.rows,
                n: a.n,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.args.n != 1 {
            return Err(refusal(
                Kernel::MatVec1(self.args.w.ty),
                format!("{} rows of x, not 1", self.args.n),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let a = &self.args;
        let (w, row_bytes, rows, cols) = a.w.params();
        (
            w,
            row_bytes,
            rows,
            cols,
            a.x,
            DevPtr::or_null(a.bias),
            a.out,
        )
    }
}

/// `rms_norm`: `out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w`.
#[derive(Clone, Copy, Debug)]
pub struct RmsNormArgs {
    /// `[rows, cols]` f32, not overlapping `out`.
    pub x: DevPtr<f32>,
    /// `[cols]` f32.
    pub w: DevPtr<f32>,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for RmsNormArgs {
    type Params = (DevPtr<f32>, DevPtr<f32>, i32, f32, i32, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        norm_plan(
            Kernel::RmsNorm,
            self.x,
            self.w,
            self.rows,
            self.cols,
            self.out,
        )
    }
    fn params(&self) -> Self::Params {
        (
            self.x,
            self.w,
            self.cols as i32,
            self.eps,
            self.rows as i32,
            self.out,
        )
    }
}

/// `layer_norm`: `out[t] = (x[t] - mean) / sqrt(var + eps) * w + b`, the
/// mean and variance over row `t`.
#[derive(Clone, Copy, Debug)]
pub struct LayerNormArgs {
    /// `[rows, cols]` f32, not overlapping `out`.
    pub x: DevPtr<f32>,
    /// `[cols]` f32.
    pub w: DevPtr<f32>,
    /// `[cols]` f32, or none.
    pub b: Option<DevPtr<f32>>,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for LayerNormArgs {
    type Params = (
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        i32,
        f32,
        i32,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        norm_plan(
            Kernel::LayerNorm,
            self.x,
            self.w,
            self.rows,
            self.cols,
            self.out,
        )
    }
    fn params(&self) -> Self::Params {
        (
            self.x,
            self.w,
            DevPtr::or_null(self.b),
            self.cols as i32,
            self.eps,
            self.rows as i32,
            self.out,
        )
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
    pub rows: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// Even, at most `head_dim`.
    pub n_rot: usize,
    pub start_pos: usize,
    pub pos_ptr: Option<DevPtr<i32>>,
    /// `[n_rot / 2]` f64 `freq_base^(-2i / n_rot)`, or none (computed per thread).
    pub inv_freq: Option<DevPtr<f64>>,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub pairs: RopePairs,
}

impl KernelCall for RopeArgs {
    type Params = (
        DevPtrMut<f32>,
        i32,
        i32,
        i32,
        i32,
        i32,
        DevPtr<i32>,
        DevPtr<f64>,
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
                .saturating_mul(self.n_head)
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
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let style = match self.pairs {
            RopePairs::Adjacent => 0,
            RopePairs::Halves => 1,
        };
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
            rows,
            heads,
            hd,
            n_rot,
            start,
            pos,
            table,
            self.freq_base,
            self.freq_scale,
            style,
        )
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
    /// `[n, n_head * head_dim]` f32.
    pub out: DevPtrMut<f32>,
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
        plan(Kernel::Attention, dims, buffers, Work::Heads { n, n_head })
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.head_dim > ATT_MAX_HEAD_DIM || !self.n_head.is_multiple_of(self.n_head_kv) {
            let msg = format!(
                "{}/{} heads of {}",
                self.n_head, self.n_head_kv, self.head_dim
            );
            return Err(refusal(Kernel::Attention, msg));
        }
        self.window.check(Kernel::Attention, self.n)
    }
    fn params(&self) -> Self::Params {
        let (start, pos, cap) = self.window.params();
        let (n, heads, kv_heads) = (self.n as i32, self.n_head as i32, self.n_head_kv as i32);
        let hd = self.head_dim as i32;
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
            self.out,
        )
    }
}

/// `attention_split`: one query row (decode) over a long context split into
/// `nsplit` chunks of `chunk` positions; block (KV head, chunk) writes the
/// softmax state of its chunk for every query head of the group to `part`.
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
    /// At most `ATS_MAX_CHUNK`, with `chunk * nsplit >= capacity`.
    pub chunk: usize,
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
        let dims = [
            dims[0],
            dims[1],
            dims[2],
            dims[3],
            ("chunk", self.chunk),
            ("nsplit", self.nsplit),
        ];
        let (q, kc, vc, part) = (
            self.q.addr(),
            self.k_cache.addr(),
            self.v_cache.addr(),
            self.part.addr(),
        );
        let buffers = [("q", q), ("k_cache", kc), ("v_cache", vc), ("part", part)];
        plan(
            Kernel::AttentionSplit,
            dims,
            buffers,
            Work::Chunks {
                n_head_kv: kv,
                nsplit: self.nsplit,
            },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Kernel::AttentionSplit;
        let group = self.n_head / self.n_head_kv.max(1);
        if !self.n_head.is_multiple_of(self.n_head_kv) || group > ATS_MAX_GROUP {
            return Err(refusal(
                k,
                format!("{}/{} heads", self.n_head, self.n_head_kv),
            ));
        }
        if !self.head_dim.is_multiple_of(8) || self.head_dim > ATT_MAX_HEAD_DIM {
            return Err(refusal(k, format!("heads of {}", self.head_dim)));
        }
        if self.chunk > ATS_MAX_CHUNK
            || self.nsplit > ATS_MAX_SPLITS
            || self.chunk * self.nsplit < self.window.capacity
        {
            let msg = format!(
                "{} chunks of {} for {} positions",
                self.nsplit, self.chunk, self.window.capacity
            );
            return Err(refusal(k, msg));
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
        let (chunk, nsplit) = (self.chunk as i32, self.nsplit as i32);
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
            chunk,
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
    /// `[n_head * head_dim]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for AttentionCombineArgs {
    type Params = (DevPtr<f32>, i32, i32, i32, DevPtrMut<f32>);

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
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (
            self.part,
            self.n_head as i32,
            self.head_dim as i32,
            self.nsplit as i32,
            self.out,
        )
    }
}

/// `swiglu`: `out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]`.
#[derive(Clone, Copy, Debug)]
pub struct SwigluArgs {
    /// `[len]` f32 each.
    pub gate: DevPtr<f32>,
    pub up: DevPtr<f32>,
    pub len: usize,
    pub out: DevPtrMut<f32>,
}

// The element-wise kernels take an i64 length: no `int` dimension to check;
// the grid refuses zero elements.
impl KernelCall for SwigluArgs {
    type Params = (DevPtr<f32>, DevPtr<f32>, i64, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        let buffers = [
            ("gate", self.gate.addr()),
            ("up", self.up.addr()),
            ("out", self.out.addr()),
        ];
        plan(Kernel::Swiglu, [], buffers, Work::Elements(self.len))
    }
    fn params(&self) -> Self::Params {
        (self.gate, self.up, self.len as i64, self.out)
    }
}

/// `gelu`: `out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, `x = x[i]`.
#[derive(Clone, Copy, Debug)]
pub struct GeluArgs {
    /// `[len]` f32 (may be the same buffer as `out`).
    pub x: DevPtr<f32>,
    pub len: usize,
    /// `[len]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for GeluArgs {
    type Params = (DevPtr<f32>, i64, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        plan(
            Kernel::Gelu,
            [],
            [("x", self.x.addr()), ("out", self.out.addr())],
            Work::Elements(self.len),
        )
    }
    fn params(&self) -> Self::Params {
        (self.x, self.len as i64, self.out)
    }
}

/// `add_assign`: `x[i] += y[i]`.
#[derive(Clone, Copy, Debug)]
pub struct AddAssignArgs {
    /// `[len]` f32 each.
    pub x: DevPtrMut<f32>,
    pub y: DevPtr<f32>,
    pub len: usize,
}

impl KernelCall for AddAssignArgs {
    type Params = (DevPtrMut<f32>, DevPtr<f32>, i64);

    fn plan(&self) -> Plan {
        plan(
            Kernel::AddAssign,
            [],
            [("x", self.x.addr()), ("y", self.y.addr())],
            Work::Elements(self.len),
        )
    }
    fn params(&self) -> Self::Params {
        (self.x, self.y, self.len as i64)
    }
}

/// The scalar arguments of `sample_select`.
#[derive(Clone, Copy, Debug)]
pub struct SelectArgs {
    pub temperature: f32,
    pub penalty: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub uniform: f64,
    /// Fixed-point scale of the weights, a power of two with `n * scale <= 2^63`.
    pub scale: f64,
    pub greedy: bool,
}

/// `sample_select`: picks one token from `n` logits by the sampling
/// pipeline (one block; see sample.cu for the algorithm).
#[derive(Clone, Copy, Debug)]
pub struct SampleSelectArgs {
    /// `[n]` f32.
    pub logits: DevPtr<f32>,
    pub n: u32,
    /// `[n]` u32 scratch.
    pub keys: DevPtrMut<u32>,
    /// `[n_pen]` u32, distinct ids `< n` to penalize; needed when `n_pen > 0`.
    pub pen_ids: Option<DevPtr<u32>>,
    pub n_pen: u32,
    /// `top_k`: 0 or `0 < top_k < n`; `uniform`: in `[0, 1)`, unused when `greedy`.
    pub p: SelectArgs,
    /// `[SAMPLE_OUT_WORDS]` u32; word 0 receives the id.
    pub out: DevPtrMut<u32>,
}

type SelectParams = (
    DevPtr<f32>,
    u32,
    DevPtrMut<u32>,
    DevPtr<u32>,
    u32,
    f32,
    f32,
    u32,
    f32,
    f32,
    f64,
    f64,
    i32,
    DevPtrMut<u32>,
);

impl KernelCall for SampleSelectArgs {
    type Params = SelectParams;

    fn plan(&self) -> Plan {
        let buffers = [
            ("logits", self.logits.addr()),
            ("keys", self.keys.addr()),
            ("out", self.out.addr()),
        ];
        plan(
            Kernel::SampleSelect,
            [("n", self.n as usize)],
            buffers,
            Work::Single,
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.n_pen > 0 && DevPtr::or_null(self.pen_ids).addr() == 0 {
            return Err(refusal(
                Kernel::SampleSelect,
                "buffer pen_ids is null".into(),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let (p, pen) = (&self.p, DevPtr::or_null(self.pen_ids));
        (
            self.logits,
            self.n,
            self.keys,
            pen,
            self.n_pen,
            p.temperature,
            p.penalty,
            p.top_k,
            p.top_p,
            p.min_p,
            p.uniform,
            p.scale,
            i32::from(p.greedy),
            self.out,
        )
    }
}

/// `sample_logprobs`: the `k` most likely of `n` logits, unordered, with
/// the max and log-sum-exp for their log-softmax (one block).
#[derive(Clone, Copy, Debug)]
pub struct SampleLogprobsArgs {
    /// `[n]` f32.
    pub logits: DevPtr<f32>,
    pub n: u32,
    /// `[n]` u32 scratch.
    pub keys: DevPtrMut<u32>,
    /// `0 < k <= SAMPLE_MAX_LOGPROBS`.
    pub k: u32,
    /// `[SAMPLE_OUT_WORDS]` u32, 8-byte aligned; words 1.. receive the result.
    pub out: DevPtrMut<u32>,
}

impl KernelCall for SampleLogprobsArgs {
    type Params = (DevPtr<f32>, u32, DevPtrMut<u32>, u32, DevPtrMut<u32>);

    fn plan(&self) -> Plan {
        let buffers = [
            ("logits", self.logits.addr()),
            ("keys", self.keys.addr()),
            ("out", self.out.addr()),
        ];
        plan(
            Kernel::SampleLogprobs,
            [("n", self.n as usize), ("k", self.k as usize)],
            buffers,
            Work::Single,
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.k as usize > SAMPLE_MAX_LOGPROBS {
            return Err(refusal(
                Kernel::SampleLogprobs,
                format!("k = {} exceeds {SAMPLE_MAX_LOGPROBS}", self.k),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (self.logits, self.n, self.keys, self.k, self.out)
    }
}
