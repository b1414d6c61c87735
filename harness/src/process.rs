//! The worker under test as a child process: its command line, its JSON log
//! (tracing records on stdout and stderr, each kept with its arrival time),
//! readiness, signals and exit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::client::Client;

/// One log line of the worker.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub at: Duration,
    pub stderr: bool,
    pub text: String,
    pub json: Option<Value>,
}

impl LogLine {
    /// The record's `event` field, wherever tracing put it.
    pub fn event(&self) -> Option<&str> {
        self.field("event").and_then(Value::as_str)
    }

    /// A field of a tracing JSON record: top level, `fields`, `span` or any of `spans`.
    pub fn field(&self, key: &str) -> Option<&Value> {
        let j = self.json.as_ref()?;
        j.get(key)
            .or_else(|| j.get("fields").and_then(|f| f.get(key)))
            .or_else(|| j.get("span").and_then(|f| f.get(key)))
            .or_else(|| {
                j.get("spans")
                    .and_then(Value::as_array)
                    .and_then(|s| s.iter().rev().find_map(|sp| sp.get(key)))
            })
    }

    /// The record's own timestamp (wall clock), when it has one.
    pub fn timestamp(&self) -> Option<chrono::DateTime<chrono::FixedOffset>> {
        self.field("timestamp")
            .and_then(Value::as_str)
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
    }

    /// Field as a number, also when logged as a string.
    pub fn number(&self, key: &str) -> Option<f64> {
        match self.field(key)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        }
    }
}

/// How to start one worker.
#[derive(Debug, Clone)]
pub struct Launch {
    pub bin: PathBuf,
    /// `--flag value` pairs (value `None` for a bare flag) in order.
    pub args: Vec<(String, Option<String>)>,
    pub env: Vec<(String, String)>,
    pub host: String,
    pub port: u16,
    /// The working folder (`None`: the suite's).
    pub cwd: Option<PathBuf>,
    /// Started as the leader of a process group of its own, so that a
    /// signal can reach every process of a command line, as Ctrl-C does in
    /// a terminal ([`Worker::signal_group`]).
    pub own_group: bool,
}

impl Launch {
    /// The standard command line of `bin` serving `model` on `backend`:
    /// every required flag, a fresh worker id, a free port on 127.0.0.1.
    pub fn standard(bin: &Path, model: &Path, backend: &str) -> Result<Self> {
        let port = free_port()?;
        let mut l = Launch {
            bin: bin.to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            host: "127.0.0.1".into(),
            port,
            cwd: None,
            own_group: false,
        };
        l.set("--worker-id", Some(&uuid_v4()));
        l.set("--model", Some(&model.display().to_string()));
        l.set("--gpu-device", Some("0"));
        l.set("--port", Some(&port.to_string()));
        l.set("--host", Some("127.0.0.1"));
        l.set("--backend", Some(backend));
        Ok(l)
    }

    /// Sets a flag, replacing an earlier value of the same flag.
    pub fn set(&mut self, flag: &str, value: Option<&str>) {
        let value = value.map(str::to_owned);
        match self.args.iter_mut().find(|(f, _)| f == flag) {
            Some(slot) => slot.1 = value,
            None => self.args.push((flag.to_owned(), value)),
        }
        if flag == "--port" {
            if let Some(p) = self
                .args
                .iter()
                .find(|(f, _)| f == "--port")
                .and_then(|(_, v)| v.as_deref())
                .and_then(|v| v.parse().ok())
            {
                self.port = p;
            }
        }
    }

    pub fn remove(&mut self, flag: &str) {
        self.args.retain(|(f, _)| f != flag);
    }

