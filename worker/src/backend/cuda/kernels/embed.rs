//! The kernels of `cuda/embed.cu`: rows of a stored table to f32.

use cudarc::driver::LaunchConfig;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{
    blocks, format_kernels, kernel_params, plan, Family, KernelCall, Plan, Work,
};
use crate::backend::cuda::kernels::operands::{Stored, StoredParams};
use crate::backend::cuda::ptr::{DevPtr, DevPtrMut};
use crate::backend::cuda::source::Module;
use crate::backend::BackendError;
use crate::quant::GgmlType;

format_kernels! {
    /// The kernels of `embed.cu`.
    pub enum Embed {
        /// `embed_<type>`: rows of a stored table to f32.
        Embed = "embed",
    }
}

/// Threads per `embed_*` block (one block per token, threads over its row).
const EMBED_THREADS: u32 = 128;

impl Family for Embed {
    const MODULE: Module = Module::Embed;

    fn all() -> Vec<Embed> {
        GgmlType::ALL.into_iter().map(Embed::Embed).collect()
    }
    fn symbol(self) -> String {
        self.name()
    }
    fn format(self) -> Option<GgmlType> {
        Some(self.weight_format())
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        match work {
            Work::Rows { rows, .. } => Some(Ok(blocks((rows as u32, 1), EMBED_THREADS))),
            _ => None,
        }
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        pushed::<EmbedArgs>()
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
    type Kernel = Embed;
    fn plan(&self) -> Plan<Self::Kernel> {
        let t = &self.table;
        let buffers = [
            ("table", t.ptr.addr()),
            ("tokens", self.tokens.addr()),
            ("out", self.out.addr()),
        ];
        plan(
            Embed::Embed(t.ty),
            t.dims(self.n),
            buffers,
            Work::Rows {
                rows: self.n,
                cols: t.cols,
            },
        )
    }
    kernel_params! { self =>
        ..StoredParams = self.table.params(),
        DevPtr<u32> = self.tokens,
        i32 = self.n as i32,
        DevPtrMut<f32> = self.out,
    }
}
