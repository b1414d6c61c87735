//! The command line's shape: the orchestrator's flags at the top level, or
//! one of the subcommands.

use clap::{Parser, Subcommand};

use crate::cli::{bench, config, generate};

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
