//! The kernels of `cuda/matvec.cu`: a matrix product for one row of x
//! (decode) or a few (`mv1_*`; on the integer units from x split by
//! `quantize_x8`: `mv8_*`, `mv8m_*`, `mv8q_*`, `mv8n_*`), short prompts on
//! the integer tensor cores (`mmq_*`), and the chosen experts' products of
//! a mixture of experts (`mv1e_*`, `mv8e_*`, in `experts.rs`); which of them
//! a product takes is chosen in `select.rs` (`Kernels::mv8_choice`), on
//! the bounds here.
//!
//! `family.rs`: `mv1_*`, the family's enum with its `Family` impl, and the bounds its
//! kernels are chosen by. The other files import it and it imports none
//! of them (but in tests, for the C types each kernel's launcher pushes);
//! this file only wires them in.

mod experts;
mod family;
mod mv8;

pub use experts::*;
pub use family::*;
pub use mv8::*;
