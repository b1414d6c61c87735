//! The cucumber `World`: one scenario's state, held in parts by concern.
//!
//! - [`Process`]: the worker(s) under test, their launch options and logs;
//! - [`Stream`]: jobs posted to `/execute`, their transcripts and plain replies;
//! - [`Probes`]: `/health` and `/metrics` readings kept for later comparison;
//! - [`Budgets`]: timing samples compared with budgets.yaml;
//! - [`Parity`]: golden, haiku and cross-backend evidence;
//! - [`Workspace`]: commands run in the source tree (cargo, nested harness runs);
//! - [`OpenAiRuns`]: answers of the OpenAI-compatible routes, whole and streamed.
//!
//! A scenario starts the worker under test on a free port with a chosen model and
//! backend, drives it over HTTP/SSE and signals, and the runner's `after` hook
//! prints the worker's log when the scenario fails and stops it. The World and its
//! parts never import from `steps/`: the steps import the World.

mod budgets;
mod config;
mod openai;
mod parity;
mod probes;
mod process;
mod stream;
mod workspace;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::client::{Client, Transcript};
use crate::process::{Launch, Worker};

pub use budgets::Budgets;
pub use config::SuiteConfig;
pub use openai::{Answer, Choices, OpenAiRuns, ToolRun};
pub use parity::{Haiku, Parity};
pub use probes::Probes;
pub use process::{tail, uuid_v4, Poll, Process};
pub use stream::{conformance, job_id, Stream, JOB_TIMEOUT};
pub use workspace::{CommandOutcome, Workspace};

static CONFIG: OnceLock<Arc<SuiteConfig>> = OnceLock::new();

pub fn install_config(cfg: SuiteConfig) {
    let _ = CONFIG.set(Arc::new(cfg));
}

pub fn config() -> Arc<SuiteConfig> {
    CONFIG
        .get()
        .expect("suite config installed before the run")
        .clone()
}

#[derive(Debug, cucumber::World)]
#[world(init = Self::new)]
pub struct TestWorld {
    pub cfg: Arc<SuiteConfig>,
    /// `file:line name`, set by the runner's `before` hook; names the evidence.
    pub scenario: String,
    pub began: Instant,
    /// This scenario's folder for `{scratch}` files, removed after it.
    pub scratch: PathBuf,
    pub process: Process,
    pub stream: Stream,
    pub probes: Probes,
    pub budgets: Budgets,
    pub parity: Parity,
    pub workspace: Workspace,
    pub openai: OpenAiRuns,
    /// The prefix cache scenario's shared prefix and number of jobs.
    pub shared_prefix: Option<(String, usize)>,
}

impl TestWorld {
    fn new() -> Self {
        let cfg = config();
        let scratch = cfg.fixtures_dir.join("scenarios").join(format!(
            "{}-{}",
            std::process::id(),
            next_serial()
        ));
        Self {
            cfg,
            scenario: String::new(),
            began: Instant::now(),
            scratch,
            process: Process::default(),
            stream: Stream::default(),
            probes: Probes::default(),
            budgets: Budgets::default(),
            parity: Parity::default(),
            workspace: Workspace::default(),
            openai: Default::default(),
            shared_prefix: None,
        }
    }

    /// Replaces `{model}`, `{scratch}`, `{busy_port}`, `{gpu_count}` and
    /// `{chars:N}` ([`filler`]).
    pub fn expand(&mut self, s: &str) -> Result<String> {
        let mut out = expand_chars(s)?
            .replace("{model}", &self.cfg.model.display().to_string())
            .replace("{gpu_count}", &self.cfg.gpu_count.to_string());
        if out.contains("{scratch}") {
            std::fs::create_dir_all(&self.scratch)?;
            out = out.replace("{scratch}", &self.scratch.display().to_string());
        }
        if out.contains("{busy_port}") {
            out = out.replace("{busy_port}", &self.process.busy_port()?.to_string());
        }
        Ok(out)
    }

    /// The model fixture of that name (see `crate::fixtures`); `reference` is the reference model.
    pub fn fixture(&self, name: &str) -> Result<PathBuf> {
        crate::fixtures::materialize(
            name,
            &self.cfg.model,
            &self.cfg.golden_dir,
            &self.cfg.fixtures_dir,
        )
    }

