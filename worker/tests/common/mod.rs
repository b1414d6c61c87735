//! Shared helpers for tests that spawn the real `worker-orcd` binary: the
//! reference model's path, a spawned worker with its JSON log, and a raw SSE
//! reader that checks each frame.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

pub const WORKER_ID: &str = "0b8b5a63-3c0d-4f6e-9a51-2d6a3f1f9c11";
/// SmolLM2's ChatML, as the golden prompts are written.
pub const HAIKU_PROMPT: &str =
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n";

/// A raw prompt the model keeps continuing greedily (no EOS for hundreds of
/// tokens): the long job that tests cancel, disconnect or shut down.
pub const COUNTING_PROMPT: &str = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,";

/// Tests that run the model take turns, also across processes (nextest runs
/// each test in its own): the CPU backend wants both cores, and the timing
/// checks assume it has them. An exclusive `flock` on a file in the temp dir,
/// released when the worker (and its file) is dropped.
pub struct ModelTurn {
    _file: std::fs::File,
    _local: MutexGuard<'static, ()>,
}

static LOCAL_TURN: Mutex<()> = Mutex::new(());

pub fn model_turn() -> ModelTurn {
    use std::os::unix::io::AsRawFd;
    let local = LOCAL_TURN.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join("worker-orcd-model-tests.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap();
    // Blocks until no other test process holds the lock.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {}", path.display());
    ModelTurn {
        _file: file,
        _local: local,
    }
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The reference model, or `None` (with a note) when it has not been
/// fetched; under `CI` its absence fails the test.
pub fn reference_model() -> Option<PathBuf> {
    let path = workspace_root().join(".models/smollm2-135m-instruct-q4_1.gguf");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{} is missing; run ci/fetch-model", path.display());
    }
    eprintln!(
        "note: {} is missing (run ci/fetch-model); skipping",
        path.display()
    );
    None
}

pub fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_worker-orcd")
}

/// The worker's command on the CPU backend for `model`, listening on `port`
/// once ready; callers add flags and how its output is taken.
pub fn cpu_worker(model: &std::path::Path, port: u16) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args([
        "--worker-id",
        WORKER_ID,
        "--gpu-device",
        "0",
        "--backend",
        "cpu",
    ])
    .arg("--model")
    .arg(model)
    .args(["--port", &port.to_string()]);
    cmd
}

