//! The kernels of `cuda/matvec.cu`: a matrix product for one row of x
//! (decode) or a few (`mv1_*`; on the integer units from x split by
//! `quantize_x8`: `mv8_*`, `mv8m_*`, `mv8q_*`, `mv8n_*`), short prompts on
//! the integer tensor cores (`mmq_*`), and the chosen experts' products of
//! a mixture of experts (`mv1e_*`, `mv8e_*`, in `experts.rs`); which of them
//! a product takes is chosen in `select.rs` (`Kernels::mv8_choice`), on
//! the bounds here.
//!
//! `family.rs`: `mv1_*` and the family's enum (`Matvec`), with the bounds its
//! kernels are chosen by; `mv8.rs` and `experts.rs` import it. This file, above them all,
//! wires them in and holds the family's `Family` impl (which names their
//! argument structs, for the C types each kernel's launcher pushes).

mod experts;
mod family;
mod mv8;

pub use experts::*;
pub use family::*;
pub use mv8::*;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{blocks, Family, Work};
use crate::backend::cuda::source::{
    has_mmq, Module, MMQ_WARPS, MV1_ROWS, MV1_THREADS, MV8N_ROWS, MV8_MAX_TOKENS, MV8_THREADS,
};
use crate::backend::BackendError;
use crate::quant::GgmlType;
use cudarc::driver::LaunchConfig;

impl Family for Matvec {
    const MODULE: Module = Module::Matvec;

    fn all() -> Vec<Matvec> {
        let mut v = Vec::new();
        for t in GgmlType::ALL {
            v.extend([Matvec::MatVec1(t), Matvec::MatVecExperts(t)]);
            if has_mv8_experts(t) {
                v.push(Matvec::MatVec8Experts(t));
            }
            if has_mv8(t) {
                v.extend([
                    Matvec::MatVec8(t),
                    Matvec::MatVec8Many(t),
                    Matvec::MatVec8Qkv(t),
                    Matvec::MatVec8N(t),
                ]);
            }
            if has_mmq(t) {
                v.push(Matvec::Mmq(t));
            }
        }
        v
    }
    fn symbol(self) -> String {
        self.name()
    }
    fn format(self) -> Option<GgmlType> {
        Some(self.weight_format())
    }
    fn part(self) -> Option<u8> {
        match self {
            Matvec::MatVec1(_)
            | Matvec::MatVec8(_)
            | Matvec::MatVec8Many(_)
            | Matvec::MatVec8Qkv(_)
            | Matvec::MatVec8N(_) => Some(0),
            Matvec::Mmq(_) => Some(1),
            Matvec::MatVecExperts(_) | Matvec::MatVec8Experts(_) => Some(2),
        }
    }
    fn prefers_shared_memory(self) -> bool {
        matches!(self, Matvec::MatVec1(_) | Matvec::MatVecExperts(_))
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        Some(match (self, work) {
            (Matvec::MatVec1(_), Work::Matrix { rows, .. }) => {
                Ok(blocks(((rows as u32).div_ceil(MV1_ROWS), 1), MV1_THREADS))
            }
            (
                Matvec::MatVecExperts(_) | Matvec::MatVec8Experts(_),
                Work::Experts {
                    rows,
                    cols,
                    slots,
                    matrices,
                },
            ) => {
                if slots > 65535 || !(1..=2).contains(&matrices) {
                    return Some(Err(BackendError::Shape(format!(
                        "{slots} (token, expert) pairs of {matrices} matrices exceed one launch"
                    ))));
                }
                let (per_block, threads) = match self {
                    Matvec::MatVecExperts(_) => (MV1_ROWS, MV1_THREADS),
                    _ => (mv8_rows_per_block(cols) as u32, MV8_THREADS),
                };
                Ok(LaunchConfig {
                    grid_dim: (
                        (rows as u32).div_ceil(per_block),
                        slots as u32,
                        matrices as u32,
                    ),
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            (
                Matvec::MatVec8(_) | Matvec::MatVec8Many(_) | Matvec::MatVec8Qkv(_),
                Work::MatVec { rows, cols },
            ) => {
                let per_block = mv8_rows_per_block(cols) as u32;
                Ok(blocks(((rows as u32).div_ceil(per_block), 1), MV8_THREADS))
            }
            // Groups of MV8_MAX_TOKENS rows of x along y.
            (Matvec::MatVec8N(_), Work::Matrix { rows, n }) => {
                let groups = n.div_ceil(MV8_MAX_TOKENS);
                if groups > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{n} rows exceed one mv8n launch"
                    ))));
                }
                Ok(blocks(
                    ((rows as u32).div_ceil(MV8N_ROWS), groups as u32),
                    MV8_THREADS,
                ))
            }
            // 16 weight rows a block.
            (Matvec::Mmq(_), Work::Matrix { rows, .. }) => {
                Ok(blocks(((rows as u32).div_ceil(16), 1), MMQ_WARPS * 32))
            }
            _ => return None,
        })
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            Matvec::MatVec1(_) => pushed::<MatVec1Call>(),
            Matvec::MatVecExperts(_) => pushed::<ExpertMatVecArgs>(),
            Matvec::MatVec8Experts(_) => pushed::<ExpertMatVec8Call>(),
            Matvec::MatVec8(_) => pushed::<MatVec8Call>(),
            Matvec::MatVec8Many(_) => pushed::<MatVec8ManyCall>(),
            Matvec::MatVec8Qkv(_) => pushed::<MatVec8QkvCall>(),
            Matvec::MatVec8N(_) => pushed::<MatVec8NCall>(),
            Matvec::Mmq(_) => pushed::<MmqCall>(),
        }
    }
    /// `mmq_q8_0` is written out for its one format; the others are
    /// `FOR_EACH_TYPE` instances.
    #[cfg(test)]
    fn definition(self) -> (&'static str, Vec<String>) {
        use crate::backend::cuda::kernels::launch::type_suffix;
        let sym = self.symbol();
        match self {
            Matvec::Mmq(_) => ("", vec![format!("void {sym}("), format!(")\n    {sym}(")]),
            _ => {
                let t = self.format().expect("a per-format kernel");
                let prefix = sym.strip_suffix(&type_suffix(t)).unwrap_or(&sym);
                ("", vec![format!("{prefix}##name(")])
            }
        }
    }
}
