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

use crate::backend::cuda::launch::{
    has_mv8, mv8_rows_per_block, norm_cluster_blocks, refusal, Kernel, KernelCall, Plan, Then, Work,
};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{has_mmq, MMQ_MAX_TOKENS, MV8_MAX_TOKENS};
use crate::backend::BackendError;
use crate::quant::GgmlType;

mod attention;
mod blas;
mod moe;
mod rows;
mod sample;

pub use attention::*;
pub use blas::*;
pub use moe::*;
pub use rows::*;
pub use sample::*;

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

/// A matmul through `gemm_tck_*` or `gemm_few_*` (quantized formats): x
/// read as its two f16 parts, the columns split into `splits` ranges of
/// whole 32-column steps (`gemm_few_*`: 64-column chunks), range z's
/// products (no bias) written to `part + z * n * rows`;
/// [`GemmSplitsSumArgs`] adds them up.
#[derive(Clone, Copy, Debug)]
pub struct GemmTcSplitCall {
    pub args: MatmulArgs,
    /// `gemm_few_*` (up to `GF_MAX_TOKENS` rows of x), not `gemm_tck_*`.
    pub few: bool,
    /// `[2, n, w.cols]` f16, 16-byte aligned: `args.x` split by `to_f16`
    /// (x rounded, then the rounding of the rest).
    pub xh: DevPtr<f16>,
    pub splits: usize,
    /// `[splits, n, w.rows]` f32.
    pub part: DevPtrMut<f32>,
}

