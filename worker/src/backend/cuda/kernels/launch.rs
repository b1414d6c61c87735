//! What a kernel launch is, apart from any particular kernel: what each
//! family tells about its kernels ([`Family`]), the argument checks every
//! launch makes ([`check_args`], M0-W-1431), the problem sizes grids are
//! laid over ([`Work`]), the parameter lists pushed in a kernel's C order
//! ([`ParamList`], written once a kernel with `kernel_params!`), and the
//! [`KernelCall`] trait that each kernel's argument struct implements in
//! its family's file, so that one generic launcher (`Kernels::launch`)
//! checks, shapes and launches them all. Nothing here names `kernel.rs`'s
//! `Kernel` (every kernel of every family): a launch names its kernel by
//! its family's type ([`Named`]), and `kernel.rs` and the loader, above the
//! families, turn that into a `Kernel`.

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{LaunchArgs, LaunchConfig, PushKernelArg};

use crate::backend::cuda::ptr::Param;
use crate::backend::cuda::source::Module;
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// What one family of kernels (the kernels of one `cuda/<family>.cu`, an
/// enum in `kernels/<family>.rs`) tells about each of its kernels: the
/// one place each fact is written.
pub trait Family: Copy + std::fmt::Debug {
    /// The module its kernels are compiled in.
    const MODULE: Module;
    /// Every kernel of the family, for loading them all at start.
    fn all() -> Vec<Self>;
    /// The `extern "C"` symbol in the module.
    fn symbol(self) -> String;
    /// The weight format of a per-format kernel.
    fn format(self) -> Option<GgmlType> {
        None
    }
    /// Which part of its module the kernel is compiled in, for the modules
    /// cut in [`Module::parts`] (the `ONE_PART` guards of their sources).
    fn part(self) -> Option<u8> {
        None
    }
    /// Dynamic shared memory a block needs, for the kernels that take it
    /// (over the 48 KB default: the loader raises their limit to this).
    fn dynamic_smem(self) -> Option<u32> {
        None
    }
    /// Whether the kernel's blocks hold tens of KB of shared memory, so that
    /// the SM should give shared memory all it can (left to the driver, an
    /// earlier `attention_split` of 41 KB blocks ran at one block per SM;
    /// `benches/results/kernel-choices.md`), or blocks of a few KB that
    /// should share an SM four at a time (left to the driver,
    /// `attention_split`'s 4 KB blocks also ran one at a time).
    fn prefers_shared_memory(self) -> bool {
        false
    }
    /// The grid and block over `work`, or `None` where the kernel is not
    /// laid out over that kind of work. The block sizes are the ones the
    /// kernels are compiled for (`source.rs`, `__launch_bounds__`);
    /// dimensions were checked by [`check_args`] (at most `i32::MAX`)
    /// before this is asked.
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>>;
    /// The C types its launcher (its argument struct's [`KernelCall`])
    /// pushes, compared with the `.cu` definition by a test.
    #[cfg(test)]
    fn pushed(self) -> Vec<String>;
    /// Where the kernel's definition opens in its module's source: a text
    /// to find first ("" for none), then the first found after it of the
    /// texts just before its parameter list. A per-format kernel is
    /// defined once in a `FOR_EACH_TYPE` macro (`<prefix>##name(`), any
    /// other by its symbol.
    #[cfg(test)]
    fn definition(self) -> (&'static str, Vec<String>) {
        let sym = Family::symbol(self);
        match self.format() {
            Some(t) => {
                let prefix = sym.strip_suffix(&type_suffix(t)).unwrap_or(&sym);
                ("", vec![format!("{prefix}##name(")])
            }
            None => ("", vec![format!("void {sym}("), format!(")\n    {sym}(")]),
        }
    }
    /// The head-size class ([`crate::backend::cuda::source::head_pairs`])
    /// of a kernel compiled for one: only the model's class is loaded.
    fn head_pairs(self) -> Option<u8> {
        None
    }
}

