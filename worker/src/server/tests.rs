//! In-process handler tests (M0-W-1811): the real router, engine thread and
//! queue on a loopback port, over a [`ScriptedBackend`] and the byte-level
//! test tokenizer. Shared set-up and SSE reading here; the cases by concern
//! in `tests/`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use super::*;
use crate::backend::{Backend, BackendError, KvLayout, KvType, MemoryUse};
use crate::constraint::Compiler;
use crate::engine::parity::{ParitySender, ParityWriter};
use crate::engine::runner::EngineParts;
use crate::engine::testing::{byte_tokenizer, ScriptProbe, ScriptedBackend, BYTE_VOCAB_SIZE};
use crate::engine::{Engine, EngineConfig, EngineStatus, Outcome};
use crate::model::ModelInfo;
use crate::telemetry::metrics::Metrics;

mod constraint;
mod device;
mod jobs;
mod lifecycle;
mod openai;
mod stream;

struct Opts {
    residency_check: Option<Duration>,
    queue_depth: usize,
    timeout: Duration,
    grace: Duration,
    limits: Limits,
    parity: Option<ParitySender>,
    /// The byte tokenizer unless given.
    tokenizer: Option<Arc<crate::tokenizer::Tokenizer>>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            residency_check: None,
            queue_depth: 4,
            timeout: Duration::from_secs(60),
            grace: Duration::from_millis(200),
            limits: Limits::new(1024, BYTE_VOCAB_SIZE, 4096),
            parity: None,
            tokenizer: None,
        }
    }
}

struct Harness {
    base: String,
    client: reqwest::Client,
    state: AppState,
    probe: Arc<ScriptProbe>,
    served: tokio::task::JoinHandle<std::io::Result<ServeOutcome>>,
}

async fn start(backend: ScriptedBackend, opts: Opts) -> Harness {
    let probe = backend.probe();
    let device = backend.device().clone();
    let tokenizer = opts.tokenizer.clone().unwrap_or_else(byte_tokenizer);
    let metrics = Arc::new(Metrics::new(
        crate::telemetry::metrics::InfoLabels {
            model: "/models/scripted.gguf".into(),
            quant_kind: "Q4_1".into(),
            backend: "cpu".into(),
            architecture: "llama".into(),
            tokenizer_kind: "gguf-bpe".into(),
        },
        None,
    ));
    let engine = Engine::start(
        EngineConfig {
            queue_depth: opts.queue_depth,
            inference_timeout: opts.timeout,
            residency_check: opts.residency_check,
        },
        EngineParts {
            backend: Box::new(backend),
            tokenizer: tokenizer.clone(),
            metrics: metrics.clone(),
            status: Arc::new(EngineStatus::new(0, false)),
            parity: opts.parity,
        },
    )
    .unwrap();
    let state = AppState::new(AppInner {
        engine: engine.handle(),
        constraints: Arc::new(std::sync::OnceLock::from(Ok(Arc::new(
            Compiler::new(&tokenizer, BYTE_VOCAB_SIZE).expect("a byte vocabulary compiles"),
        )))),
        tokenizer,
        model: ModelFacts {
            worker_id: "0b8b5a63-3c0d-4f6e-9a51-2d6a3f1f9c11".into(),
            model_ref: "/models/scripted.gguf".into(),
            info: ModelInfo {
                name: "scripted".into(),
                architecture: "llama".into(),
                quant_kind: "Q4_1".into(),
                vocab_size: BYTE_VOCAB_SIZE,
                context_length: opts.limits.context_length,
                tensor_bytes: 0,
            },
            device,
            kv: KvLayout {
                kv_type: KvType::F16,
                bytes_per_token: 0,
            },
        },
        limits: opts.limits,
        metrics,
        shutdown: Shutdown::default(),
        started: Instant::now(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(serve(listener, state.clone(), engine, opts.grace));
    Harness {
        base,
        client: reqwest::Client::new(),
        state,
        probe,
        served,
    }
}

/// One SSE frame: its `event:` name and parsed `data:` JSON.
#[derive(Debug, Clone)]
struct Frame {
    event: String,
    data: Value,
}

/// Reads SSE frames off a response body, checking the framing of each:
/// exactly one `event:` line and one `data:` line of JSON. Keep-alive
/// comment frames are skipped.
struct SseReader {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<axum::body::Bytes>> + Send>>,
    buf: Vec<u8>,
}

impl SseReader {
    fn new(resp: reqwest::Response) -> Self {
        SseReader {
            body: Box::pin(resp.bytes_stream()),
            buf: Vec::new(),
        }
    }

    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = std::str::from_utf8(&raw).expect("frames are UTF-8");
                if let Some(frame) = parse_frame(text.trim_end_matches('\n')) {
                    return Some(frame);
                }
                continue;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => panic!("stream failed: {e}"),
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "trailing bytes: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return None;
                }
            }
        }
    }

    async fn all(mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(f) = self.next().await {
            frames.push(f);
        }
        frames
    }
}

