//! Proofs that live in the source tree: the worker's unit tests (`unit_tests`),
//! source and dependency checks (`source`), commands in the workspace
//! (`commands`), and nested runs of this harness (`nested`).

pub mod commands;
pub mod nested;
pub mod source;
pub mod unit_tests;
