//! The process part of the World: the worker(s) under test, how they are launched,
//! and what was watched while one started (`/health` polls, memory).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use super::config::SuiteConfig;
use crate::client::Client;
pub use crate::process::{tail, uuid_v4};
use crate::process::{Launch, Worker};

/// One `/health` poll while the worker started.
#[derive(Debug, Clone)]
pub struct Poll {
    pub sent_wall: chrono::DateTime<chrono::Utc>,
    pub refused: bool,
    pub status: Option<String>,
}

#[derive(Debug, Default)]
pub struct Process {
    /// Extra environment of the workers started from now on.
    pub env: Vec<(String, String)>,
    pub worker: Option<Worker>,
    pub second: Option<Worker>,
    polls: Arc<Mutex<Vec<Poll>>>,
    poll_stop: Arc<AtomicBool>,
    /// A listener holding `{busy_port}` taken for the whole scenario.
    busy: Option<std::net::TcpListener>,
    /// Peak anonymous resident memory while the worker loaded, when sampled.
    pub rss_peak_kib: Option<u64>,
}

impl Process {
    /// The standard command line: every required flag, a free port, `backend`.
    pub fn launch(
        &self,
        cfg: &SuiteConfig,
        model: &std::path::Path,
        backend: &str,
    ) -> Result<Launch> {
        let mut l = Launch::standard(&cfg.worker_bin, model, backend)?;
        l.env = self.env.clone();
        Ok(l)
    }

    /// A port some other socket already listens on.
    pub fn busy_port(&mut self) -> Result<u16> {
        if self.busy.is_none() {
            self.busy = Some(std::net::TcpListener::bind("127.0.0.1:0")?);
        }
        Ok(self.busy.as_ref().unwrap().local_addr()?.port())
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

    /// Spawns and waits for `/health`; on failure the error carries the log's tail.
    pub async fn start_ready(&mut self, launch: Launch, timeout: Duration) -> Result<()> {
        self.spawn(launch)?;
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

    pub fn second(&mut self) -> Result<&mut Worker> {
        self.second
            .as_mut()
            .ok_or_else(|| anyhow!("no second worker"))
    }

    pub fn client(&self) -> Result<Client> {
        self.worker
            .as_ref()
            .map(Worker::client)
            .ok_or_else(|| anyhow!("no worker started in this scenario"))
    }

    /// The worker's output (stdout and stderr), lower-cased for "names"/"mentions" checks.
    pub fn output(&mut self) -> Result<String> {
        Ok(self.worker()?.log_text().to_lowercase())
    }

    /// The backend the worker was launched with (`cuda` when the flag was left out).
    pub fn backend(&mut self) -> Result<String> {
        Ok(self
            .worker()?
            .launch
            .get("--backend")
            .unwrap_or("cuda")
            .to_owned())
    }

    /// Polls `/health` in the background until the worker has answered three
    /// times, `stop_polling` is called, or 120 s pass.
    pub fn poll_health(&mut self) -> Result<()> {
        let client = self.client()?;
        let polls = self.polls.clone();
        polls.lock().unwrap().clear();
        let stop = self.poll_stop.clone();
        stop.store(false, Ordering::SeqCst);
        tokio::spawn(async move {
            let began = Instant::now();
            let mut answered = 0;
            while answered < 3
                && !stop.load(Ordering::SeqCst)
                && began.elapsed() < Duration::from_secs(120)
            {
                let (poll, ok) = poll_once(&client).await;
                answered += usize::from(ok);
                polls.lock().unwrap().push(poll);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        Ok(())
    }

    pub fn stop_polling(&self) {
        self.poll_stop.store(true, Ordering::SeqCst);
    }

    /// Stops the background poller and returns its polls so far.
    pub fn polls(&self) -> Vec<Poll> {
        self.stop_polling();
        self.polls.lock().unwrap().clone()
    }

    /// Stops the workers (SIGTERM, then SIGKILL after 10 s).
    pub async fn stop_all(&mut self) {
        self.stop_polling();
        for w in [self.worker.as_mut(), self.second.as_mut()]
            .into_iter()
            .flatten()
        {
            w.stop(Duration::from_secs(10)).await;
        }
    }
}

/// One poll, and whether the worker answered it (with any status).
async fn poll_once(client: &Client) -> (Poll, bool) {
    let sent_wall = chrono::Utc::now();
    match client.get("/health").await {
        Ok(r) => {
            let status = serde_json::from_str::<Value>(&r.body)
                .ok()
                .and_then(|v| v.get("status").and_then(Value::as_str).map(str::to_owned));
            let poll = Poll {
                sent_wall,
                refused: false,
                status: status.or(Some(format!("HTTP {}", r.status))),
            };
            (poll, true)
        }
        Err(e) => {
            let refused = e
                .downcast_ref::<reqwest::Error>()
                .is_some_and(reqwest::Error::is_connect);
            let poll = Poll {
                sent_wall,
                refused,
                status: (!refused).then(|| format!("{e:#}")),
            };
            (poll, false)
        }
    }
}