    pub fn get(&self, flag: &str) -> Option<&str> {
        self.args
            .iter()
            .find(|(f, _)| f == flag)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Applies a flag string such as `--max-tokens-out 5 --port 80`.
    pub fn apply(&mut self, flags: &str) -> Result<()> {
        let words = shell_words(flags)?;
        let mut i = 0;
        while i < words.len() {
            let f = &words[i];
            if !f.starts_with("--") {
                return Err(anyhow!("expected a --flag, got {f:?} in {flags:?}"));
            }
            let value = words.get(i + 1).filter(|v| !v.starts_with("--"));
            self.set(f, value.map(String::as_str));
            i += if value.is_some() { 2 } else { 1 };
        }
        Ok(())
    }

    pub fn argv(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (f, val) in &self.args {
            v.push(f.clone());
            if let Some(val) = val {
                v.push(val.clone());
            }
        }
        v
    }

    pub fn command_line(&self) -> String {
        std::iter::once(self.bin.display().to_string())
            .chain(self.argv())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Splits flags on whitespace, honouring double quotes.
pub fn shell_words(s: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if quoted {
        return Err(anyhow!("unbalanced quote in {s:?}"));
    }
    if any {
        out.push(cur);
    }
    Ok(out)
}

/// A running (or exited) worker.
pub struct Worker {
    pub launch: Launch,
    child: Child,
    pub pid: u32,
    pub spawned: Instant,
    pub spawned_wall: chrono::DateTime<chrono::Utc>,
    log: Arc<Mutex<Vec<LogLine>>>,
    exit: Option<std::process::ExitStatus>,
    exited_at: Option<Instant>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("pid", &self.pid)
            .field("cmd", &self.launch.command_line())
            .finish()
    }
}

impl Worker {
    pub fn spawn(launch: Launch) -> Result<Self> {
        let mut cmd = Command::new(&launch.bin);
        cmd.args(launch.argv())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in &launch.env {
            cmd.env(k, v);
        }
        if let Some(dir) = &launch.cwd {
            cmd.current_dir(dir);
        }
        if launch.own_group {
            cmd.process_group(0);
        }
        let spawned = Instant::now();
        let spawned_wall = chrono::Utc::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", launch.command_line()))?;
        let pid = child.id().unwrap_or(0);
        let log = Arc::new(Mutex::new(Vec::new()));
        if let Some(out) = child.stdout.take() {
            pump(out, false, log.clone(), spawned);
        }
        if let Some(err) = child.stderr.take() {
            pump(err, true, log.clone(), spawned);
        }
        Ok(Self {
            launch,
            child,
            pid,
            spawned,
            spawned_wall,
            log,
            exit: None,
            exited_at: None,
        })
    }

    pub fn client(&self) -> Client {
        Client::new(&self.launch.host, self.launch.port)
    }

    pub fn log(&self) -> Vec<LogLine> {
        self.log.lock().unwrap().clone()
    }

    pub fn log_text(&self) -> String {
        self.log()
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Log records whose `event` is `name`.
    pub fn events(&self, name: &str) -> Vec<LogLine> {
        self.log()
            .into_iter()
            .filter(|l| l.event() == Some(name))
            .collect()
    }

    /// Waits until a record satisfies `pred`.
    pub async fn wait_log(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&LogLine) -> bool,
    ) -> Result<LogLine> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.log.lock().unwrap().iter().find(|l| pred(l)) {
                return Ok(l.clone());
            }
            if self.try_exit()?.is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await; // let the pipes drain
                return self.log().into_iter().find(|l| pred(l)).ok_or_else(|| {
                    anyhow!(
                        "worker exited ({:?}) before the awaited log record",
                        self.exit
                    )
                });
            }
            if Instant::now() > deadline {
                return Err(anyhow!("awaited log record not seen within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Polls `/health` until it answers 200; fails early if the process exits.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<Value> {
        let client = self.client();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_exit()? {
                return Err(anyhow!("worker exited with {st} before it was healthy"));
            }
            if let Ok(h) = client.health().await {
                return Ok(h);
            }
            if Instant::now() > deadline {
                return Err(anyhow!("worker not healthy within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn try_exit(&mut self) -> Result<Option<std::process::ExitStatus>> {
        if self.exit.is_none() {
            if let Some(st) = self.child.try_wait()? {
                self.exit = Some(st);
                self.exited_at = Some(Instant::now());
            }
        }
        Ok(self.exit)
    }

    /// Waits for the process to exit; `None` if it is still running after `timeout`.
    pub async fn wait_exit(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<std::process::ExitStatus>> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(st) => {
                self.exit = Some(st?);
                self.exited_at = Some(Instant::now());
                tokio::time::sleep(Duration::from_millis(50)).await; // let the pipes drain
                Ok(self.exit)
            }
            Err(_) => Ok(None),
        }
    }

    pub fn exited_at(&self) -> Option<Instant> {
        self.exited_at
    }

    pub fn signal(&self, sig: i32) -> Result<()> {
        self.kill(self.pid as libc::pid_t, sig)
    }

    /// Sends `sig` to the worker's whole process group (it must have been
    /// launched with `own_group`).
    pub fn signal_group(&self, sig: i32) -> Result<()> {
        if !self.launch.own_group {
            return Err(anyhow!("the worker was not started in a group of its own"));
        }
        self.kill(-(self.pid as libc::pid_t), sig)
    }

    /// kill(2) on `target`: our child's pid, or the group it leads (negative).
    fn kill(&self, target: libc::pid_t, sig: i32) -> Result<()> {
        if self.exit.is_some() {
            return Err(anyhow!("worker already exited"));
        }
        // SAFETY: kill(2) on our own child or the group it leads; no memory is shared.
        let rc = unsafe { libc::kill(target, sig) };
        if rc != 0 {
            return Err(anyhow!(
                "kill({target}, {sig}) failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Stops the worker (its whole group, when it has one of its own):
    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if self.try_exit().ok().flatten().is_none() {
            let _ = match self.launch.own_group {
                true => self.signal_group(libc::SIGTERM),
                false => self.signal(libc::SIGTERM),
            };
            if self.wait_exit(grace).await.ok().flatten().is_none() {
                if self.launch.own_group {
                    let _ = self.signal_group(libc::SIGKILL);
                }
                let _ = self.child.start_kill();
                let _ = self.wait_exit(Duration::from_secs(5)).await;
            }
        }
        self.exit
    }

    pub fn model_path(&self) -> Option<&Path> {
        self.launch.get("--model").map(Path::new)
    }
}

/// Reads one of the child's pipes line by line into the shared log.
fn pump(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    stderr: bool,
    sink: Arc<Mutex<Vec<LogLine>>>,
    spawned: Instant,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(text)) = lines.next_line().await {
            let json = serde_json::from_str::<Value>(&text)
                .ok()
                .filter(Value::is_object);
            sink.lock().unwrap().push(LogLine {
                at: spawned.elapsed(),
                stderr,
                text,
                json,
            });
        }
    });
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

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A free TCP port on 127.0.0.1 (bound and released; a race with other
/// processes is possible but unlikely).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Exit code of a status; signals map to 128 + signal as a shell shows them.
pub fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> Launch {
        Launch {
            bin: "w".into(),
            args: vec![
                ("--port".into(), Some("1".into())),
                ("--backend".into(), Some("cpu".into())),
            ],
            env: vec![],
            host: "127.0.0.1".into(),
            port: 1,
            cwd: None,
            own_group: false,
        }
    }

    #[test]
    fn flags_replace_defaults_and_append_new_ones() {
        let mut l = launch();
        l.apply("--port 2 --max-tokens-out 5 --verbose --config \"a b.yaml\"")
            .unwrap();
        assert_eq!(
            l.argv(),
            [
                "--port",
                "2",
                "--backend",
                "cpu",
                "--max-tokens-out",
                "5",
                "--verbose",
                "--config",
                "a b.yaml"
            ]
        );
        assert_eq!(l.port, 2);
        l.remove("--backend");
        assert_eq!(l.get("--backend"), None);
        assert!(l.apply("oops").is_err());
    }

    #[test]
    fn log_fields_are_found_in_tracing_layouts() {
        let line = |s: &str| LogLine {
            at: Duration::ZERO,
            stderr: false,
            text: s.into(),
            json: serde_json::from_str(s).ok(),
        };
        let flat = line(r#"{"event":"ready","worker_id":"w"}"#);
        let nested = line(
            r#"{"timestamp":"2025-01-01T00:00:00Z","fields":{"event":"ready"},"spans":[{"worker_id":"w"}]}"#,
        );
        for l in [flat, nested] {
            assert_eq!(l.event(), Some("ready"));
            assert_eq!(l.field("worker_id").and_then(Value::as_str), Some("w"));
        }
        assert!(line(r#"{"timestamp":"2025-01-01T00:00:00Z"}"#)
            .timestamp()
            .is_some());
    }
}