fn parse_frame(text: &str) -> Option<Frame> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with(':')).collect();
    if lines.is_empty() {
        return None; // keep-alive comment
    }
    assert_eq!(
        lines.len(),
        2,
        "a frame is one event line and one data line: {text:?}"
    );
    let event = lines[0]
        .strip_prefix("event: ")
        .unwrap_or_else(|| panic!("no event line: {text:?}"));
    let data = lines[1]
        .strip_prefix("data: ")
        .unwrap_or_else(|| panic!("no data line: {text:?}"));
    let data: Value =
        serde_json::from_str(data).unwrap_or_else(|e| panic!("data is not JSON ({e}): {text:?}"));
    Some(Frame {
        event: event.to_string(),
        data,
    })
}

/// Checks `started (token)* (end|error)` with consecutive `i` and, for `end`,
/// `tokens_out` equal to the number of tokens; returns the joined text.
fn check_grammar(frames: &[Frame]) -> String {
    assert!(frames.len() >= 2, "{frames:?}");
    assert_eq!(frames[0].event, "started", "{frames:?}");
    let last = frames.last().unwrap();
    assert!(last.event == "end" || last.event == "error", "{frames:?}");
    let tokens = &frames[1..frames.len() - 1];
    let mut text = String::new();
    for (n, f) in tokens.iter().enumerate() {
        assert_eq!(f.event, "token", "{frames:?}");
        assert_eq!(f.data["i"], n, "{frames:?}");
        assert!(f.data["id"].is_u64());
        text.push_str(f.data["t"].as_str().unwrap());
    }
    if last.event == "end" {
        assert_eq!(last.data["tokens_out"], tokens.len());
    } else {
        for key in ["code", "message", "retriable"] {
            assert!(last.data.get(key).is_some(), "{last:?}");
        }
        assert_eq!(last.data.as_object().unwrap().len(), 3);
    }
    text
}

impl Harness {
    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn execute(&self, body: Value) -> reqwest::Response {
        self.post("/execute", body).await
    }

    /// Runs a job to its end and returns its frames.
    async fn run(&self, body: Value) -> Vec<Frame> {
        let resp = self.execute(body).await;
        assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
        SseReader::new(resp).all().await
    }

    async fn get_json(&self, path: &str) -> Value {
        self.client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn shutdown(self) -> ServeOutcome {
        self.state.shutdown.trigger("test");
        tokio::time::timeout(Duration::from_secs(10), self.served)
            .await
            .expect("shutdown in time")
            .unwrap()
            .unwrap()
    }
}

fn long_backend() -> ScriptedBackend {
    ScriptedBackend::spelling(&"abcdefgh".repeat(300)).with_delay(Duration::from_millis(10))
}

fn h_probe_balance(p: &ScriptProbe) -> isize {
    p.sequences_begun.load(Ordering::SeqCst) as isize
        - p.sequences_ended.load(Ordering::SeqCst) as isize
}
