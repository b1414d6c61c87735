//! Conformance suite for worker-orcd: Gherkin features (`features/`) run by
//! cucumber-rs against a worker binary driven only over HTTP/SSE and signals,
//! with the proof bundle, requirement matrix, budgets and parity comparer.
//!
//! The library half (client, events, stats, budgets, parity) is reusable by
//! benches; `suite` and `steps` are the runner; `synth` writes the synthetic
//! models (also used by the worker's own tests); `schema_suite` checks
//! structured output over a corpus of real JSON Schemas.

pub mod bench;
pub mod budgets;
pub mod catalogue;
pub mod client;
pub mod events;
pub mod fixtures;
pub mod gguf;
pub mod golden;
pub mod matrix;
pub mod parity;
pub mod process;
pub mod proof;
pub mod schema_suite;
pub mod stats;
pub mod steps;
pub mod suite;
pub mod synth;
pub mod world;
