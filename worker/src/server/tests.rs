//! In-process handler tests (M0-W-1811): the real router, engine thread and
//! queue on a loopback port, over a [`ScriptedBackend`] and the byte-level
//! test tokenizer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use super::*;
use crate::backend::{Backend, BackendError, MemoryUse};
use crate::engine::parity::{ParitySender, ParityWriter};
use crate::engine::runner::EngineParts;
use crate::engine::testing::{byte_tokenizer, ScriptProbe, ScriptedBackend, BYTE_VOCAB_SIZE};
use crate::engine::{Engine, EngineConfig, EngineStatus, Outcome};

struct Opts {
    residency_check: Option<Duration>,
    queue_depth: usize,
    timeout: Duration,
    grace: Duration,
    limits: Limits,
    parity: Option<ParitySender>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            residency_check: None,
            queue_depth: 4,
            timeout: Duration::from_secs(60),
            grace: Duration::from_millis(200),
            limits: Limits { max_tokens_in: 1024, max_tokens_out: 2048, vocab_size: BYTE_VOCAB_SIZE, context_length: 4096 },
            parity: None,
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
    let tokenizer = byte_tokenizer();
    let metrics = Arc::new(Metrics::new(crate::telemetry::metrics::InfoLabels {
        model: "/models/scripted.gguf".into(),
        quant_kind: "Q4_1".into(),
        backend: "cpu".into(),
        architecture: "llama".into(),
        tokenizer_kind: "gguf-bpe".into(),
    }));
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
        },
        limits: opts.limits,
        metrics,
        shutdown: Shutdown::default(),
        started: Instant::now(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(serve(listener, state.clone(), engine, opts.grace));
    Harness { base, client: reqwest::Client::new(), state, probe, served }
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
        SseReader { body: Box::pin(resp.bytes_stream()), buf: Vec::new() }
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
                    assert!(self.buf.is_empty(), "trailing bytes: {:?}", String::from_utf8_lossy(&self.buf));
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
    assert_eq!(lines.len(), 2, "a frame is one event line and one data line: {text:?}");
    let event = lines[0].strip_prefix("event: ").unwrap_or_else(|| panic!("no event line: {text:?}"));
    let data = lines[1].strip_prefix("data: ").unwrap_or_else(|| panic!("no data line: {text:?}"));
    let data: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("data is not JSON ({e}): {text:?}"));
    Some(Frame { event: event.to_string(), data })
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
        self.client.post(format!("{}{path}", self.base)).json(&body).send().await.unwrap()
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
        self.client.get(format!("{}{path}", self.base)).send().await.unwrap().json().await.unwrap()
    }

    async fn shutdown(self) -> ServeOutcome {
        self.state.shutdown.trigger("test");
        tokio::time::timeout(Duration::from_secs(10), self.served).await.expect("shutdown in time").unwrap().unwrap()
    }
}

