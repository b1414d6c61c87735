//! The cucumber `World`: one scenario's worker process(es), jobs and evidence.
//!
//! A scenario starts the worker under test on a free port with a chosen model and
//! backend, drives it over HTTP/SSE and signals, and the runner's `after` hook
//! prints the worker's log when the scenario fails and stops it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::budgets::BudgetFile;
use crate::client::{Client, Execute, LiveJob, Reply, Transcript};
use crate::process::{free_port, Launch, Worker};
use crate::proof::Recorder;

/// What the whole run was started with.
#[derive(Debug)]
pub struct SuiteConfig {
    pub workspace: PathBuf,
    pub worker_bin: PathBuf,
    pub backend: String,
    /// The reference model (absolute).
    pub model: PathBuf,
    /// A GPU is present and the backend under test is `cuda`.
    pub gpu: bool,
    pub gpu_count: u32,
    pub budgets: BudgetFile,
    pub budgets_path: PathBuf,
    pub fixtures_dir: PathBuf,
    pub golden_dir: PathBuf,
    pub requirements: PathBuf,
    pub start_timeout: Duration,
}

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

/// A listener standing in for `--callback-url`, counting connections.
#[derive(Debug)]
pub struct Callback {
    pub url: String,
    pub hits: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Callback {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Callback {
    pub async fn start() -> Result<Self> {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/callback", l.local_addr()?);
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((_sock, _)) = l.accept().await {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Ok(Self { url, hits, task })
    }
}

/// One `/health` poll while the worker started.
#[derive(Debug, Clone)]
pub struct Poll {
    pub sent_wall: chrono::DateTime<chrono::Utc>,
    pub refused: bool,
    pub status: Option<String>,
}

/// A command the scenario ran (unit tests, nested harness runs, cargo).
#[derive(Debug, Clone)]
pub struct CommandOutcome {
    pub line: String,
    pub code: Option<i32>,
    pub output: String,
    pub proof_dir: Option<PathBuf>,
}

#[derive(Debug, cucumber::World)]
#[world(init = Self::new)]
pub struct TestWorld {
    pub cfg: Arc<SuiteConfig>,
    pub scenario: String,
    pub began: Instant,
    pub scratch: PathBuf,
    pub env: Vec<(String, String)>,
    pub worker: Option<Worker>,
    pub second: Option<Worker>,
    pub live: BTreeMap<String, LiveJob>,
    pub done: BTreeMap<String, Transcript>,
    pub requests: BTreeMap<String, Value>,
    /// Job ids in the order they were posted.
    pub posted: Vec<String>,
    pub reply: Option<Reply>,
    pub refused: Vec<(String, Reply)>,
    pub cancel_replies: Vec<Reply>,
    pub cancel_sent: BTreeMap<String, Instant>,
    pub remembered_health: Option<Value>,
    pub scrapes: Vec<String>,
    pub polls: Arc<std::sync::Mutex<Vec<Poll>>>,
    pub poll_stop: Arc<std::sync::atomic::AtomicBool>,
    pub repeat_ids: Vec<String>,
    pub callback: Option<Callback>,
    pub busy: Option<std::net::TcpListener>,
    pub samples: BTreeMap<String, Vec<f64>>,
    pub command: Option<CommandOutcome>,
    pub hostile: Vec<(String, u16, Reply)>,
    pub golden_runs: Vec<(usize, Transcript)>,
    pub haiku: Option<crate::steps::golden::Haiku>,
    pub rss_peak_kib: Option<u64>,
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
            env: Vec::new(),
            worker: None,
            second: None,
            live: BTreeMap::new(),
            done: BTreeMap::new(),
            requests: BTreeMap::new(),
            posted: Vec::new(),
            reply: None,
            refused: Vec::new(),
            cancel_replies: Vec::new(),
            cancel_sent: BTreeMap::new(),
            remembered_health: None,
            scrapes: Vec::new(),
            polls: Default::default(),
            poll_stop: Default::default(),
            repeat_ids: Vec::new(),
            callback: None,
            busy: None,
            samples: BTreeMap::new(),
            command: None,
            hostile: Vec::new(),
            golden_runs: Vec::new(),
            haiku: None,
            rss_peak_kib: None,
        }
    }

    /// Replaces `{model}`, `{scratch}`, `{busy_port}`, `{gpu_count}` and `{callback_url}`.
    pub fn expand(&mut self, s: &str) -> Result<String> {
        let mut out = s
            .replace("{model}", &self.cfg.model.display().to_string())
            .replace("{gpu_count}", &self.cfg.gpu_count.to_string());
        if out.contains("{scratch}") {
            std::fs::create_dir_all(&self.scratch)?;
            out = out.replace("{scratch}", &self.scratch.display().to_string());
        }
        if out.contains("{busy_port}") {
            if self.busy.is_none() {
                self.busy = Some(std::net::TcpListener::bind("127.0.0.1:0")?);
            }
            let port = self.busy.as_ref().unwrap().local_addr()?.port();
            out = out.replace("{busy_port}", &port.to_string());
        }
        if out.contains("{callback_url}") {
            let url = self
                .callback
                .as_ref()
                .map(|c| c.url.clone())
                .ok_or_else(|| anyhow!("no callback listener in this scenario"))?;
            out = out.replace("{callback_url}", &url);
        }
        Ok(out)
    }

    pub fn fixture(&self, name: &str) -> Result<PathBuf> {
        crate::fixtures::materialize(
            name,
            &self.cfg.model,
            &self.cfg.golden_dir,
            &self.cfg.fixtures_dir,
        )
    }

    /// The standard command line: every required flag, a free port, the backend under test.
    pub fn launch_for(&self, model: &Path, backend: &str) -> Result<Launch> {
        let port = free_port()?;
        let mut l = Launch {
            bin: self.cfg.worker_bin.clone(),
            args: Vec::new(),
            env: self.env.clone(),
            host: "127.0.0.1".into(),
            port,
        };
        l.set("--worker-id", Some(&uuid_v4()));
        l.set("--model", Some(&model.display().to_string()));
        l.set("--gpu-device", Some("0"));
        l.set("--port", Some(&port.to_string()));
        l.set("--host", Some("127.0.0.1"));
        l.set("--backend", Some(backend));
        Ok(l)
    }

    pub fn launch(&self, model: &Path) -> Result<Launch> {
        self.launch_for(model, &self.cfg.backend.clone())
    }

    /// Spawns the worker (not waiting for readiness).
    pub fn spawn(&mut self, launch: Launch) -> Result<()> {
        if let Some(w) = &mut self.worker {
            if w.try_exit()?.is_none() {
                bail!("a worker is already running in this scenario; stop it first");
            }
        }
        self.worker = Some(Worker::spawn(launch)?);
        Ok(())
    }

    /// Spawns and waits for `/health`.
    pub async fn start_ready(&mut self, launch: Launch) -> Result<()> {
        self.spawn(launch)?;
        let timeout = self.cfg.start_timeout;
        let w = self.worker.as_mut().unwrap();
        if let Err(e) = w.wait_healthy(timeout).await {
            let tail = tail(&w.log_text(), 40);
            bail!(
                "{e}\ncommand: {}\nworker log (tail):\n{tail}",
                w.launch.command_line()
            );
        }
        Ok(())
    }

    pub fn worker(&mut self) -> Result<&mut Worker> {
        self.worker
            .as_mut()
            .ok_or_else(|| anyhow!("no worker started in this scenario"))
    }

    pub fn client(&self) -> Result<Client> {
        self.worker
            .as_ref()
            .map(Worker::client)
            .ok_or_else(|| anyhow!("no worker started in this scenario"))
    }

    /// Posts a job; a stream becomes a live job, a refusal becomes `reply`.
    pub async fn post_job(&mut self, body: Value, headers: &[(&str, &str)]) -> Result<()> {
        let id = body
            .get("job_id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let client = self.client()?;
        self.requests.insert(id.clone(), body.clone());
        self.posted.push(id.clone());
        match client.execute_with_headers(&body, headers).await? {
            Execute::Stream(job) => {
                self.live.insert(id, job);
            }
            Execute::Refused(r) => {
                Recorder::refusal(&self.scenario, &id, r.status, &r.body);
                self.refused.push((id, r.clone()));
                self.reply = Some(r);
            }
        }
        Ok(())
    }

    /// Waits for a live job's end and files its transcript.
    pub async fn finish_job(&mut self, id: &str, timeout: Duration) -> Result<&Transcript> {
        let job = self.live.remove(id).ok_or_else(|| {
            anyhow!(
                "no running job {id:?} (refused? {:?})",
                self.refused
                    .iter()
                    .find(|(j, _)| j == id)
                    .map(|(_, r)| (r.status, &r.body))
            )
        })?;
        let t = job.finish(timeout).await?;
        let req = self.requests.get(id).cloned().unwrap_or(Value::Null);
        Recorder::transcript(&self.scenario, &req, &t);
        crate::steps::stream::register(&self.scenario, &t);
        self.done.insert(id.to_owned(), t);
        Ok(&self.done[id])
    }

    pub async fn finish_all(&mut self, timeout: Duration) -> Result<()> {
        let ids: Vec<String> = self
            .posted
            .iter()
            .filter(|id| self.live.contains_key(*id))
            .cloned()
            .collect();
        for id in ids {
            self.finish_job(&id, timeout).await?;
        }
        Ok(())
    }

    /// Lets a still-running job finish (up to a minute) so checks can read its transcript.
    pub async fn settle(&mut self, id: &str) -> Result<()> {
        if self.live.contains_key(id) {
            self.finish_job(id, Duration::from_secs(60)).await?;
        }
        Ok(())
    }

    pub fn transcript(&self, id: &str) -> Result<&Transcript> {
        self.done.get(id).ok_or_else(|| {
            anyhow!(
                "job {id:?} has not finished (running: {}, refused: {})",
                self.live.contains_key(id),
                self.refused.iter().any(|(j, _)| j == id)
            )
        })
    }

    /// Stops every worker of the scenario (SIGTERM, then SIGKILL) and drops live jobs.
    pub async fn stop_all(&mut self) {
        for (_, job) in std::mem::take(&mut self.live) {
            job.disconnect();
        }
        for w in [self.worker.as_mut(), self.second.as_mut()]
            .into_iter()
            .flatten()
        {
            w.stop(Duration::from_secs(10)).await;
        }
    }
}

fn next_serial() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

/// A random RFC 4122 version-4 UUID.
pub fn uuid_v4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

pub fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Reads a JSON file under the workspace.
pub fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
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
}
