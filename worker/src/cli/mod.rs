//! Command-line entry points.

pub mod generate;
