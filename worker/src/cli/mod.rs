//! Command-line entry points. Without a subcommand the worker serves on the
//! orchestrator's flags (M0-W-1100: `--worker-id`, `--model`, `--gpu-device`,
//! `--port`); `serve MODEL` serves for a person (short flags, defaults);
//! `generate` runs the engine once without HTTP; `bench` measures it.
//!
//! Exit codes: 0 after a clean run or graceful shutdown; 1 when start-up
//! fails (a flag that fails its check, a model that does not load, a port
//! that cannot be bound); 2 for usage errors (unknown or malformed flags,
//! missing required flags).

pub mod bench;
mod command;
pub mod config;
mod dispatch;
pub mod generate;
pub mod serve;

pub use command::{Cli, Command};
pub use dispatch::{main, one_line};
