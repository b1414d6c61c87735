//! `harness bench`: the report and the regression gate of `ci/gpu-bench`.
//!
//! `ci/gpu-bench` writes one JSON line per measured figure (see [`record`]):
//! the worker's and llama.cpp's medians, extremes and samples of the same
//! figure on the same file. [`report`] turns a run into a markdown table of
//! worker ÷ llama.cpp ratios with SVG charts ([`svg`]) and keeps a history of
//! runs; [`gate`] compares a run with a stored baseline and fails when a figure
//! is worse by more than its measured run-to-run spread.

pub mod gate;
pub mod record;
pub mod report;
pub mod svg;

pub use record::{baseline_path, slug};

#[cfg(test)]
mod tests;

/// `harness bench report|gate`.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCmd {
    /// Markdown table of worker ÷ llama.cpp ratios and SVG charts for one run.
    Report(report::ReportArgs),
    /// Compare a run with a baseline; exit 1 when a figure regressed beyond its spread.
    Gate(gate::GateArgs),
}

/// Runs a `harness bench` subcommand; returns the process exit code.
pub fn run(cmd: BenchCmd) -> anyhow::Result<i32> {
    match cmd {
        BenchCmd::Report(args) => report::run(&args).map(|()| 0),
        BenchCmd::Gate(args) => gate::run(&args),
    }
}
