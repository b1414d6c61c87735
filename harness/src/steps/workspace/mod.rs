//! Proofs that live in the source tree: the worker's unit tests (`unit_tests`),
//! source and dependency checks (`source`), commands in the workspace
//! (`commands`), nested runs of this harness (`nested`), and the documents'
//! quick start and examples run as written (`examples`).

pub mod commands;
pub mod examples;
pub mod nested;
pub mod source;
pub mod unit_tests;
