//! Command-line entry points. Without a subcommand the worker serves
//! (`serve`); `generate` runs the engine once without HTTP.
//!
//! Exit codes: 0 after a clean run or graceful shutdown; 1 when start-up
//! fails (a flag that fails its check, a model that does not load, a port
//! that cannot be bound); 2 for usage errors (unknown or malformed flags,
//! missing required flags).

pub mod bench;
pub mod config;
pub mod generate;
pub mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Single-GPU GGUF inference worker with an HTTP/SSE API.
#[derive(Parser, Debug)]
#[command(name = "worker-orcd", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: config::ServeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the engine once without HTTP and print each token.
    Generate(generate::GenerateArgs),
    /// Measure prefill and decode tokens/s without HTTP (llama-bench's figures, JSON lines).
    Bench(bench::BenchArgs),
}

/// Parses the command line and runs the chosen mode.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Generate(args)) => match generate::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Bench(args)) => match bench::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
        None => serve::run(cli.serve),
    }
}