fn long_backend() -> ScriptedBackend {
    ScriptedBackend::spelling(&"abcdefgh".repeat(300)).with_delay(Duration::from_millis(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_streams_started_tokens_and_end() {
    let h = start(ScriptedBackend::spelling("Hi!"), Opts::default()).await;
    let resp = h.execute(json!({"job_id": "j1", "prompt": "hello", "seed": 5})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert_eq!(resp.headers()["x-accel-buffering"], "no");
    let frames = SseReader::new(resp).all().await;
    assert_eq!(check_grammar(&frames), "Hi!");
    let started = &frames[0].data;
    assert_eq!(started["job_id"], "j1");
    assert_eq!(started["model"], "/models/scripted.gguf");
    assert_eq!(started["seed"], 5);
    chrono::DateTime::parse_from_rfc3339(started["started_at"].as_str().unwrap()).unwrap();
    let ids: Vec<u64> = frames[1..4].iter().map(|f| f.data["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![b'H' as u64, b'i' as u64, b'!' as u64]);
    let end = &frames[4].data;
    assert_eq!(end["stop_reason"], "eos");
    assert!(end.get("stop_sequence").is_none());
    assert!(end["decode_time_ms"].is_u64() && end["first_token_ms"].is_u64());
    assert_eq!(h.probe.prompts.lock().unwrap()[0], b"hello".iter().map(|&b| b as u32).collect::<Vec<_>>());
    assert_eq!(h.state.metrics.requests(Outcome::Completed), 1);
    assert_eq!(h.state.metrics.tokens_generated(), 3);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_stop_sequences_logprobs_and_chosen_seed() {
    let h = start(ScriptedBackend::spelling("ab\n\ncd"), Opts::default()).await;
    let frames = h.run(json!({"job_id": "m", "prompt": "x", "max_tokens": 2})).await;
    assert_eq!(check_grammar(&frames), "ab");
    assert_eq!(frames.last().unwrap().data["stop_reason"], "max_tokens");
    assert!(frames[0].data["seed"].is_u64(), "a missing seed is chosen and reported");

    let frames = h.run(json!({"job_id": "s", "prompt": "x", "stop": ["\n\n"]})).await;
    assert_eq!(check_grammar(&frames), "ab");
    let end = &frames.last().unwrap().data;
    assert_eq!(end["stop_reason"], "stop_sequence");
    assert_eq!(end["stop_sequence"], "\n\n");

    let frames = h.run(json!({"job_id": "l", "prompt": "x", "max_tokens": 1, "logprobs": 3})).await;
    let lps = frames[1].data["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 3);
    assert_eq!(lps[0]["id"], b'a' as u64);
    assert_eq!(lps[0]["t"], "a");
    let values: Vec<f64> = lps.iter().map(|l| l["logprob"].as_f64().unwrap()).collect();
    assert!(values.windows(2).all(|w| w[0] >= w[1]) && values[0] <= 0.0, "{values:?}");
    h.shutdown().await;
}

/// M0-W-1824: a 4-byte emoji over 4 byte tokens gives three empty `t` values, then the emoji.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_text_is_whole_utf8() {
    let h = start(ScriptedBackend::spelling("a😀b"), Opts::default()).await;
    let frames = h.run(json!({"job_id": "u", "prompt": "x"})).await;
    let texts: Vec<&str> = frames[1..frames.len() - 1].iter().map(|f| f.data["t"].as_str().unwrap()).collect();
    assert_eq!(texts, vec!["a", "", "", "", "😀", "b"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_templated() {
    let h = start(ScriptedBackend::spelling("ok"), Opts::default()).await;
    let frames = h.run(json!({"job_id": "c", "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(check_grammar(&frames), "ok");
    let prompt = h.probe.prompts.lock().unwrap()[0].clone();
    assert_eq!(h.state.tokenizer.decode(&prompt).unwrap(), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    h.shutdown().await;
}

/// M0-W-1302 and EXT-004: refusals are JSON, name the field, and open no stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors() {
    let limits = Limits { max_tokens_in: 16, max_tokens_out: 5, vocab_size: BYTE_VOCAB_SIZE, context_length: 4096 };
    let h = start(ScriptedBackend::spelling("ok"), Opts { limits, ..Opts::default() }).await;
    let rows: Vec<(Value, &str)> = vec![
        (json!({"job_id": "", "prompt": "x"}), "job_id"),
        (json!({"job_id": "j"}), "prompt/messages"),
        (json!({"job_id": "j", "prompt": "x", "messages": []}), "prompt/messages"),
        (json!({"job_id": "j", "prompt": "x", "max_tokens": 0}), "max_tokens"),
        (json!({"job_id": "j", "prompt": "x", "max_tokens": 6}), "max_tokens"),
        (json!({"job_id": "j", "prompt": "x", "temperature": 2.1}), "temperature"),
        (json!({"job_id": "j", "prompt": "x", "top_p": 1.5}), "top_p"),
        (json!({"job_id": "j", "prompt": "x", "top_k": BYTE_VOCAB_SIZE + 1}), "top_k"),
        (json!({"job_id": "j", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"job_id": "j", "prompt": "x", "seed": -1}), "seed"),
        (json!({"job_id": "j", "prompt": "x".repeat(17)}), "prompt"),
        (json!({"job_id": "j", "messages": [{"role": "alien", "content": "x"}]}), "messages"),
        (json!({"job_id": "j", "prompt": "x", "bogus": true}), "bogus"),
        (json!({"job_id": "j", "prompt": "x", "max_tokens": "5"}), "max_tokens"),
    ];
    for (body, field) in rows {
        let resp = h.execute(body.clone()).await;
        assert_eq!(resp.status(), 400, "{body}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["code"], "INVALID_REQUEST", "{body}");
        assert_eq!(err["retriable"], false);
        assert!(err["message"].as_str().unwrap().contains(field), "{body}: {err}");
    }

    let url = format!("{}/execute", h.base);
    let raw = |ct: &'static str, body: Vec<u8>| h.client.post(&url).header("content-type", ct).body(body).send();
    let cases: Vec<(reqwest::Response, u16)> = vec![
        (raw("application/json", b"{\"job_id\": \"j\", ".to_vec()).await.unwrap(), 400),
        (raw("application/json", b"{\"job_id\": \"j\xff\xfe\", \"prompt\": \"x\"}".to_vec()).await.unwrap(), 400),
        (raw("text/plain", br#"{"job_id": "j", "prompt": "x"}"#.to_vec()).await.unwrap(), 400),
        (raw("application/json", vec![b' '; MAX_BODY_BYTES + 1]).await.unwrap(), 413),
        (raw("application/json", b"[1, 2]".to_vec()).await.unwrap(), 400),
    ];
    for (resp, status) in cases {
        assert_eq!(resp.status().as_u16(), status);
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["code"], "INVALID_REQUEST");
        assert_eq!(err["retriable"], false);
    }
    assert_eq!(h.probe.sequences_begun.load(Ordering::SeqCst), 0, "nothing was queued");
    assert_eq!(h.state.metrics.requests(Outcome::Invalid), 19);
    // The worker still serves.
    assert_eq!(h.get_json("/health").await["status"], "healthy");
    assert_eq!(check_grammar(&h.run(json!({"job_id": "ok", "prompt": "x", "max_tokens": 5})).await), "ok");
    h.shutdown().await;
}

/// EXT-003 and M0-W-1301: one job at a time, FIFO, 503 + Retry-After when full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_runs_jobs_in_order_and_refuses_when_full() {
    let backend = ScriptedBackend::spelling("abcdef").with_delay(Duration::from_millis(20));
    let h = start(backend, Opts { queue_depth: 2, ..Opts::default() }).await;
    let mut first = SseReader::new(h.execute(json!({"job_id": "q0", "prompt": "0"})).await);
    assert_eq!(first.next().await.unwrap().event, "started");
    assert_eq!(first.next().await.unwrap().event, "token", "q0 is running");
    let second = h.execute(json!({"job_id": "q1", "prompt": "1"})).await;
    let third = h.execute(json!({"job_id": "q2", "prompt": "2"})).await;
    assert_eq!(second.status(), 200);
    assert_eq!(third.status(), 200);
    assert_eq!(h.get_json("/health").await["queue_depth"], 2);
    let full = h.execute(json!({"job_id": "q3", "prompt": "3"})).await;
    assert_eq!(full.status(), 503);
    assert!(full.headers().contains_key("retry-after"));
    let err: Value = full.json().await.unwrap();
    assert_eq!(err["code"], "QUEUE_FULL");
    assert_eq!(err["retriable"], true);
    // Duplicate ids are refused while the first is queued or running.
    assert_eq!(h.execute(json!({"job_id": "q1", "prompt": "1"})).await.status(), 400);

    let (a, b, c) = tokio::join!(first.all(), SseReader::new(second).all(), SseReader::new(third).all());
    assert_eq!(a.last().unwrap().event, "end");
    for frames in [&b, &c] {
        assert_eq!(check_grammar(frames), "abcdef");
    }
    let prompts = h.probe.prompts.lock().unwrap().clone();
    assert_eq!(prompts, vec![vec![b'0' as u32], vec![b'1' as u32], vec![b'2' as u32]]);
    assert_eq!(h.state.metrics.requests(Outcome::Rejected), 1);
    h.shutdown().await;
}

/// M0-W-1330: cancel a running job (202 each time, one CANCELLED, quickly).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_running_job() {
    let h = start(long_backend(), Opts::default()).await;
    let mut s = SseReader::new(h.execute(json!({"job_id": "run", "prompt": "x"})).await);
    let mut tokens = 0;
    assert_eq!(s.next().await.unwrap().event, "started");
    while tokens < 5 {
        assert_eq!(s.next().await.unwrap().event, "token");
        tokens += 1;
    }
    let sent = Instant::now();
    for _ in 0..3 {
        let resp = h.post("/cancel", json!({"job_id": "run"})).await;
        assert_eq!(resp.status(), 202);
    }
    let mut last = None;
    while let Some(f) = s.next().await {
        if f.event == "token" {
            tokens += 1;
        } else {
            last = Some(f);
        }
    }
    let took = sent.elapsed();
    let last = last.unwrap();
    assert_eq!(last.event, "error");
    assert_eq!(last.data["code"], "CANCELLED");
    assert_eq!(last.data["retriable"], false);
    assert!(tokens >= 5);
    assert!(took < Duration::from_millis(500), "cancel took {took:?}");
    // Unknown and finished ids: still 202.
    assert_eq!(h.post("/cancel", json!({"job_id": "run"})).await.status(), 202);
    assert_eq!(h.post("/cancel", json!({"job_id": "never"})).await.status(), 202);
    assert_eq!(h.post("/cancel", json!({})).await.status(), 400);
    assert_eq!(h.state.metrics.requests(Outcome::Cancelled), 1);
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

fn h_probe_balance(p: &ScriptProbe) -> isize {
    p.sequences_begun.load(Ordering::SeqCst) as isize - p.sequences_ended.load(Ordering::SeqCst) as isize
}

/// M0-SYS-6.3.5: a queued job cancelled gets `started` then CANCELLED, at once;
/// the running job is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_queued_job() {
    let backend = ScriptedBackend::spelling("abcdefghij").with_delay(Duration::from_millis(20));
    let h = start(backend, Opts::default()).await;
    let mut first = SseReader::new(h.execute(json!({"job_id": "one", "prompt": "x"})).await);
    first.next().await.unwrap();
    first.next().await.unwrap();
    let second = SseReader::new(h.execute(json!({"job_id": "two", "prompt": "y"})).await);
    let resp: Value = h.post("/cancel", json!({"job_id": "two"})).await.json().await.unwrap();
    assert_eq!(resp["state"], "queued");
    let frames = tokio::time::timeout(Duration::from_millis(500), second.all()).await.expect("ended at once");
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].event, "started");
    assert_eq!(frames[1].data["code"], "CANCELLED");
    assert_eq!(frames[1].data["retriable"], false);
    let rest = first.all().await;
    assert_eq!(rest.last().unwrap().event, "end");
    assert_eq!(h.probe.prompts.lock().unwrap().len(), 1, "the cancelled job never ran");
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// M0-W-1611: a client that leaves frees the engine for the next job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_frees_the_engine() {
    let h = start(long_backend(), Opts::default()).await;
    let mut s = SseReader::new(h.execute(json!({"job_id": "gone", "prompt": "x"})).await);
    for _ in 0..4 {
        s.next().await.unwrap();
    }
    drop(s);
    let t = Instant::now();
    let frames = h.run(json!({"job_id": "next", "prompt": "x", "max_tokens": 3})).await;
    assert_eq!(check_grammar(&frames), "abc");
    assert!(t.elapsed() < Duration::from_secs(2), "the next job waited {:?}", t.elapsed());
    assert_eq!(h.state.metrics.requests(Outcome::Disconnected), 1);
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// M0-W-1510: a slow job hits the inference timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_job_times_out() {
    let h = start(long_backend(), Opts { timeout: Duration::from_millis(300), ..Opts::default() }).await;
    let frames = h.run(json!({"job_id": "slow", "prompt": "x"})).await;
    check_grammar(&frames);
    let last = &frames.last().unwrap().data;
    assert_eq!(last["code"], "INFERENCE_TIMEOUT");
    assert_eq!(last["retriable"], false);
    assert!(last["message"].is_string());
    assert_eq!(h.state.metrics.requests(Outcome::Timeout), 1);
    h.shutdown().await;
}

/// M0-W-1340: shutdown refuses new jobs, cancels queued ones (retriable),
/// gives the running job its grace, then cancels it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_the_queue_and_the_running_job() {
    let h = start(long_backend(), Opts { grace: Duration::from_millis(300), ..Opts::default() }).await;
    let mut running = SseReader::new(h.execute(json!({"job_id": "r", "prompt": "x"})).await);
    running.next().await.unwrap();
    running.next().await.unwrap();
    let queued = SseReader::new(h.execute(json!({"job_id": "q", "prompt": "x"})).await);
    let probe = h.probe.clone();

    let resp = h.client.post(format!("{}/shutdown", h.base)).send().await.unwrap();
    assert_eq!(resp.status(), 202);
    let t = Instant::now();
    let refused = h.execute(json!({"job_id": "late", "prompt": "x"})).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.json::<Value>().await.unwrap()["code"], "SHUTTING_DOWN");
    assert_eq!(h.get_json("/health").await["shutting_down"], true);

    let q = queued.all().await;
    assert_eq!(q.len(), 2);
    assert_eq!(q[1].data["code"], "CANCELLED");
    assert_eq!(q[1].data["retriable"], true);
    let r = running.all().await;
    let last = &r.last().unwrap().data;
    assert_eq!(last["code"], "CANCELLED");
    assert_eq!(last["retriable"], true);
    let outcome = tokio::time::timeout(Duration::from_secs(5), h.served).await.unwrap().unwrap().unwrap();
    assert!(outcome.running_job_cancelled);
    assert_eq!(outcome.reason, "request");
    assert!(t.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t.elapsed());
    assert_eq!(h_probe_balance(&probe), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_body_must_be_empty_or_an_empty_object() {
    let h = start(ScriptedBackend::spelling("a"), Opts::default()).await;
    let bad = h.client.post(format!("{}/shutdown", h.base)).body("{\"now\": true}").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(!h.state.shutdown.is_triggered());
    assert_eq!(h.post("/shutdown", json!({})).await.status(), 202);
    let outcome = tokio::time::timeout(Duration::from_secs(5), h.served).await.unwrap().unwrap().unwrap();
    assert!(!outcome.running_job_cancelled);
}

/// M0-W-1320 and M0-W-1604: every field, from cached state, fast during a job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_has_every_field_and_stays_fast_during_a_job() {
    let h = start(long_backend(), Opts::default()).await;
    let idle = h.get_json("/health").await;
    for (key, value) in [
        ("status", json!("healthy")),
        ("model", json!("/models/scripted.gguf")),
        ("resident", json!(false)),
        ("quant_kind", json!("Q4_1")),
        ("vram_bytes_used", json!(0)),
        ("tokenizer_kind", json!("gguf-bpe")),
        ("vocab_size", json!(BYTE_VOCAB_SIZE)),
        ("context_length", json!(4096)),
        ("backend", json!("cpu")),
        ("queue_depth", json!(0)),
        ("busy", json!(false)),
    ] {
        assert_eq!(idle[key], value, "{key}: {idle}");
    }
    assert!(idle["uptime_seconds"].is_u64());
    assert!(idle.get("sm").is_none(), "cpu has no sm");

    let mut s = SseReader::new(h.execute(json!({"job_id": "long", "prompt": "x"})).await);
    s.next().await.unwrap();
    s.next().await.unwrap();
    let mut worst = Duration::ZERO;
    for _ in 0..50 {
        let t = Instant::now();
        let v = h.get_json("/health").await;
        worst = worst.max(t.elapsed());
        assert_eq!(v["busy"], true);
    }
    assert!(worst < Duration::from_millis(50), "slowest /health took {worst:?}");
    drop(s);
    h.shutdown().await;
}

/// M0-W-1350: counters move by one request and by `tokens_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_job() {
    let h = start(ScriptedBackend::spelling("abcd"), Opts::default()).await;
    let scrape = || async {
        let resp = h.client.get(format!("{}/metrics", h.base)).send().await.unwrap();
        assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
        resp.text().await.unwrap()
    };
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = scrape().await;
    let frames = h.run(json!({"job_id": "m", "prompt": "x"})).await;
    let tokens_out = frames.last().unwrap().data["tokens_out"].as_f64().unwrap();
    let after = scrape().await;
    let completed = "worker_requests_total{outcome=\"completed\"}";
    assert_eq!(value(&after, completed) - value(&before, completed), 1.0);
    assert_eq!(
        value(&after, "worker_tokens_generated_total") - value(&before, "worker_tokens_generated_total"),
        tokens_out
    );
    assert_eq!(value(&after, "worker_inference_duration_ms_count"), 1.0);
    assert!(after.contains("worker_info{") && after.contains("quant_kind=\"Q4_1\""));
    for name in ["worker_vram_bytes", "worker_uptime_seconds", "worker_queue_depth", "worker_inter_token_ms_count"] {
        value(&after, name);
    }
    h.shutdown().await;
}

/// EXT-006: answered on the HTTP side, also while a job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_while_a_job_runs() {
    let h = start(long_backend(), Opts::default()).await;
    let mut s = SseReader::new(h.execute(json!({"job_id": "long", "prompt": "x"})).await);
    s.next().await.unwrap();
    s.next().await.unwrap();
    let t = Instant::now();
    let toks = h.post("/tokenize", json!({"content": "hi<|im_end|>"})).await.json::<Value>().await.unwrap();
    assert_eq!(toks["tokens"], json!([104, 105, 258]));
    let plain = h
        .post("/tokenize", json!({"content": "hi<|im_end|>", "add_special": false, "parse_special": false}))
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(plain["tokens"].as_array().unwrap().len(), 12);
    let text = h.post("/detokenize", json!({"tokens": [104, 105]})).await.json::<Value>().await.unwrap();
    assert_eq!(text["content"], "hi");
    assert!(t.elapsed() < Duration::from_millis(200), "tokenize waited {:?}", t.elapsed());
    for bad in [json!({"tokens": [-1]}), json!({"tokens": [BYTE_VOCAB_SIZE]}), json!({"tokens": "x"})] {
        let resp = h.post("/detokenize", bad).await;
        assert_eq!(resp.status(), 400);
        assert_eq!(resp.json::<Value>().await.unwrap()["code"], "INVALID_REQUEST");
    }
    assert_eq!(h.post("/tokenize", json!({"text": "x"})).await.status(), 400);
    let nowhere = h.client.get(format!("{}/nowhere", h.base)).send().await.unwrap();
    assert_eq!(nowhere.status(), 404);
    assert_eq!(nowhere.json::<Value>().await.unwrap()["code"], "INVALID_REQUEST");
    let wrong = h.client.get(format!("{}/execute", h.base)).send().await.unwrap();
    assert_eq!(wrong.status(), 405);
    assert_eq!(wrong.json::<Value>().await.unwrap()["code"], "INVALID_REQUEST");
    drop(s);
    h.shutdown().await;
}

/// M0-W-1501 in a job: errors map to codes, and the worker keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_end_the_job_and_the_worker_goes_on() {
    let oom = ScriptedBackend::spelling("abc").failing_at(1, || BackendError::OutOfMemory { needed: 10, available: 1 });
    let h = start(oom, Opts::default()).await;
    let frames = h.run(json!({"job_id": "oom", "prompt": "x"})).await;
    assert_eq!(check_grammar(&frames), "a");
    assert_eq!(frames.last().unwrap().data["code"], "VRAM_OOM");
    assert_eq!(frames.last().unwrap().data["retriable"], false);
    assert_eq!(h.get_json("/health").await["status"], "healthy", "memory is back at the post-load level");
    assert_eq!(check_grammar(&h.run(json!({"job_id": "after", "prompt": "x"})).await), "abc");
    h.shutdown().await;

    let kernel = ScriptedBackend::spelling("abc").failing_at(0, || BackendError::KernelLaunchFailed("k".into()));
    let h = start(kernel, Opts::default()).await;
    let frames = h.run(json!({"job_id": "k", "prompt": "x"})).await;
    assert_eq!(frames.last().unwrap().data["code"], "INTERNAL", "a device failure on cpu is ours");
    h.shutdown().await;

    let panicking = ScriptedBackend::spelling("abc").panicking_at(1);
    let h = start(panicking, Opts::default()).await;
    let frames = h.run(json!({"job_id": "p", "prompt": "x"})).await;
    check_grammar(&frames);
    assert_eq!(frames.last().unwrap().data["code"], "INTERNAL");
    assert_eq!(check_grammar(&h.run(json!({"job_id": "p2", "prompt": "x"})).await), "abc");
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// EXT-001: parity logging does not change the tokens; one record per sampled token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_logging_changes_nothing_but_the_file() {
    let body = json!({"job_id": "p", "prompt": "x", "max_tokens": 6});
    let h = start(ScriptedBackend::spelling("parity!"), Opts::default()).await;
    let plain = h.run(body.clone()).await;
    h.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("parity.jsonl");
    let metrics = Metrics::new_for_tests();
    let (sender, writer) = ParityWriter::spawn(&path, metrics.parity_dropped_counter()).unwrap();
    let h = start(ScriptedBackend::spelling("parity!"), Opts { parity: Some(sender), ..Opts::default() }).await;
    let logged = h.run(body).await;
    h.shutdown().await;
    writer.join();
    let ids = |frames: &[Frame]| frames.iter().filter(|f| f.event == "token").map(|f| f.data["id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&plain), ids(&logged));
    let lines: Vec<Value> =
        std::fs::read_to_string(&path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 6);
    for (n, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], n);
        assert_eq!(line["job_id"], "p");
        assert_eq!(line["token_id"], ids(&logged)[n]);
    }
}

/// M0-W-1012 and M0-W-1320 on a (scripted) `cuda` device: `resident` and
/// `sm` are reported; a failed residency check turns `/health` unhealthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn residency_checks_drive_health_on_cuda() {
    let backend = ScriptedBackend::spelling("ab").on_cuda().with_memory(MemoryUse { weights: 1000, kv_cache: 0, scratch: 0 });
    let opts = Opts { residency_check: Some(Duration::from_millis(50)), ..Opts::default() };
    let h = start(backend, opts).await;
    let v = h.get_json("/health").await;
    assert_eq!(v["status"], "healthy", "{v}");
    assert_eq!(v["resident"], true);
    assert_eq!(v["backend"], "cuda");
    assert_eq!(v["sm"], "9.0");
    assert_eq!(v["vram_bytes_used"], 1000);
    h.probe.resident.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(3);
    let v = loop {
        let v = h.get_json("/health").await;
        if v["status"] == "unhealthy" || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(v["status"], "unhealthy", "{v}");
    assert_eq!(v["resident"], false);
    assert!(v["reason"].as_str().unwrap().contains("resident"), "{v}");
    h.probe.resident.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.get_json("/health").await["status"], "healthy");
    assert!(h.probe.residency_checks.load(Ordering::SeqCst) >= 3);
    h.shutdown().await;
}

/// M0-W-1501 on `cuda`: a kernel failure in a job is CUDA_ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_failures_on_cuda_are_cuda_errors() {
    let backend =
        ScriptedBackend::spelling("abc").on_cuda().failing_at(1, || BackendError::KernelLaunchFailed("k".into()));
    let h = start(backend, Opts::default()).await;
    let frames = h.run(json!({"job_id": "k", "prompt": "x"})).await;
    check_grammar(&frames);
    assert_eq!(frames.last().unwrap().data["code"], "CUDA_ERROR");
    assert_eq!(frames.last().unwrap().data["retriable"], false);
    h.shutdown().await;
}

/// EXT-003's check: depth 2, four jobs at once: three accepted and each ends
/// once; one gets 503 with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_jobs_at_once_with_depth_two() {
    let backend = ScriptedBackend::spelling("abc").with_delay(Duration::from_millis(20));
    let h = start(backend, Opts { queue_depth: 2, ..Opts::default() }).await;
    let posts = (0..4).map(|n| h.execute(json!({"job_id": format!("j{n}"), "prompt": n.to_string()})));
    let responses = futures::future::join_all(posts).await;
    let mut streams = Vec::new();
    let mut refused = 0;
    for resp in responses {
        match resp.status().as_u16() {
            200 => streams.push(SseReader::new(resp).all()),
            503 => {
                assert!(resp.headers().contains_key("retry-after"));
                assert_eq!(resp.json::<Value>().await.unwrap()["code"], "QUEUE_FULL");
                refused += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!((streams.len(), refused), (3, 1));
    for frames in futures::future::join_all(streams).await {
        assert_eq!(check_grammar(&frames), "abc");
    }
    assert_eq!(h.probe.prompts.lock().unwrap().len(), 3);
    h.shutdown().await;
}
