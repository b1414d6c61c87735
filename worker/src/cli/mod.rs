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
pub mod config;
pub mod generate;
pub mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  worker-orcd serve model.gguf --backend cpu     serve a GGUF file on the CPU at port 8080
  worker-orcd serve model.gguf                   serve it from GPU 0 (see `worker-orcd serve --help`)
  worker-orcd --worker-id $(uuidgen) --model /abs/path/model.gguf --gpu-device 0 --port 8081
                                                 the orchestrator's form: every flag required
  worker-orcd generate --model model.gguf --backend cpu --chat 'Hello' --max-tokens 16";

/// Single-GPU GGUF inference worker with an HTTP/SSE API.
#[derive(Parser, Debug)]
#[command(
    name = "worker-orcd",
    version,
    args_conflicts_with_subcommands = true,
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: config::ServeArgs,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve a GGUF file over HTTP, started by hand: `worker-orcd serve MODEL.gguf`.
    Serve(Box<config::ServeCommand>),
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
    let cli = Cli::parse_from(config::preprocess_args(std::env::args_os()));
    if let Ok(exe) = std::env::current_exe() {
        crate::backend::cuda::compile_in_processes(exe);
    }
    match cli.command {
        Some(Command::CompileUnit { stem, arch }) => compile_unit(&stem, &arch),
        Some(Command::Generate(args)) => report(generate::run(args)),
        Some(Command::Bench(args)) => report(bench::run(args)),
        Some(Command::Serve(cmd)) => {
            let (args, fallbacks) = (*cmd).into_args();
            serve::run(args, &fallbacks)
        }
        None => serve::run(cli.serve, &config::Fallbacks::default()),
    }
}

/// Prints a failed command's error on one line, once.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-separated, leaving out a cause whose text
/// the line already holds (an error that shows its source in its own
/// message would otherwise print it twice).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
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

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("no usable GPU; use --backend cpu")]
    struct NoGpu;

    /// A wrapper that shows its source in its own text, as `#[error("{0}")]`
    /// with `#[from]` does.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Shows(#[from] NoGpu);

    #[test]
    fn a_cause_already_shown_is_printed_once() {
        let e = anyhow::Error::from(Shows(NoGpu)).context("loading m.gguf");
        assert_eq!(
            super::one_line(&e),
            "loading m.gguf: no usable GPU; use --backend cpu"
        );
    }
}
