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
    /// Compile one kernel unit (named by its cache stem) for compute
    /// capability ARCH (e.g. 90) and write its CUBIN to stdout: the worker
    /// runs itself this way to compile units in parallel processes.
    #[command(hide = true)]
    CompileUnit { stem: String, arch: String },
}

/// Parses the command line and runs the chosen mode.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Ok(exe) = std::env::current_exe() {
        crate::backend::cuda::compile_in_processes(exe);
    }
    match cli.command {
        Some(Command::CompileUnit { stem, arch }) => compile_unit(&stem, &arch),
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

/// The `compile-unit` command: CUBIN on stdout, NVRTC's log on stderr.
fn compile_unit(stem: &str, arch: &str) -> ExitCode {
    use crate::backend::cuda::{compile_here, Unit};
    use std::io::Write;
    let Some(unit) = Unit::from_stem(stem) else {
        eprintln!("error: no kernel unit is named {stem:?}");
        return ExitCode::FAILURE;
    };
    let arch = match arch.parse::<i32>() {
        Ok(a) if a >= 10 => (a / 10, a % 10),
        _ => {
            eprintln!("error: {arch:?} is not a compute capability such as 90");
            return ExitCode::FAILURE;
        }
    };
    match compile_here(unit, arch) {
        Ok(cubin) => match std::io::stdout().lock().write_all(&cubin) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: writing the CUBIN: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
