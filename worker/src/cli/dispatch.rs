//! The process's entry: parses the command line, runs the chosen mode, and
//! turns its outcome into the exit code.

use std::process::ExitCode;

use clap::Parser;

use crate::cli::command::{Cli, Command};
use crate::cli::{bench, config, generate, serve};

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
