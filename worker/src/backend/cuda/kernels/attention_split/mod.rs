//! The kernels of `cuda/attention_split.cu`: decode attention over a long
//! context split into chunks across blocks (scalar instances per head-size
//! class and group, tensor-core ones for heads of 64 and 128 dims), the
//! merge of the chunks (`attention_combine`), their batched decode step's
//! forms (`rows.rs`), and the bounds of how a context is split (the
//! split itself: `select.rs`).
//!
//! `family.rs`: the family's enum (`AttentionSplit`), the split kernels and their
//! merge; `rows.rs` import it. This file, above them all,
//! wires them in and holds the family's `Family` impl (which names their
//! argument structs, for the C types each kernel's launcher pushes).

mod family;
mod rows;

pub use family::*;
pub use rows::*;

#[cfg(test)]
use crate::backend::cuda::kernels::launch::pushed;
use crate::backend::cuda::kernels::launch::{blocks, Family, Work};
use crate::backend::cuda::source::{Module, ATSC_THREADS, ATS_THREADS};
use crate::backend::BackendError;
use cudarc::driver::LaunchConfig;

impl Family for AttentionSplit {
    const MODULE: Module = Module::AttentionSplit;

    fn all() -> Vec<AttentionSplit> {
        use self::AttentionSplit::*;
        let scalar = [(1, 4), (1, 8), (2, 4), (2, 8), (4, 4), (4, 8)];
        let mut v = vec![Tc(1), Tc(2)];
        v.extend(scalar.map(|(p, g)| Scalar(p, g)));
        v.extend([Combine, TcRows(1), TcRows(2)]);
        v.extend(scalar.map(|(p, g)| ScalarRows(p, g)));
        v.push(CombineRows);
        v
    }
    fn symbol(self) -> String {
        match self {
            AttentionSplit::Scalar(pairs, group) => {
                format!("attention_split_{}_g{group}", 64 * pairs as usize)
            }
            AttentionSplit::Tc(pairs) => {
                format!("attention_split_tc_{}", 64 * pairs as usize)
            }
            AttentionSplit::Combine => "attention_combine".into(),
            AttentionSplit::ScalarRows(pairs, group) => {
                format!("attention_split_{}_g{group}_rows", 64 * pairs as usize)
            }
            AttentionSplit::TcRows(pairs) => {
                format!("attention_split_tc_{}_rows", 64 * pairs as usize)
            }
            AttentionSplit::CombineRows => "attention_combine_rows".into(),
        }
    }
    fn part(self) -> Option<u8> {
        match self {
            AttentionSplit::Scalar(_, group) | AttentionSplit::ScalarRows(_, group) => {
                Some(1 + u8::from(group > 4))
            }
            AttentionSplit::Tc(_)
            | AttentionSplit::Combine
            | AttentionSplit::TcRows(_)
            | AttentionSplit::CombineRows => Some(0),
        }
    }
    fn prefers_shared_memory(self) -> bool {
        matches!(
            self,
            AttentionSplit::Scalar(..)
                | AttentionSplit::Tc(_)
                | AttentionSplit::ScalarRows(..)
                | AttentionSplit::TcRows(_)
        )
    }
    fn head_pairs(self) -> Option<u8> {
        match self {
            AttentionSplit::Scalar(p, _)
            | AttentionSplit::Tc(p)
            | AttentionSplit::ScalarRows(p, _)
            | AttentionSplit::TcRows(p) => Some(p),
            AttentionSplit::Combine | AttentionSplit::CombineRows => None,
        }
    }
    fn config(self, work: Work) -> Option<Result<LaunchConfig, BackendError>> {
        use self::AttentionSplit::*;
        Some(match (self, work) {
            (Scalar(..) | Tc(_), Work::Chunks { n_head_kv, nsplit }) => {
                if nsplit > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{nsplit} context chunks exceed one launch"
                    ))));
                }
                Ok(blocks((n_head_kv as u32, nsplit as u32), ATS_THREADS))
            }
            (
                ScalarRows(..) | TcRows(_),
                Work::RowChunks {
                    n_head_kv,
                    nsplit,
                    rows,
                },
            ) => {
                if nsplit > 65535 || rows > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{nsplit} context chunks of {rows} rows exceed one launch"
                    ))));
                }
                Ok(LaunchConfig {
                    grid_dim: (n_head_kv as u32, nsplit as u32, rows as u32),
                    block_dim: (ATS_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            // One block per (head, row).
            (CombineRows, Work::Heads { n, n_head }) => {
                if n > 65535 {
                    return Some(Err(BackendError::Shape(format!(
                        "{n} rows exceed one launch"
                    ))));
                }
                Ok(blocks((n_head as u32, n as u32), ATSC_THREADS))
            }
            // One block per head.
            (Combine, Work::Rows { rows, .. }) => Ok(blocks((rows as u32, 1), ATSC_THREADS)),
            _ => return None,
        })
    }
    #[cfg(test)]
    fn pushed(self) -> Vec<String> {
        match self {
            AttentionSplit::Scalar(..) | AttentionSplit::Tc(_) => pushed::<AttentionSplitArgs>(),
            AttentionSplit::Combine => pushed::<AttentionCombineArgs>(),
            AttentionSplit::ScalarRows(..) | AttentionSplit::TcRows(_) => {
                pushed::<AttentionSplitRowsArgs>()
            }
            AttentionSplit::CombineRows => pushed::<AttentionCombineRowsArgs>(),
        }
    }
    /// The instances are made by `ATTENTION_SPLIT*` macros whose kernel is
    /// `NAME(`; the rows instances' macro comes after the others'.
    #[cfg(test)]
    fn definition(self) -> (&'static str, Vec<String>) {
        match self {
            AttentionSplit::Scalar(..) | AttentionSplit::Tc(_) => ("", vec![" NAME(".into()]),
            AttentionSplit::ScalarRows(..) | AttentionSplit::TcRows(_) => {
                ("#define ATTENTION_SPLIT_ROWS(", vec![" NAME(".into()])
            }
            AttentionSplit::Combine | AttentionSplit::CombineRows => {
                let sym = self.symbol();
                ("", vec![format!("void {sym}("), format!(")\n    {sym}(")])
            }
        }
    }
}