/// Collects a child's stderr lines on a thread.
fn collect_lines(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let stderr = child.stderr.take().expect("stderr is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

/// A running worker on the reference model with `--backend cpu`.
pub struct Worker {
    child: Child,
    pub port: u16,
    pub base: String,
    pub client: reqwest::Client,
    lines: Arc<Mutex<Vec<String>>>,
    _turn: ModelTurn,
}

impl Worker {
    /// Starts a worker with the required flags plus `extra`, and waits for
    /// `ready`. `None` when the model is absent (outside CI).
    pub async fn start(extra: &[&str]) -> Option<Worker> {
        Worker::start_with_env(extra, &[]).await
    }

    pub async fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Option<Worker> {
        let model = reference_model()?;
        Some(Worker::start_model(&model, extra, env).await)
    }

    /// Starts a worker on `model` (a derived file, say) and waits for `ready`.
    pub async fn start_model(
        model: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Worker {
        let turn = model_turn();
        let port = free_port();
        let mut cmd = cpu_worker(model, port);
        cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn worker-orcd");
        let lines = collect_lines(&mut child);
        let worker = Worker {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            lines,
            _turn: turn,
        };
        worker
            .wait_for_event("ready", Duration::from_secs(60))
            .await;
        worker
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Raw stderr lines so far.
    pub fn raw_log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The JSON log records so far.
    pub fn log(&self) -> Vec<Value> {
        self.raw_log()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn events(&self, event: &str) -> Vec<Value> {
        self.log()
            .into_iter()
            .filter(|r| r["event"] == event)
            .collect()
    }

    pub async fn wait_for_event(&self, event: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.events(event).into_iter().next() {
                return r;
            }
            if Instant::now() > deadline {
                panic!(
                    "no {event} record within {timeout:?}; log:\n{}",
                    self.raw_log().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    pub async fn health(&self) -> Value {
        self.get("/health").await.json().await.unwrap()
    }

    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }

    /// Starts a job and returns its stream (after checking the 200).
    pub async fn execute(&self, body: Value) -> SseReader {
        let resp = self.post("/execute", body).await;
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        SseReader::new(resp)
    }

    /// Runs a job to its end.
    pub async fn run(&self, body: Value) -> Vec<Frame> {
        self.execute(body).await.all().await
    }

    pub fn terminate(&self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// Waits for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "worker still running after {timeout:?}; log:\n{}",
                    self.raw_log().join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("worker log:\n{}", self.raw_log().join("\n"));
        }
    }
}

/// Runs the binary to its exit with `args`; returns the status and stderr.
pub fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let out = Command::new(binary())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run worker-orcd");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One SSE frame: its `event:` name, parsed `data:` JSON, and arrival time.
#[derive(Debug, Clone)]
pub struct Frame {
    pub event: String,
    pub data: Value,
    pub at: Instant,
}

/// Reads SSE frames, checking that each is exactly one `event:` line and
/// one JSON `data:` line. Keep-alive comments are skipped.
pub struct SseReader {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buf: Vec<u8>,
}

impl SseReader {
    pub fn new(resp: reqwest::Response) -> Self {
        SseReader {
            body: Box::pin(resp.bytes_stream()),
            buf: Vec::new(),
        }
    }

    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = std::str::from_utf8(&raw).expect("frames are UTF-8");
                let lines: Vec<&str> = text
                    .trim_end_matches('\n')
                    .lines()
                    .filter(|l| !l.starts_with(':'))
                    .collect();
                if lines.is_empty() {
                    continue;
                }
                assert_eq!(lines.len(), 2, "one event line and one data line: {text:?}");
                let event = lines[0]
                    .strip_prefix("event: ")
                    .unwrap_or_else(|| panic!("{text:?}"));
                let data = lines[1]
                    .strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("{text:?}"));
                let data: Value =
                    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {text:?}"));
                return Some(Frame {
                    event: event.into(),
                    data,
                    at: Instant::now(),
                });
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => panic!("stream failed: {e}"),
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "trailing bytes {:?}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return None;
                }
            }
        }
    }

    /// Reads `n` token frames (after `started`, when it comes first).
    pub async fn tokens(&mut self, n: usize) -> Vec<Frame> {
        let mut out = Vec::new();
        while out.len() < n {
            let f = self.next().await.expect("stream ended early");
            match f.event.as_str() {
                "started" => continue,
                "token" => out.push(f),
                other => panic!("expected a token, got {other}: {f:?}"),
            }
        }
        out
    }

    pub async fn all(mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(f) = self.next().await {
            frames.push(f);
        }
        frames
    }
}

/// Checks `started (token)* (end|error)`, consecutive `i`, and `tokens_out`.
pub fn check_grammar(frames: &[Frame]) {
    assert!(frames.len() >= 2, "{frames:?}");
    assert_eq!(frames[0].event, "started", "{frames:?}");
    let last = frames.last().unwrap();
    assert!(last.event == "end" || last.event == "error", "{frames:?}");
    let tokens = &frames[1..frames.len() - 1];
    for (n, f) in tokens.iter().enumerate() {
        assert_eq!(f.event, "token", "{frames:?}");
        assert_eq!(f.data["i"], n);
        assert!(f.data["t"].is_string() && f.data["id"].is_u64());
    }
    if last.event == "end" {
        assert_eq!(last.data["tokens_out"], tokens.len());
        assert!(last.data["decode_time_ms"].is_u64() && last.data["first_token_ms"].is_u64());
    } else {
        let e = last.data.as_object().unwrap();
        assert!(
            e["code"].is_string() && e["message"].is_string() && e["retriable"].is_boolean(),
            "{e:?}"
        );
    }
}

pub fn token_ids(frames: &[Frame]) -> Vec<u64> {
    frames
        .iter()
        .filter(|f| f.event == "token")
        .map(|f| f.data["id"].as_u64().unwrap())
        .collect()
}

pub fn text(frames: &[Frame]) -> String {
    frames
        .iter()
        .filter(|f| f.event == "token")
        .map(|f| f.data["t"].as_str().unwrap())
        .collect()
}

/// A metric's value in OpenMetrics text (`name` includes any labels).
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A greedy job of `max_tokens` tokens on the haiku prompt.
pub fn job(id: &str, max_tokens: u64) -> Value {
    serde_json::json!({"job_id": id, "prompt": HAIKU_PROMPT, "max_tokens": max_tokens, "temperature": 0})
}

/// A 2048-token greedy job that does not end by itself for many seconds.
pub fn long_job(id: &str) -> Value {
    serde_json::json!({"job_id": id, "prompt": COUNTING_PROMPT, "max_tokens": 2048, "temperature": 0})
}