/// Declares a family's enum of kernels without parameters, each with its
/// `extern "C"` symbol: `ALL` (every variant) and `name` (the symbol), for
/// the family's `Family::all` and `Family::symbol`.
macro_rules! unit_kernels {
    (
        $(#[$meta:meta])*
        pub enum $family:ident {
            $($(#[$vmeta:meta])* $variant:ident = $symbol:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $family {
            $($(#[$vmeta])* $variant,)+
        }

        impl $family {
            /// Every kernel of the family (`pub(super)`: a family of a
            /// directory implements `Family` in its `mod.rs`).
            pub(super) const ALL: &'static [$family] = &[$($family::$variant),+];

            /// The kernel's `extern "C"` symbol.
            pub(super) fn name(self) -> &'static str {
                match self {
                    $($family::$variant => $symbol),+
                }
            }
        }
    };
}
pub(crate) use unit_kernels;

/// Declares a per-format family's enum (each kernel compiled once per weight
/// format, `FOR_EACH_TYPE` in dequant.cuh), each variant with the prefix of
/// its `extern "C"` symbols: `name` (`mv_q8_0`) and `weight_format`, for the
/// family's `Family::symbol` and `Family::format`.
macro_rules! format_kernels {
    (
        $(#[$meta:meta])*
        pub enum $family:ident {
            $($(#[$vmeta:meta])* $variant:ident = $prefix:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $family {
            $($(#[$vmeta])* $variant($crate::quant::GgmlType),)+
        }

        impl $family {
            /// The kernel's `extern "C"` symbol: its prefix, then its format
            /// (`pub(super)`: a family of a directory implements `Family` in
            /// its `mod.rs`).
            pub(super) fn name(self) -> String {
                let (prefix, t) = match self {
                    $($family::$variant(t) => ($prefix, t)),+
                };
                format!("{prefix}_{}", $crate::backend::cuda::kernels::launch::type_suffix(t))
            }

            /// The weight format the kernel is compiled for.
            pub(super) fn weight_format(self) -> $crate::quant::GgmlType {
                match self {
                    $($family::$variant(t))|+ => t,
                }
            }
        }
    };
}
pub(crate) use format_kernels;

/// The C types a launcher of `C` pushes (for [`Family::pushed`]).
#[cfg(test)]
pub fn pushed<C: KernelCall>() -> Vec<String> {
    <C::Params as ParamList>::c_types()
}

/// A weight format as kernel symbols end in it (`q8_0`, `f16`).
pub fn type_suffix(t: GgmlType) -> String {
    t.name().to_ascii_lowercase()
}

/// A kernel as a launch names it: a kernel of one family (any [`Family`]),
/// or of either of two ([`Either`]); `kernel.rs`'s `Kernel`, any kernel,
/// is one too.
pub trait Named: Copy + std::fmt::Debug {
    /// The `extern "C"` symbol, for refusals.
    fn symbol(self) -> String;
}

impl<F: Family> Named for F {
    fn symbol(self) -> String {
        Family::symbol(self)
    }
}

/// A kernel of one family or of another, for an argument struct that
/// launches either (`attention.rs`'s `AttentionArgs`: `attention` or
/// `attention_tc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Either<A, B> {
    A(A),
    B(B),
}

impl<A: Named, B: Named> Named for Either<A, B> {
    fn symbol(self) -> String {
        match self {
            Either::A(k) => k.symbol(),
            Either::B(k) => k.symbol(),
        }
    }
}

/// The plan of a kernel over `work` with these dimensions and buffers.
pub fn plan<K: Named, const D: usize, const B: usize>(
    kernel: K,
    dims: [(&'static str, usize); D],
    buffers: [(&'static str, CUdeviceptr); B],
    work: Work,
) -> Plan<K> {
    Plan {
        kernel,
        dims: dims.to_vec(),
        buffers: buffers.to_vec(),
        work,
    }
}

/// M0-W-1431: the checks every launch makes before it queues anything, so
/// that a bad call is a typed error rather than a launch that reads or
/// writes outside a buffer. Each `int` argument of the kernel must lie in
/// `1..=i32::MAX` (zero rows or columns are refused, not launched as empty
/// grids), and each required buffer must not be null. Buffer sizes are
/// checked one level up, in `ops.rs`, where the buffers are known.
pub fn check_args(
    k: impl Named,
    ints: &[(&str, usize)],
    ptrs: &[(&str, CUdeviceptr)],
) -> Result<(), BackendError> {
    for &(name, v) in ints {
        if v == 0 {
            return Err(refusal(k, format!("{name} is zero; nothing is launched")));
        }
        if v > i32::MAX as usize {
            return Err(refusal(
                k,
                format!("{name} = {v} exceeds the kernel's int range"),
            ));
        }
    }
    if let Some((name, _)) = ptrs.iter().find(|(_, p)| *p == 0) {
        return Err(refusal(k, format!("buffer {name} is null")));
    }
    Ok(())
}

/// A launch refused before anything was queued: `<symbol>: <why>`.
pub fn refusal(k: impl Named, why: String) -> BackendError {
    BackendError::Shape(format!("{}: {why}", k.symbol()))
}

/// The problem size a kernel's grid is laid over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// One thread per element.
    Elements(usize),
    /// One block per row of `cols` values.
    Rows { rows: usize, cols: usize },
    /// An output of `rows` weight rows by `n` rows of x (matmul).
    Matrix { rows: usize, n: usize },
    /// One row of x by `rows` weight rows of `cols` columns (`mv8_*`;
    /// `mv8m_*`: the matrices' rows each rounded up to whole blocks).
    MatVec { rows: usize, cols: usize },
    /// The same, its columns split into `splits` ranges.
    SplitMatrix {
        rows: usize,
        n: usize,
        splits: usize,
    },
    /// One block per (query row, head).
    Heads { n: usize, n_head: usize },
    /// `mv1_*`'s (or `mv8_*`'s) blocks over `rows` weight rows of `cols`
    /// columns, for each of `slots` (token, chosen expert) pairs, of each
    /// of `matrices` matrices.
    Experts {
        rows: usize,
        cols: usize,
        slots: usize,
        matrices: usize,
    },
    /// `gemm_tck_*`'s blocks over `rows` weight rows, for each of `tiles`
    /// tiles of rows of x of one expert each.
    ExpertTiles { rows: usize, tiles: usize },
    /// One block per (row, head) of heads of `head_dim` values, as wide as
    /// `rms_norm`'s block for a row of that width.
    HeadRows {
        n: usize,
        heads: usize,
        head_dim: usize,
    },
    /// One block per (KV head, chunk of the context).
    Chunks { n_head_kv: usize, nsplit: usize },
    /// The same for each of `rows` sequences (rows mode), `nsplit` chunks
    /// each at most.
    RowChunks {
        n_head_kv: usize,
        nsplit: usize,
        rows: usize,
    },
    /// One block for the whole problem.
    Single,
    /// One row of `cols` values over a cluster of `blocks` blocks, a
    /// thread a value.
    ClusterRow { cols: usize, blocks: usize },
}

impl Work {
    /// The thread block cluster the launch needs, if any.
    pub fn cluster(self) -> Option<u32> {
        match self {
            Work::ClusterRow { blocks, .. } => Some(blocks as u32),
            _ => None,
        }
    }
}

/// Threads per block of the one-thread-per-element kernels.
pub const ELEMENT_THREADS: u32 = 256;

/// A grid of `grid` blocks of `threads` threads.
pub fn blocks(grid: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One thread per element in blocks of `block`; zero elements are refused.
pub fn grid_1d(n: u64, block: u32) -> Result<LaunchConfig, BackendError> {
    if n == 0 {
        return Err(BackendError::Shape("a launch over zero elements".into()));
    }
    let count = u32::try_from(n.div_ceil(block as u64))
        .map_err(|_| BackendError::Shape(format!("{n} elements exceed one launch")))?;
    Ok(blocks((count, 1), block))
}

/// A kernel's parameter values in its C signature's order, pushed one by one.
pub trait ParamList {
    fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>);
    /// The address of each value, in order: `cuLaunchKernelEx`'s `kernelParams`.
    fn addresses(&self, out: &mut Vec<*mut std::ffi::c_void>);
    /// The C types, in order, for comparing with the `.cu` source.
    #[cfg(test)]
    fn c_types() -> Vec<String>;
}

macro_rules! param_tuple {
    ($($p:ident . $i:tt),+) => {
        impl<$($p: Param),+> ParamList for ($($p,)+) {
            fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>) {
                $(b.arg(&self.$i);)+
            }
            fn addresses(&self, out: &mut Vec<*mut std::ffi::c_void>) {
                $(out.push(&self.$i as *const $p as *mut std::ffi::c_void);)+
            }
            #[cfg(test)]
            fn c_types() -> Vec<String> {
                vec![$($p::c_type()),+]
            }
        }
    };
}

param_tuple!(A.0);
param_tuple!(A.0, B.1);
param_tuple!(A.0, B.1, C.2);
param_tuple!(A.0, B.1, C.2, D.3);
param_tuple!(A.0, B.1, C.2, D.3, E.4);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13);
param_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14);
param_tuple!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15, Q.16
);
param_tuple!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15, Q.16,
    R.17
);
param_tuple!(
    A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7, I.8, J.9, K.10, L.11, M.12, N.13, O.14, P.15, Q.16,
    R.17, S.18, T.19
);

/// A [`KernelCall`]'s `type Params` and `fn params` from one list of its
/// kernel's parameters in C order, each `Type = value`, so that order and
/// types are written once. `..Type = value` splices a [`ParamList`] of
/// several (an operand's, such as [`super::Stored`]'s); `let pattern =
/// value;` lines before the list name values it uses:
///
/// ```ignore
/// kernel_params! { self =>
///     let a = &self.args;
///     ..StoredParams = a.w.params(),
///     DevPtr<f32> = a.x,
///     i32 = a.n as i32,
///     ..X8Writes = X8Bufs::writes_or_null(self.x8),
/// }
/// ```
///
/// (`self` is passed in so that the values may name it.)
macro_rules! kernel_params {
    ($s:ident => $($list:tt)+) => {
        type Params = $crate::backend::cuda::kernels::launch::kernel_params!(@ty [] $($list)+);
        fn params(&$s) -> Self::Params {
            $crate::backend::cuda::kernels::launch::kernel_params!(@val [] $($list)+)
        }
    };
    // The type: runs of single parameters as tuples, splices between them.
    (@ty [] let $p:pat = $v:expr; $($rest:tt)*) => {
        $crate::backend::cuda::kernels::launch::kernel_params!(@ty [] $($rest)*)
    };
    (@ty [$($run:ty),*]) => { ($($run,)*) };
    (@ty [] .. $t:ty = $e:expr $(,)?) => { $t };
    (@ty [$($run:ty),+] .. $t:ty = $e:expr $(,)?) => {
        $crate::backend::cuda::kernels::launch::Then<($($run,)+), $t>
    };
    (@ty [] .. $t:ty = $e:expr, $($rest:tt)+) => {
        $crate::backend::cuda::kernels::launch::Then<
            $t,
            $crate::backend::cuda::kernels::launch::kernel_params!(@ty [] $($rest)+),
        >
    };
    (@ty [$($run:ty),+] .. $t:ty = $e:expr, $($rest:tt)+) => {
        $crate::backend::cuda::kernels::launch::Then<
            ($($run,)+),
            $crate::backend::cuda::kernels::launch::kernel_params!(@ty [] .. $t = $e, $($rest)+),
        >
    };
    (@ty [$($run:ty),*] $t:ty = $e:expr $(, $($rest:tt)*)?) => {
        $crate::backend::cuda::kernels::launch::kernel_params!(@ty [$($run,)* $t] $($($rest)*)?)
    };
    // The values, in the same shape.
    (@val [] let $p:pat = $v:expr; $($rest:tt)*) => {{
        let $p = $v;
        $crate::backend::cuda::kernels::launch::kernel_params!(@val [] $($rest)*)
    }};
    (@val [$($run:expr),*]) => { ($($run,)*) };
    (@val [] .. $t:ty = $e:expr $(,)?) => { $e };
    (@val [$($run:expr),+] .. $t:ty = $e:expr $(,)?) => {
        $crate::backend::cuda::kernels::launch::Then(($($run,)+), $e)
    };
    (@val [] .. $t:ty = $e:expr, $($rest:tt)+) => {
        $crate::backend::cuda::kernels::launch::Then(
            $e,
            $crate::backend::cuda::kernels::launch::kernel_params!(@val [] $($rest)+),
        )
    };
    (@val [$($run:expr),+] .. $t:ty = $e:expr, $($rest:tt)+) => {
        $crate::backend::cuda::kernels::launch::Then(
            ($($run,)+),
            $crate::backend::cuda::kernels::launch::kernel_params!(@val [] .. $t = $e, $($rest)+),
        )
    };
    (@val [$($run:expr),*] $t:ty = $e:expr $(, $($rest:tt)*)?) => {
        $crate::backend::cuda::kernels::launch::kernel_params!(@val [$($run,)* $e] $($($rest)*)?)
    };
}
pub(crate) use kernel_params;

/// A group of parameters several kernels take (an operand's), written as
/// `kernel_params!`'s list: declares the group's type `$alias` and the
/// function (or, inside `impl Owner { .. }`, the method) giving its values.
macro_rules! param_group {
    (
        $(#[$tm:meta])* $tv:vis type $alias:ident;
        impl $owner:ident {
            $(#[$fm:meta])* $fv:vis fn $f:ident($($args:tt)*) { $($list:tt)+ }
        }
    ) => {
        $(#[$tm])* $tv type $alias = $crate::backend::cuda::kernels::launch::kernel_params!(@ty [] $($list)+);
        impl $owner {
            $(#[$fm])* $fv fn $f($($args)*) -> $alias {
                $crate::backend::cuda::kernels::launch::kernel_params!(@val [] $($list)+)
            }
        }
    };
    (
        $(#[$tm:meta])* $tv:vis type $alias:ident;
        $(#[$fm:meta])* $fv:vis fn $f:ident($($args:tt)*) { $($list:tt)+ }
    ) => {
        $(#[$tm])* $tv type $alias = $crate::backend::cuda::kernels::launch::kernel_params!(@ty [] $($list)+);
        $(#[$fm])* $fv fn $f($($args)*) -> $alias {
            $crate::backend::cuda::kernels::launch::kernel_params!(@val [] $($list)+)
        }
    };
}
pub(crate) use param_group;

/// One kernel's parameters as two lists, the first pushed first: how
/// `kernel_params!` joins runs of single parameters and spliced groups.
pub struct Then<A, B>(pub A, pub B);

impl<A: ParamList, B: ParamList> ParamList for Then<A, B> {
    fn push_all<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        self.0.push_all(b);
        self.1.push_all(b);
    }
    fn addresses(&self, out: &mut Vec<*mut std::ffi::c_void>) {
        self.0.addresses(out);
        self.1.addresses(out);
    }
    #[cfg(test)]
    fn c_types() -> Vec<String> {
        let mut v = A::c_types();
        v.extend(B::c_types());
        v
    }
}

/// A launch as the generic launcher sees it: which kernel (`K`, its
/// family's type), what [`check_args`] checks, and the problem size the
/// grid is laid over.
#[derive(Clone, Debug)]
pub struct Plan<K> {
    pub kernel: K,
    /// The `int` dimensions, each to lie in `1..=i32::MAX`.
    pub dims: Vec<(&'static str, usize)>,
    /// The buffers that must not be null.
    pub buffers: Vec<(&'static str, CUdeviceptr)>,
    pub work: Work,
}

/// One launch of one kernel with named, typed arguments. Implemented by
/// each kernel's argument struct in its family's file; `Kernels::launch`
/// runs [`KernelCall::check`], lays the grid out (`kernel.rs`'s
/// `launch_config`) and pushes [`KernelCall::params`]. `Params` and `params` come from one list,
/// `kernel_params!`.
pub trait KernelCall {
    /// The kernel's parameters: exactly its C signature, in order (a test
    /// compares every one with the `.cu` source).
    type Params: ParamList;
    /// The kernel's type: its family's enum (or [`Either`] of two).
    type Kernel: Named;

    fn plan(&self) -> Plan<Self::Kernel>;
    /// Checks between arguments beyond [`check_args`] (cache positions,
    /// head counts); none by default.
    fn validate(&self) -> Result<(), BackendError> {
        Ok(())
    }
    /// The values to push; called only after [`KernelCall::check`] passed,
    /// so every dimension converts to the kernel's `int` exactly.
    fn params(&self) -> Self::Params;

    /// Everything refused before a launch (M0-W-1431); the plan to launch.
    fn check(&self) -> Result<Plan<Self::Kernel>, BackendError> {
        let plan = self.plan();
        check_args(plan.kernel, &plan.dims, &plan.buffers)?;
        self.validate()?;
        Ok(plan)
    }
}
