//! The `worker-orcd` binary: see `worker_orcd::cli`.

fn main() -> std::process::ExitCode {
    worker_orcd::cli::main()
}
