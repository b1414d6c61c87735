//! (being written)
pub mod generate;
pub mod stop;
