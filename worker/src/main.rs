use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "worker-orcd", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine once without HTTP.
    Generate(worker_orcd::cli::generate::GenerateArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Generate(args) => worker_orcd::cli::generate::run(args),
    }
}
