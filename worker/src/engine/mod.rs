//! (being written)
pub mod stop;
