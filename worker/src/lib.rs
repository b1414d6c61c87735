//! worker-orcd: one process, one GGUF model, one GPU, served over HTTP/SSE.
//!
//! A request flows in a straight line through the modules below:
//! `server` validates it, `engine` queues and runs it on its own thread over a
//! `backend` (CPU reference or CUDA), `sampling` picks each token and `server`
//! streams it. `gguf`, `quant`, `tokenizer` and `model` are what loading needs.

pub mod backend;
pub mod cli;
pub mod engine;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod sampling;
pub mod server;
pub mod telemetry;
pub mod tokenizer;