    /// The standard command line on `model` with the backend under test.
    pub fn launch(&self, model: &Path) -> Result<Launch> {
        self.process.launch(&self.cfg, model, &self.cfg.backend)
    }

    /// The standard command line on `model` with `backend`.
    pub fn launch_for(&self, model: &Path, backend: &str) -> Result<Launch> {
        self.process.launch(&self.cfg, model, backend)
    }

    /// Spawns the worker and waits for `/health`.
    pub async fn start_ready(&mut self, launch: Launch) -> Result<()> {
        self.process
            .start_ready(launch, self.cfg.start_timeout)
            .await
    }

    /// Starts a separate worker with `backend` on `model`, waiting until it is healthy.
    pub async fn start_other(&self, model: &Path, backend: &str) -> Result<Worker> {
        let mut other = Worker::spawn(self.launch_for(model, backend)?)?;
        other.wait_healthy(self.cfg.start_timeout).await?;
        Ok(other)
    }

    pub fn client(&self) -> Result<Client> {
        self.process.client()
    }

    /// Posts a job; a stream becomes a live job, a refusal becomes the plain reply.
    pub async fn post_job(&mut self, body: Value, headers: &[(&str, &str)]) -> Result<()> {
        let client = self.process.client()?;
        let outcome = client.execute_with_headers(&body, headers).await?;
        self.stream.file(&self.scenario, body, outcome);
        Ok(())
    }

    /// Waits for a live job's end and files its transcript.
    pub async fn finish_job(&mut self, id: &str, timeout: Duration) -> Result<&Transcript> {
        self.stream.finish(&self.scenario, id, timeout).await
    }

    /// Posts a job and waits for its end.
    pub async fn run_job(&mut self, body: Value) -> Result<&Transcript> {
        let id = job_id(&body);
        self.post_job(body, &[]).await?;
        self.finish_job(&id, JOB_TIMEOUT).await
    }

    pub async fn finish_all(&mut self, timeout: Duration) -> Result<()> {
        self.stream.finish_all(&self.scenario, timeout).await
    }

    /// Lets a still-running job finish (up to a minute) so checks can read its transcript.
    pub async fn settle(&mut self, id: &str) -> Result<&Transcript> {
        self.stream.settle(&self.scenario, id).await
    }

    /// Stops every worker of the scenario (SIGTERM, then SIGKILL) and drops live jobs.
    pub async fn stop_all(&mut self) {
        self.stream.disconnect_all();
        self.process.stop_all().await;
    }
}

fn next_serial() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

/// Reads a JSON file under the workspace.
pub fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// `n` dashes: a prompt long in characters and short in tokens (about 64
/// characters a token on the reference model, so that a 40,000-character
/// prompt costs the CPU backend some 650 tokens to read; a run of spaces is
/// as short, but the model answers it with nothing).
pub fn filler(n: usize) -> String {
    "-".repeat(n)
}

/// Replaces each `{chars:N}` with [`filler`]`(N)`.
fn expand_chars(s: &str) -> Result<String> {
    const OPEN: &str = "{chars:";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        let tail = &rest[at + OPEN.len()..];
        let end = tail
            .find('}')
            .with_context(|| format!("unclosed {OPEN} in {s}"))?;
        let n: usize = tail[..end]
            .parse()
            .with_context(|| format!("{OPEN}{}}} is not a count", &tail[..end]))?;
        out.push_str(&filler(n));
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_version_4() {
        let u = super::uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!("89ab".contains(&u[19..20]));
    }

    #[test]
    fn chars_placeholders_become_filler_of_that_length() {
        let out = super::expand_chars(r#"{"a": "{chars:5}", "b": "{chars:300}!"}"#).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["a"], "-----");
        let b = v["b"].as_str().unwrap();
        assert_eq!(b.chars().count(), 301);
        assert!(b.ends_with("--!"));
        assert!(super::expand_chars("{chars:x}").is_err());
        assert!(super::expand_chars("{chars:3").is_err());
    }
}
