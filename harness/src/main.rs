//! `harness`: the conformance suite runner, coverage check and parity-log comparer.
//!
//! - `harness suite [--worker BIN] [--backend cpu|cuda] [--model PATH] [--tags EXPR] [--proof-dir DIR]`
//! - `harness coverage [--requirements PATH]`
//! - `harness parity LOG_A LOG_B [--atol X] [--rtol X] [--logit-tol X]`
//! - `harness synth-model --preset NAME --out FILE [--format TYPE] [--reference PATH]
//!   [--spm-reference PATH] [--seed N]`: a random-weight model of a real shape (see
//!   `harness::synth`), used by the `synthetic-<preset>` fixtures
//! - `harness schema-suite [--worker BIN] [--backend cpu|cuda] [--model PATH] [--seeds 1,2,3]
//!   [--parallel N] [--max-tokens N] [--report FILE]`: strict `response_format` outputs over
//!   `testdata/schemas`, each checked by the `jsonschema` crate (see `harness::schema_suite`)
//! - `harness bench report|gate ...`: the side-by-side report and regression gate of `ci/gpu-bench`

use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "harness", version, about = "Conformance suite for worker-orcd")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Report and regression gate over ci/gpu-bench's JSON lines.
    #[command(subcommand)]
    Bench(harness::bench::BenchCmd),
    /// Check coverage, run the scenarios against a worker binary, write the proof bundle.
    Suite(harness::suite::Options),
    /// Strict JSON Schema outputs over the schema corpus, each checked; exit 1 on an invalid one.
    SchemaSuite(harness::schema_suite::Options),
    /// Fail when a requirement has no scenario or a scenario carries an unknown ID.
    Coverage {
        #[arg(long)]
        requirements: Option<PathBuf>,
        #[arg(long)]
        workspace: Option<PathBuf>,
    },
    /// Compare two parity logs position by position; exit 1 on divergence beyond tolerance.
    Parity {
        a: PathBuf,
        b: PathBuf,
        #[arg(long, default_value_t = harness::parity::Tolerance::default().atol)]
        atol: f64,
        #[arg(long, default_value_t = harness::parity::Tolerance::default().rtol)]
        rtol: f64,
        #[arg(long, default_value_t = harness::parity::Tolerance::default().logit_tol)]
        logit_tol: f64,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a random-weight GGUF model of a named shape, with the reference's tokenizer.
    SynthModel {
        /// The shape to write (harness/README.md gives each preset's); every preset is listed.
        #[arg(long, value_parser = PossibleValuesParser::new(harness::synth::PRESETS.iter().map(|p| p.name)))]
        preset: String,
        /// Output file (written as FILE.part, renamed when complete).
        #[arg(long)]
        out: PathBuf,
        /// Matrix format: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K or MXFP4
        /// (default: the preset's; norms and biases are always F32).
        #[arg(long)]
        format: Option<String>,
        /// Model whose tokenizer.* metadata is copied (default: .models/smollm2-135m-instruct-q4_1.gguf).
        #[arg(long)]
        reference: Option<PathBuf>,
        /// SentencePiece model whose pieces the phi3 presets take, cut to their 32064 tokens
        /// (every special and byte token, every single character, then the best merged pieces)
        /// (default: .models/gemma-3-270m-q4_k_m.gguf, from `ci/fetch-model gemma3`).
        #[arg(long)]
        spm_reference: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Generator threads (default: all cores); the file does not depend on it.
        #[arg(long)]
        threads: Option<usize>,
    },
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn main() -> anyhow::Result<()> {
    let code = match Cli::parse().command {
        Cmd::Bench(cmd) => harness::bench::run(cmd)?,
        Cmd::Suite(opts) => runtime()?.block_on(harness::suite::run(opts))?,
        Cmd::SchemaSuite(opts) => runtime()?.block_on(harness::schema_suite::run(opts))?,
        Cmd::Coverage {
            requirements,
            workspace,
        } => {
            let ws = harness::suite::find_workspace(workspace.as_deref());
            let req = harness::suite::requirements_path(&ws, requirements.as_deref());
            harness::suite::coverage(&ws, &req)?;
            0
        }
        Cmd::Parity {
            a,
            b,
            atol,
            rtol,
            logit_tol,
            json,
        } => {
            let tol = harness::parity::Tolerance {
                atol,
                rtol,
                logit_tol,
            };
            let r = harness::parity::compare(
                &harness::parity::read_log(&a)?,
                &harness::parity::read_log(&b)?,
                tol,
            );
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", r.human());
            }
            i32::from(r.diverged())
        }
        Cmd::SynthModel {
            preset,
            out,
            format,
            reference,
            spm_reference,
            seed,
            threads,
        } => {
            use anyhow::anyhow;
            use harness::synth;
            let preset = synth::preset(&preset)?;
            let format = match format {
                None => preset.default_format,
                Some(f) => synth::Format::from_name(&f).ok_or_else(|| {
                    let known: Vec<_> = synth::Format::ALL.iter().map(|f| f.name()).collect();
                    anyhow!("unknown format {f:?}; known: {}", known.join(", "))
                })?,
            };
            let workspace = harness::suite::find_workspace(None);
            let reference = reference.unwrap_or_else(|| harness::suite::default_model(&workspace));
            let spm_reference = spm_reference
                .unwrap_or_else(|| workspace.join(".models").join(synth::SPM_REFERENCE_FILE));
            let reference = synth::tokenizer_source(preset, &reference, &spm_reference);
            let threads = threads
                .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
                .unwrap_or(1);
            let opts = synth::Options {
                preset,
                format,
                seed,
                threads,
            };
            let w = synth::write_file(&opts, reference, &out)?;
            println!(
                "{}: {} {} seed {seed}, {} tensors, {} bytes in {:.1} s ({threads} threads)",
                out.display(),
                preset.name,
                format.name(),
                w.tensors,
                w.bytes,
                w.seconds
            );
            0
        }
    };
    std::process::exit(code);
}
