//! The argument structs of `matvec.cu`'s integer mat-vecs (`mv8_*`,
//! `mv8m_*`, `mv8q_*`, `mv8n_*`) and `mmq_*`, all from x split by
//! `quantize_x8` into [`X8Bufs`] (`operands.rs`, with the kernels that
//! write such a split beside their output).

use half::f16;

use super::family::{has_mv8, mv8_rows_per_block, Matvec};
use crate::backend::cuda::kernels::launch::{
    kernel_params, param_group, plan, refusal, KernelCall, Plan, Work,
};
use crate::backend::cuda::kernels::matmul::MatmulArgs;
use crate::backend::cuda::kernels::operands::{
    CacheWindow, StoredParams, WindowParams, X8Bufs, X8Reads,
};
use crate::backend::cuda::kernels::rope::{RopeArgs, RopePairs};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::{has_mmq, MMQ_MAX_TOKENS, MV8_MAX_TOKENS};
use crate::backend::BackendError;

/// A matmul of one row of x through `mv8_*`, reading x as `quantize_x8`
/// wrote it into `x8` (`args.x` itself is not read).
#[derive(Clone, Copy, Debug)]
pub struct MatVec8Call {
    pub args: MatmulArgs,
    pub x8: X8Bufs,
}

impl MatVec8Call {
    fn kernel(&self) -> Matvec {
        Matvec::MatVec8(self.args.w.ty)
    }
}

impl KernelCall for MatVec8Call {
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        mv8_plan(self.kernel(), &self.args, &self.x8)
    }
    fn validate(&self) -> Result<(), BackendError> {
        mv8_validate(self.kernel(), &self.args, 1)
    }
    kernel_params! { self =>
        let a = &self.args;
        ..StoredParams = a.w.params(),
        ..X8Reads = self.x8.reads(),
        DevPtr<f32> = DevPtr::or_null(a.bias),
        DevPtrMut<f32> = a.out,
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
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        let first = &self.args[0];
        let kernel = Matvec::MatVec8Many(first.w.ty);
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
        let kernel = Matvec::MatVec8Many(first.w.ty);
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
    kernel_params! { self =>
        let slot = |i: usize| self.used().get(i);
        let w = |i| DevPtr::or_null(slot(i).map(|a: &MatmulArgs| a.w.ptr));
        let rows = |i| slot(i).map_or(0, |a: &MatmulArgs| a.w.rows as i32);
        let bias = |i| DevPtr::or_null(slot(i).and_then(|a: &MatmulArgs| a.bias));
        let out = |i| DevPtrMut::or_null(slot(i).map(|a: &MatmulArgs| a.out));
        let first = &self.args[0];
        DevPtr<u8> = w(0),
        DevPtr<u8> = w(1),
        DevPtr<u8> = w(2),
        i64 = first.w.row_bytes as i64,
        i32 = rows(0),
        i32 = rows(1),
        i32 = rows(2),
        i32 = first.w.cols as i32,
        ..X8Reads = self.x8.reads(),
        DevPtr<f32> = bias(0),
        DevPtr<f32> = bias(1),
        DevPtr<f32> = bias(2),
        DevPtrMut<f32> = out(0),
        DevPtrMut<f32> = out(1),
        DevPtrMut<f32> = out(2),
    }
}

/// Q, K and V of one row of x through one `mv8q_*` launch: as
/// [`MatVec8ManyCall`] computes them (all three products), then Q's and K's
/// heads turned by `rope` (adjacent pairs; its rows and positions are the
/// window's, its x is Q's output) and K's and V's rows stored in the cache
/// at the window's position, as [`QkRopeStoreArgs`](crate::backend::cuda::kernels::rope::QkRopeStoreArgs) turns and stores them.
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
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        let mut plan = self.products.plan();
        plan.kernel = Matvec::MatVec8Qkv(self.products.args[0].w.ty);
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
        let k = Matvec::MatVec8Qkv(self.products.args[0].w.ty);
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
    kernel_params! { self =>
        ..<MatVec8ManyCall as KernelCall>::Params = self.products.params(),
        i32 = self.head_dim as i32,
        i32 = self.rope.n_rot as i32,
        DevPtr<f64> = DevPtr::or_null(self.rope.inv_freq),
        f32 = self.rope.freq_base,
        f32 = self.rope.freq_scale,
        f32 = self.rope.mscale,
        ..WindowParams = self.window.params(),
        DevPtrMut<f16> = self.k_cache,
        DevPtrMut<f16> = self.v_cache,
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
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        mv8_plan(Matvec::MatVec8N(self.args.w.ty), &self.args, &self.x8)
    }
    fn validate(&self) -> Result<(), BackendError> {
        mv8_validate(
            Matvec::MatVec8N(self.args.w.ty),
            &self.args,
            MV8N_MAX_ROWS_OF_X,
        )
    }
    kernel_params! { self =>
        ..X8RowsParams = x8_rows_params(&self.args, &self.x8),
    }
}

/// Most rows of x one `mv8n_*` launch takes (its grid's y).
pub const MV8N_MAX_ROWS_OF_X: usize = MV8_MAX_TOKENS * 65535;

param_group! {
    /// The parameters of a kernel over several rows of x split into `x8`
    /// (`mv8n_*`, `mmq_*`): the weights, n, x's parts, the bias and out.
    pub type X8RowsParams;
    pub(crate) fn x8_rows_params(a: &MatmulArgs, x8: &X8Bufs) {
        ..StoredParams = a.w.params(),
        i32 = a.n as i32,
        ..X8Reads = x8.reads(),
        DevPtr<f32> = DevPtr::or_null(a.bias),
        DevPtrMut<f32> = a.out,
    }
}

/// A matmul of up to `MMQ_MAX_TOKENS` rows of x through `mmq_*` (the
/// integer tensor cores), reading x as `quantize_x8` wrote it into `x8`.
#[derive(Clone, Copy, Debug)]
pub struct MmqCall {
    pub args: MatmulArgs,
    pub x8: X8Bufs,
}

impl KernelCall for MmqCall {
    type Kernel = Matvec;
    fn plan(&self) -> Plan<Self::Kernel> {
        mv8_plan(Matvec::Mmq(self.args.w.ty), &self.args, &self.x8)
    }
    fn validate(&self) -> Result<(), BackendError> {
        let kernel = Matvec::Mmq(self.args.w.ty);
        mv8_validate(kernel, &self.args, MMQ_MAX_TOKENS)?;
        if !has_mmq(self.args.w.ty) {
            return Err(refusal(
                kernel,
                format!("{} weights", self.args.w.ty.name()),
            ));
        }
        Ok(())
    }
    kernel_params! { self =>
        ..X8RowsParams = x8_rows_params(&self.args, &self.x8),
    }
}

/// The plan of an `mv8*` launch: the weights, x's parts and the output.
pub(crate) fn mv8_plan(kernel: Matvec, a: &MatmulArgs, x8: &X8Bufs) -> Plan<Matvec> {
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
            Matvec::MatVec8(_) => Work::MatVec {
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
pub(crate) fn mv8_validate(
    kernel: Matvec,
    a: &MatmulArgs,
    max_n: usize,
) -> Result<(), BackendError> {
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