impl KernelCall for GemmTcSplitCall {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        DevPtr<f16>,
        i32,
        i32,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let a = &self.args;
        let buffers = [
            ("w", a.w.ptr.addr()),
            ("xh", self.xh.addr()),
            ("part", self.part.addr()),
        ];
        let (rows, n, splits) = (a.w.rows, a.n, self.splits);
        plan(
            self.kernel(),
            a.w.dims(n),
            buffers,
            Work::SplitMatrix { rows, n, splits },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        let cols = self.args.w.cols;
        let step = if self.few { 64 } else { 32 };
        let steps = cols / step;
        // Every range holds a step (the kernel's ranges are ceil(steps /
        // splits) long), and the f16 rows are whole 16-byte loads.
        let per = steps.div_ceil(self.splits.max(1));
        if self.splits == 0
            || !cols.is_multiple_of(step)
            || (self.splits - 1) * per >= steps
            || !self.xh.addr().is_multiple_of(16)
        {
            let msg = format!(
                "{} column ranges of {cols} columns, x's parts at {:#x}",
                self.splits,
                self.xh.addr()
            );
            return Err(refusal(self.kernel(), msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let a = &self.args;
        let (w, row_bytes, rows, cols) = a.w.params();
        let (n, splits) = (a.n as i32, self.splits as i32);
        (w, row_bytes, rows, cols, self.xh, n, splits, self.part)
    }
}

impl GemmTcSplitCall {
    fn kernel(&self) -> Kernel {
        let t = self.args.w.ty;
        if self.few {
            Kernel::GemmFew(t)
        } else {
            Kernel::GemmTcSplit(t)
        }
    }
}

/// `gemm_splits_sum`: `out[i] = sum_z part[z * len + i] (+ bias[i % rows])`.
#[derive(Clone, Copy, Debug)]
pub struct GemmSplitsSumArgs {
    /// `[splits, len]` f32.
    pub part: DevPtr<f32>,
    pub splits: usize,
    /// `n * rows`.
    pub len: usize,
    pub rows: usize,
    /// `[rows]` f32, or none.
    pub bias: Option<DevPtr<f32>>,
    /// `[len]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for GemmSplitsSumArgs {
    type Params = (DevPtr<f32>, i32, i64, i32, DevPtr<f32>, DevPtrMut<f32>);

    fn plan(&self) -> Plan {
        let dims = [
            ("splits", self.splits),
            ("len", self.len),
            ("rows", self.rows),
        ];
        let buffers = [("part", self.part.addr()), ("out", self.out.addr())];
        plan(
            Kernel::GemmSplitsSum,
            dims,
            buffers,
            Work::Elements(self.len),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.rows == 0 || !self.len.is_multiple_of(self.rows) {
            let msg = format!("{} values in rows of {}", self.len, self.rows);
            return Err(refusal(Kernel::GemmSplitsSum, msg));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (
            self.part,
            self.splits as i32,
            self.len as i64,
            self.rows as i32,
            DevPtr::or_null(self.bias),
            self.out,
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

/// Rows of x split for `mv8_*` by `quantize_x8`, in one scratch block: for
/// `len` values (rows of `cols` one after another), `[len]` i8 high parts,
/// `[len]` i8 low parts, `[len / 32]` f32 scales, `[len / 16]` f32 sums of
/// 16 values.
#[derive(Clone, Copy, Debug)]
pub struct X8Bufs {
    pub hi: DevPtrMut<i8>,
    pub lo: DevPtrMut<i8>,
    pub d: DevPtrMut<f32>,
    pub sums: DevPtrMut<f32>,
}

impl X8Bufs {
    /// Bytes of the block for `len` values.
    pub fn bytes(len: usize) -> usize {
        2 * len + len / 32 * 4 + len / 16 * 4
    }

    /// The parts of the block at `base` for `len` values (a multiple of
    /// 32, so that each part stays 16-byte aligned for the kernels' vector
    /// loads).
    pub fn at(base: CUdeviceptr, len: usize) -> X8Bufs {
        let d = base + 2 * len as u64;
        X8Bufs {
            hi: DevPtrMut::new(base),
            lo: DevPtrMut::new(base + len as u64),
            d: DevPtrMut::new(d),
            sums: DevPtrMut::new(d + (len / 32 * 4) as u64),
        }
    }

    /// The parts as a kernel that also splits its output writes them: all
    /// null when there is no block (the kernel then skips the split).
    fn writes_or_null(
        x8: Option<X8Bufs>,
    ) -> (DevPtrMut<i8>, DevPtrMut<i8>, DevPtrMut<f32>, DevPtrMut<f32>) {
        (
            DevPtrMut::or_null(x8.map(|b| b.hi)),
            DevPtrMut::or_null(x8.map(|b| b.lo)),
            DevPtrMut::or_null(x8.map(|b| b.d)),
            DevPtrMut::or_null(x8.map(|b| b.sums)),
        )
    }

    /// The parts as the `mv8*` kernels read them.
    fn reads(&self) -> (DevPtr<i8>, DevPtr<i8>, DevPtr<f32>, DevPtr<f32>) {
        (
            self.hi.as_const(),
            self.lo.as_const(),
            self.d.as_const(),
            self.sums.as_const(),
        )
    }

    fn addrs(&self) -> [(&'static str, CUdeviceptr); 4] {
        [
            ("x8 hi", self.hi.addr()),
            ("x8 lo", self.lo.addr()),
            ("x8 d", self.d.addr()),
            ("x8 sums", self.sums.addr()),
        ]
    }
}

/// `quantize_x8`: `cols` values of x (whole rows) into [`X8Bufs`].
#[derive(Clone, Copy, Debug)]
pub struct QuantizeX8Args {
    /// `[cols]` f32.
    pub x: DevPtr<f32>,
    /// A multiple of 32 (rows of a multiple of 32 values, one after another).
    pub cols: usize,
    pub out: X8Bufs,
}

impl KernelCall for QuantizeX8Args {
    type Params = (
        DevPtr<f32>,
        i32,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let [hi, lo, d, sums] = self.out.addrs();
        plan(
            Kernel::QuantizeX8,
            [("cols", self.cols)],
            [("x", self.x.addr()), hi, lo, d, sums],
            Work::Elements(self.cols),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if !self.cols.is_multiple_of(32) {
            return Err(refusal(
                Kernel::QuantizeX8,
                format!("{} columns, not a multiple of 32", self.cols),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let o = &self.out;
        (self.x, self.cols as i32, o.hi, o.lo, o.d, o.sums)
    }
}

/// A matmul of one row of x through `mv8_*`, reading x as `quantize_x8`
/// wrote it into `x8` (`args.x` itself is not read).
#[derive(Clone, Copy, Debug)]
pub struct MatVec8Call {
    pub args: MatmulArgs,
    pub x8: X8Bufs,
}

impl MatVec8Call {
    fn kernel(&self) -> Kernel {
        Kernel::MatVec8(self.args.w.ty)
    }
}

impl KernelCall for MatVec8Call {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        DevPtr<i8>,
        DevPtr<i8>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        mv8_plan(self.kernel(), &self.args, &self.x8)
    }
    fn validate(&self) -> Result<(), BackendError> {
        mv8_validate(self.kernel(), &self.args, 1)
    }
    fn params(&self) -> Self::Params {
        let a = &self.args;
        let (w, row_bytes, rows, cols) = a.w.params();
        let (hi, lo, d, sums) = self.x8.reads();
        let bias = DevPtr::or_null(a.bias);
        (w, row_bytes, rows, cols, hi, lo, d, sums, bias, a.out)
    }
}

/// Two or three matmuls of one row of x through one `mv8m_*` launch:
/// matrices of one format and width, x as `quantize_x8` wrote it into `x8`.
/// Unused slots (`count` of 2) are pushed as null with 0 rows.
#[derive(Clone, Copy, Debug)]
pub struct MatVec8ManyCall {
    pub args: [MatmulArgs; 3],
    pub count: usize,
    pub x8: X8Bufs,
}

impl MatVec8ManyCall {
    fn used(&self) -> &[MatmulArgs] {
        &self.args[..self.count]
    }
}

impl KernelCall for MatVec8ManyCall {
    type Params = (
        DevPtr<u8>,
        DevPtr<u8>,
        DevPtr<u8>,
        i64,
        i32,
        i32,
        i32,
        i32,
        DevPtr<i8>,
        DevPtr<i8>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let first = &self.args[0];
        let kernel = Kernel::MatVec8Many(first.w.ty);
        let per_block = mv8_rows_per_block(first.w.cols);
        let padded: usize = self
            .used()
            .iter()
            .map(|a| a.w.rows.div_ceil(per_block) * per_block)
            .sum();
        let mut dims = vec![("rows", padded)];
        let mut buffers = Vec::new();
        for a in self.used() {
            dims.extend(a.w.dims(a.n));
            buffers.extend([("w", a.w.ptr.addr()), ("out", a.out.addr())]);
        }
        buffers.extend(self.x8.addrs());
        Plan {
            kernel,
            dims,
            buffers,
            work: Work::MatVec {
                rows: padded,
                cols: first.w.cols,
            },
        }
    }
    fn validate(&self) -> Result<(), BackendError> {
        let first = &self.args[0];
        let kernel = Kernel::MatVec8Many(first.w.ty);
        if !(2..=3).contains(&self.count)
            || self.used().iter().any(|a| {
                a.w.ty != first.w.ty
                    || a.w.cols != first.w.cols
                    || a.w.row_bytes != first.w.row_bytes
            })
        {
            return Err(refusal(
                kernel,
                format!("{} products of differing formats or widths", self.count),
            ));
        }
        self.used()
            .iter()
            .try_for_each(|a| mv8_validate(kernel, a, 1))
    }
    fn params(&self) -> Self::Params {
        let slot = |i: usize| self.used().get(i);
        let w = |i| DevPtr::or_null(slot(i).map(|a: &MatmulArgs| a.w.ptr));
        let rows = |i| slot(i).map_or(0, |a: &MatmulArgs| a.w.rows as i32);
        let bias = |i| DevPtr::or_null(slot(i).and_then(|a: &MatmulArgs| a.bias));
        let out = |i| DevPtrMut::or_null(slot(i).map(|a: &MatmulArgs| a.out));
        let first = &self.args[0];
        let (hi, lo, d, sums) = self.x8.reads();
        (
            w(0),
            w(1),
            w(2),
            first.w.row_bytes as i64,
            rows(0),
            rows(1),
            rows(2),
            first.w.cols as i32,
            hi,
            lo,
            d,
            sums,
            bias(0),
            bias(1),
            bias(2),
            out(0),
            out(1),
            out(2),
        )
    }
}

/// Q, K and V of one row of x through one `mv8q_*` launch: as
/// [`MatVec8ManyCall`] computes them (all three products), then Q's and K's
/// heads turned by `rope` (adjacent pairs; its rows and positions are the
/// window's, its x is Q's output) and K's and V's rows stored in the cache
/// at the window's position, as [`QkRopeStoreArgs`] turns and stores them.
#[derive(Clone, Copy, Debug)]
pub struct MatVec8QkvCall {
    pub products: MatVec8ManyCall,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope: RopeArgs,
    pub window: CacheWindow,
    /// `[n_head_kv, capacity, head_dim]` f16 each.
    pub k_cache: DevPtrMut<f16>,
    pub v_cache: DevPtrMut<f16>,
}

impl KernelCall for MatVec8QkvCall {
    type Params = Then<
        <MatVec8ManyCall as KernelCall>::Params,
        (
            i32,
            i32,
            DevPtr<f64>,
            f32,
            f32,
            f32,
            i32,
            DevPtr<i32>,
            i32,
            DevPtrMut<f16>,
            DevPtrMut<f16>,
        ),
    >;

    fn plan(&self) -> Plan {
        let mut plan = self.products.plan();
        plan.kernel = Kernel::MatVec8Qkv(self.products.args[0].w.ty);
        plan.dims.extend([
            ("n_head", self.n_head),
            ("n_head_kv", self.n_head_kv),
            ("head_dim", self.head_dim),
            ("capacity", self.window.capacity),
        ]);
        plan.buffers.extend([
            ("k_cache", self.k_cache.addr()),
            ("v_cache", self.v_cache.addr()),
        ]);
        plan
    }
    fn validate(&self) -> Result<(), BackendError> {
        let k = Kernel::MatVec8Qkv(self.products.args[0].w.ty);
        self.products.validate()?;
        let [q, kk, v] = &self.products.args;
        let (hd, r) = (self.head_dim, &self.rope);
        let shapes_ok = self.products.count == 3
            && q.w.rows == self.n_head * hd
            && kk.w.rows == self.n_head_kv * hd
            && v.w.rows == self.n_head_kv * hd
            && hd.is_multiple_of(2);
        if !shapes_ok {
            return Err(refusal(
                k,
                "Q, K and V rows that are not whole heads".into(),
            ));
        }
        if !r.turns_only(q.out.addr(), 1, self.n_head, hd, &self.window)
            || r.pairs != RopePairs::Adjacent
        {
            return Err(refusal(
                k,
                "a rotation of other rows, positions or pairs".into(),
            ));
        }
        r.validate()?;
        self.window.check(k, 1)
    }
    fn params(&self) -> Self::Params {
        let (start, pos, cap) = self.window.params();
        let r = &self.rope;
        Then(
            self.products.params(),
            (
                self.head_dim as i32,
                r.n_rot as i32,
                DevPtr::or_null(r.inv_freq),
                r.freq_base,
                r.freq_scale,
                r.mscale,
                start,
                pos,
                cap,
                self.k_cache,
                self.v_cache,
            ),
        )
    }
}

/// A matmul of several rows of x through `mv8n_*` (groups of
/// `MV8_MAX_TOKENS` along the grid's y, at most [`MV8N_MAX_ROWS_OF_X`]),
/// reading x as `quantize_x8` wrote it into `x8` (`args.x` itself is not
/// read).
#[derive(Clone, Copy, Debug)]
pub struct MatVec8NCall {
    pub args: MatmulArgs,
    pub x8: X8Bufs,
}

impl KernelCall for MatVec8NCall {
    type Params = (
        DevPtr<u8>,
        i64,
        i32,
        i32,
        i32,
        DevPtr<i8>,
        DevPtr<i8>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        mv8_plan(Kernel::MatVec8N(self.args.w.ty), &self.args, &self.x8)
    }
    fn validate(&self) -> Result<(), BackendError> {
        mv8_validate(
            Kernel::MatVec8N(self.args.w.ty),
            &self.args,
            MV8N_MAX_ROWS_OF_X,
        )
    }
    fn params(&self) -> Self::Params {
        x8_rows_params(&self.args, &self.x8)
    }
}

/// Most rows of x one `mv8n_*` launch takes (its grid's y).
pub const MV8N_MAX_ROWS_OF_X: usize = MV8_MAX_TOKENS * 65535;

/// The parameters of a kernel over several rows of x split into `x8`
/// (`mv8n_*`, `mmq_*`): the weights, n, x's parts, the bias and out.
fn x8_rows_params(a: &MatmulArgs, x8: &X8Bufs) -> <MatVec8NCall as KernelCall>::Params {
    let (w, row_bytes, rows, cols) = a.w.params();
    let (hi, lo, d, sums) = x8.reads();
    let bias = DevPtr::or_null(a.bias);
    (
        w, row_bytes, rows, cols, a.n as i32, hi, lo, d, sums, bias, a.out,
    )
}

/// A matmul of up to `MMQ_MAX_TOKENS` rows of x through `mmq_*` (the
/// integer tensor cores), reading x as `quantize_x8` wrote it into `x8`.
#[derive(Clone, Copy, Debug)]
pub struct MmqCall {
    pub args: MatmulArgs,
    pub x8: X8Bufs,
}

impl KernelCall for MmqCall {
    type Params = <MatVec8NCall as KernelCall>::Params;

    fn plan(&self) -> Plan {
        mv8_plan(Kernel::Mmq(self.args.w.ty), &self.args, &self.x8)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let kernel = Kernel::Mmq(self.args.w.ty);
        mv8_validate(kernel, &self.args, MMQ_MAX_TOKENS)?;
        if !has_mmq(self.args.w.ty) {
            return Err(refusal(
                kernel,
                format!("{} weights", self.args.w.ty.name()),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        x8_rows_params(&self.args, &self.x8)
    }
}

/// The plan of an `mv8*` launch: the weights, x's parts and the output.
fn mv8_plan(kernel: Kernel, a: &MatmulArgs, x8: &X8Bufs) -> Plan {
    let [hi, lo, d, sums] = x8.addrs();
    plan(
        kernel,
        a.w.dims(a.n),
        [
            ("w", a.w.ptr.addr()),
            hi,
            lo,
            d,
            sums,
            ("out", a.out.addr()),
        ],
        match kernel {
            Kernel::MatVec8(_) => Work::MatVec {
                rows: a.w.rows,
                cols: a.w.cols,
            },
            _ => Work::Matrix {
                rows: a.w.rows,
                n: a.n,
            },
        },
    )
}

/// An `mv8*` kernel takes up to `max_n` rows of x, whole 32-value blocks
/// of a format it has a unit for.
fn mv8_validate(kernel: Kernel, a: &MatmulArgs, max_n: usize) -> Result<(), BackendError> {
    if a.n > max_n || !a.w.cols.is_multiple_of(32) || !has_mv8(a.w.ty) {
        return Err(refusal(
            kernel,
            format!(
                "{} rows of x by {} {} columns",
                a.n,
                a.w.cols,
                a.w.ty.name()
            ),
        ));
    }
    Ok(())
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
    /// Where `out` is also split for `mv8_*` (one row of a multiple of 32
    /// values), or none.
    pub x8: Option<X8Bufs>,
}

impl KernelCall for RmsNormArgs {
    type Params = (
        DevPtr<f32>,
        DevPtr<f32>,
        i32,
        f32,
        i32,
        DevPtrMut<f32>,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

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
    fn validate(&self) -> Result<(), BackendError> {
        validate_x8_output(Kernel::RmsNorm, self.x8, self.rows, self.cols)
    }
    fn params(&self) -> Self::Params {
        let (hi, lo, d, sums) = X8Bufs::writes_or_null(self.x8);
        (
            self.x,
            self.w,
            self.cols as i32,
            self.eps,
            self.rows as i32,
            self.out,
            hi,
            lo,
            d,
            sums,
        )
    }
}

/// `add_rms_norm`: `x[t] += y[t]` (or `rms_norm(y[t]) * yw` where `yw` is
/// given), then `out[t]` as [`RmsNormArgs`] has it.
#[derive(Clone, Copy, Debug)]
pub struct AddRmsNormArgs {
    /// `[rows, cols]` f32, updated in place; overlapping neither `y` nor `out`.
    pub x: DevPtrMut<f32>,
    /// `[rows, cols]` f32.
    pub y: DevPtr<f32>,
    /// `[cols]` f32: `y`'s own norm weights, or none.
    pub yw: Option<DevPtr<f32>>,
    /// `[cols]` f32.
    pub w: DevPtr<f32>,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
    /// As in [`RmsNormArgs`].
    pub x8: Option<X8Bufs>,
}

impl KernelCall for AddRmsNormArgs {
    type Params = (
        DevPtrMut<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        i32,
        f32,
        i32,
        DevPtrMut<f32>,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let buffers = [
            ("x", self.x.addr()),
            ("y", self.y.addr()),
            ("w", self.w.addr()),
            ("out", self.out.addr()),
        ];
        let (rows, cols) = (self.rows, self.cols);
        let dims = [("rows", rows), ("cols", cols)];
        plan(Kernel::AddRmsNorm, dims, buffers, Work::Rows { rows, cols })
    }
    fn validate(&self) -> Result<(), BackendError> {
        validate_x8_output(Kernel::AddRmsNorm, self.x8, self.rows, self.cols)
    }
    fn params(&self) -> Self::Params {
        let (hi, lo, d, sums) = X8Bufs::writes_or_null(self.x8);
        let (rows, cols) = (self.rows as i32, self.cols as i32);
        let yw = DevPtr::or_null(self.yw);
        (
            self.x, self.y, yw, self.w, cols, self.eps, rows, self.out, hi, lo, d, sums,
        )
    }
}

/// `add_rms_norm_cluster`: [`AddRmsNormArgs`] for one row, no `yw`, split
/// for `mv8_*`, over a cluster of [`norm_cluster_blocks`] blocks.
#[derive(Clone, Copy, Debug)]
pub struct AddRmsNormClusterArgs {
    /// `[cols]` f32, updated in place; overlapping neither `y` nor `out`.
    pub x: DevPtrMut<f32>,
    /// `[cols]` f32.
    pub y: DevPtr<f32>,
    /// `[cols]` f32.
    pub w: DevPtr<f32>,
    pub cols: usize,
    pub eps: f32,
    /// `[cols]` f32.
    pub out: DevPtrMut<f32>,
    pub x8: X8Bufs,
}

impl KernelCall for AddRmsNormClusterArgs {
    type Params = (
        DevPtrMut<f32>,
        DevPtr<f32>,
        DevPtr<f32>,
        i32,
        f32,
        DevPtrMut<f32>,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let buffers = [
            ("x", self.x.addr()),
            ("y", self.y.addr()),
            ("w", self.w.addr()),
            ("out", self.out.addr()),
            ("x8", self.x8.hi.addr()),
        ];
        let cols = self.cols;
        // A width no cluster divides is refused by `validate`.
        let blocks = norm_cluster_blocks(cols).unwrap_or(1);
        plan(
            Kernel::AddRmsNormCluster,
            [("cols", cols)],
            buffers,
            Work::ClusterRow { cols, blocks },
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if norm_cluster_blocks(self.cols).is_none() {
            return Err(refusal(
                Kernel::AddRmsNormCluster,
                format!("a row of {} values", self.cols),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        let x8 = self.x8;
        (
            self.x,
            self.y,
            self.w,
            self.cols as i32,
            self.eps,
            self.out,
            x8.hi,
            x8.lo,
            x8.d,
            x8.sums,
        )
    }
}

impl SplitsOutput for AddRmsNormClusterArgs {
    fn x8(&self) -> Option<X8Bufs> {
        Some(self.x8)
    }
}

/// A kernel that may also split its output for `mv8_*`.
pub trait SplitsOutput: KernelCall {
    /// Where it splits its output, if it does.
    fn x8(&self) -> Option<X8Bufs>;
}

impl SplitsOutput for RmsNormArgs {
    fn x8(&self) -> Option<X8Bufs> {
        self.x8
    }
}

impl SplitsOutput for AddRmsNormArgs {
    fn x8(&self) -> Option<X8Bufs> {
        self.x8
    }
}

impl SplitsOutput for GluArgs {
    fn x8(&self) -> Option<X8Bufs> {
        self.x8
    }
}

/// A kernel splits its output for `mv8_*` only for one row of whole
/// 32-value groups (its warps each take one group).
fn validate_x8_output(
    k: Kernel,
    x8: Option<X8Bufs>,
    rows: usize,
    cols: usize,
) -> Result<(), BackendError> {
    if x8.is_some() && (rows != 1 || !cols.is_multiple_of(32)) {
        return Err(refusal(
            k,
            format!("splitting {rows} rows of {cols} values"),
        ));
    }
    Ok(())
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

/// The activation of a gated feed-forward ([`GluArgs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `swiglu`: `out[i] = gate[i] / (1 + exp(-gate[i])) * up[i]`.
    Silu,
    /// `geglu`: `out[i] = gelu(gate[i]) * up[i]`.
    Gelu,
    /// `swiglu_oai`: gpt-oss's clamped SwiGLU, `out[i] = min(g, 7) *
    /// sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`.
    SiluOai,
}

/// A gated activation of `gate` times `up` (one kernel per [`Glu`]).
#[derive(Clone, Copy, Debug)]
pub struct GluArgs {
    pub act: Glu,
    /// `[len]` f32 each.
    pub gate: DevPtr<f32>,
    pub up: DevPtr<f32>,
    pub len: usize,
    pub out: DevPtrMut<f32>,
    /// Where `out` is also split for `mv8_*` (`len` a multiple of 32: the
    /// split is by 32-value groups, so any whole rows of them), or none.
    pub x8: Option<X8Bufs>,
}

// The element-wise kernels take an i64 length: no `int` dimension to check;
// the grid refuses zero elements.
impl KernelCall for GluArgs {
    type Params = (
        DevPtr<f32>,
        DevPtr<f32>,
        i64,
        DevPtrMut<f32>,
        DevPtrMut<i8>,
        DevPtrMut<i8>,
        DevPtrMut<f32>,
        DevPtrMut<f32>,
    );

    fn plan(&self) -> Plan {
        let buffers = [
            ("gate", self.gate.addr()),
            ("up", self.up.addr()),
            ("out", self.out.addr()),
        ];
        plan(self.kernel(), [], buffers, Work::Elements(self.len))
    }
    fn validate(&self) -> Result<(), BackendError> {
        validate_x8_output(self.kernel(), self.x8, 1, self.len)
    }
    fn params(&self) -> Self::Params {
        let (hi, lo, d, sums) = X8Bufs::writes_or_null(self.x8);
        (
            self.gate,
            self.up,
            self.len as i64,
            self.out,
            hi,
            lo,
            d,
            sums,
        )
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

impl GluArgs {
    fn kernel(&self) -> Kernel {
        match self.act {
            Glu::Silu => Kernel::Swiglu,
            Glu::Gelu => Kernel::Geglu,
            Glu::SiluOai => Kernel::SwigluOai,
        }
    }
}

/// `scale`: `x[i] *= factor`.
#[derive(Clone, Copy, Debug)]
pub struct ScaleArgs {
    /// `[len]` f32.
    pub x: DevPtrMut<f32>,
    pub len: usize,
    pub factor: f32,
}

impl KernelCall for ScaleArgs {
    type Params = (DevPtrMut<f32>, i64, f32);

    fn plan(&self) -> Plan {
        plan(
            Kernel::Scale,
            [],
            [("x", self.x.addr())],
            Work::Elements(self.len),
        )
    }
    fn params(&self) -> Self::Params {
        (self.x, self.len as i64, self.factor)
    }
}

/// `copy_cols`: `out[t][c] = x[t][start + c]` for `c < cols`.
#[derive(Clone, Copy, Debug)]
pub struct CopyColsArgs {
    /// `[rows, x_cols]` f32.
    pub x: DevPtr<f32>,
    pub rows: usize,
    pub x_cols: usize,
    /// `start + cols <= x_cols`.
    pub start: usize,
    pub cols: usize,
    /// `[rows, cols]` f32.
    pub out: DevPtrMut<f32>,
}

impl KernelCall for CopyColsArgs {
    type Params = (DevPtr<f32>, i32, i32, i32, DevPtrMut<f32>, i64);

    fn plan(&self) -> Plan {
        plan(
            Kernel::CopyCols,
            [("x_cols", self.x_cols), ("cols", self.cols)],
            [("x", self.x.addr()), ("out", self.out.addr())],
            Work::Elements(self.rows.saturating_mul(self.cols)),
        )
    }
    fn validate(&self) -> Result<(), BackendError> {
        if self.start + self.cols > self.x_cols {
            return Err(refusal(
                Kernel::CopyCols,
                format!(
                    "columns {}..{} of {}",
                    self.start,
                    self.start + self.cols,
                    self.x_cols
                ),
            ));
        }
        Ok(())
    }
    fn params(&self) -> Self::Params {
        (
            self.x,
            self.x_cols as i32,
            self.start as i32,
            self.cols as i32,
            self.out,
            (self.rows * self.cols) as i64,
        )
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
