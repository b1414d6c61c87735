//! worker-orcd: one process, one GGUF model, one GPU, served over HTTP/SSE.
//!
//! A request flows in a straight line through the modules below:
//! `server` validates it, `engine` queues and runs it on its own thread over a
//! `backend` (CPU reference or CUDA), `sampling` picks each token and `server`
//! streams it. `load` reads the file and constructs the backend from `gguf`,
//! `quant`, `tokenizer` and `model`.
//!
//! Imports run one way (checked by `ci/check-layers`): cli → server → engine →
//! load → backend → model → tokenizer, sampling, quant, gguf; `telemetry`
//! serves engine and server and imports none of them.

pub mod backend;
pub mod cli;
pub mod constraint;
pub mod engine;
pub mod gguf;
pub mod load;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod server;
pub mod telemetry;
pub mod tokenizer;
