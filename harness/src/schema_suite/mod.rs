//! `harness schema-suite`: strict structured output over a corpus of real
//! JSON Schemas (issue 43). It starts the worker binary, asks
//! `/v1/chat/completions` for an instance of every schema under a strict
//! `response_format`, once per seed at temperature 1, several requests in
//! flight, and checks every complete output with the `jsonschema` crate,
//! independent of the worker's llguidance. Outputs are counted valid,
//! invalid (a bug: each is printed with its schema and seed), truncated
//! (cut off at `max_tokens`, so not checked) or refused (a 400, with the
//! worker's reason: a schema it cannot enforce). No Python and no network:
//! it runs as it is on the GPU machine.

mod ask;
mod corpus;
mod report;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use futures::StreamExt as _;
use serde_json::{json, Value};

use crate::client::Client;
use crate::process::{tail, Launch, Worker};
use crate::suite::{find_workspace, worker_and_model};
use ask::{Outcome, Sampling, Verdict};
use corpus::{Entry, Filter};
use report::Report;

/// Options of `harness schema-suite`, which are its command-line flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Worker binary (default: $WORKER_BIN, else the newest target/{release,debug}/worker-orcd).
    #[arg(long)]
    pub worker: Option<PathBuf>,
    /// Backend the worker runs on.
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub backend: String,
    /// Model file (default: .models/smollm2-135m-instruct-q4_1.gguf).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The corpus: one schema a file, a folder a category (default: <workspace>/testdata/schemas).
    #[arg(long)]
    pub schemas: Option<PathBuf>,
    /// Only the schemas whose `category/name` contains one of these (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// At most this many schemas of each category, in name order.
    #[arg(long)]
    pub per_category: Option<usize>,
    /// Seeds each schema is sampled with (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub seeds: Vec<u64>,
    /// `max_tokens` of every request; an output cut off there is counted truncated.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// The worker's `--parallel`, and the requests the suite keeps in flight.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// More worker flags, after the suite's own (which they replace), e.g. "--ctx-size 4096".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub worker_flags: String,
    /// Write the report as JSON here, and as Markdown beside it (.md).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Seconds to wait for the worker to become healthy.
    #[arg(long, default_value_t = 300)]
    pub start_timeout_s: u64,
    /// Seconds one request may take, its time in the queue included.
    #[arg(long, default_value_t = 1800)]
    pub request_timeout_s: u64,
    /// Workspace root (default: found from the current directory).
    #[arg(long)]
    pub workspace: Option<PathBuf>,
}

/// Runs the suite; returns the process exit code (1: an invalid output, an
/// error, or no output checked at all).
pub async fn run(opts: Options) -> Result<i32> {
    let workspace = find_workspace(opts.workspace.as_deref());
    let (worker_bin, model) =
        worker_and_model(&workspace, opts.worker.as_deref(), opts.model.as_deref())?;
    let root = opts
        .schemas
        .clone()
        .unwrap_or_else(|| workspace.join("testdata/schemas"));
    let filter = Filter {
        only: opts.only.clone(),
        per_category: opts.per_category,
    };
    let entries = corpus::load(&root, &filter)?;
    println!(
        "{} schemas x {} seeds from {} on {} ({}), {} in flight",
        entries.len(),
        opts.seeds.len(),
        root.display(),
        model.display(),
        opts.backend,
        opts.parallel
    );
    let mut worker = start(&opts, &worker_bin, &model).await?;
    let started = Instant::now();
    let outcomes = run_all(&worker.client(), &entries, &opts).await;
    let wall = started.elapsed().as_secs_f64();
    worker.stop(Duration::from_secs(10)).await;
    let outcomes = outcomes?;
    let report = Report::new(settings(&opts, &worker_bin, &model), outcomes, wall);
    print!("{}", report.table());
    print_lists(&report);
    if let Some(path) = &opts.report {
        report.write(path)?;
        println!("report: {} (and .md)", path.display());
    }
    Ok(i32::from(report.failed()))
}

/// The worker on `model`, healthy, running `--parallel` jobs at once.
async fn start(opts: &Options, bin: &Path, model: &Path) -> Result<Worker> {
    let parallel = opts.parallel.max(1);
    let mut launch = Launch::standard(bin, model, &opts.backend)?;
    launch.set("--parallel", Some(&parallel.to_string()));
    // Twice what is in flight: a request sent as the one before it answers
    // finds its slot still held for an instant.
    launch.set("--queue-depth", Some(&(2 * parallel).to_string()));
    launch.apply(&opts.worker_flags)?;
    let mut worker = Worker::spawn(launch)?;
    let timeout = Duration::from_secs(opts.start_timeout_s);
    if let Err(e) = worker.wait_healthy(timeout).await {
        let log = tail(&worker.log_text(), 40);
        let cmd = worker.launch.command_line();
        worker.stop(Duration::from_secs(5)).await;
        return Err(anyhow!("{e}\ncommand: {cmd}\nworker log (tail):\n{log}"));
    }
    Ok(worker)
}

/// Every (schema, seed) request, `--parallel` at a time, each printed as it ends.
async fn run_all(client: &Client, entries: &[Entry], opts: &Options) -> Result<Vec<Outcome>> {
    let sampling = Sampling {
        model: client.served_model().await?,
        temperature: opts.temperature,
        max_tokens: opts.max_tokens,
        timeout: Duration::from_secs(opts.request_timeout_s),
    };
    let asks: Vec<(&Entry, u64)> = entries
        .iter()
        .flat_map(|e| opts.seeds.iter().map(move |&s| (e, s)))
        .collect();
    let total = asks.len();
    let sampling = &sampling;
    let mut stream = futures::stream::iter(asks)
        .map(|(e, seed)| ask::ask(client, e, seed, sampling))
        .buffer_unordered(opts.parallel.max(1));
    let mut outcomes = Vec::with_capacity(total);
    while let Some(o) = stream.next().await {
        outcomes.push(o);
        println!(
            "[{}/{total}] {}",
            outcomes.len(),
            line(outcomes.last().unwrap())
        );
    }
    Ok(outcomes)
}

/// One request's progress line.
fn line(o: &Outcome) -> String {
    let what = match &o.verdict {
        Verdict::Valid => "valid".to_string(),
        Verdict::Invalid(e) => format!("INVALID ({} errors)", e.len()),
        Verdict::Truncated => "truncated at max_tokens".to_string(),
        Verdict::Refused(r) => format!("refused: {r}"),
        Verdict::Error(e) => format!("ERROR: {e}"),
    };
    format!(
        "{} seed {}: {what} ({} tokens, {:.1} s)",
        o.schema, o.seed, o.tokens, o.seconds
    )
}

/// The refused schemas and every invalid output or error, after the table.
fn print_lists(r: &Report) {
    if !r.refused.is_empty() {
        println!("\nrefused ({}):", r.refused.len());
        r.refused
            .iter()
            .for_each(|x| println!("  {}: {}", x.schema, x.reason));
    }
    for o in r.invalid.iter().chain(&r.errors) {
        println!("\n{}\n  output: {}", line(o), o.output);
        if let Verdict::Invalid(errors) = &o.verdict {
            errors.iter().for_each(|e| println!("  - {e}"));
        }
    }
}

fn settings(opts: &Options, worker: &Path, model: &Path) -> Value {
    json!({
        "worker": worker,
        "model": model,
        "backend": opts.backend,
        "seeds": opts.seeds,
        "temperature": opts.temperature,
        "max_tokens": opts.max_tokens,
        "parallel": opts.parallel,
        "worker_flags": opts.worker_flags,
        "only": opts.only,
        "per_category": opts.per_category,
    })
}
