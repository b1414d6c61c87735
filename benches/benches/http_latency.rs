//! End to end over HTTP against a spawned worker (the conformance suite's typed
//! client, `harness::client`): time to first token of a short chat prompt and
//! of a ~500-token prompt, measured from sending the request to the arrival
//! of the first `token` event, and the inter-token latency of a 64-token reply
//! (the gaps between consecutive `token` events).
//!
//! `BENCH_WORKER_BIN` (default `target/release/worker-orcd`), `BENCH_HTTP_MODEL`
//! (default the reference model), `BENCH_BACKEND` (default `cuda`). With the
//! cuda backend and no GPU, or without the binary, prints `skipped: ...` and exits 0.
//! Run: `cargo build --release -p worker-orcd && cargo bench -p worker-benches --bench http_latency`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use harness::client::{Client, Transcript};
use serde_json::{json, Value};
use worker_benches::{cuda_device_or_skip, skip, SMOLLM2};

const BENCH: &str = "http_latency";
const JOB_TIMEOUT: Duration = Duration::from_secs(120);
/// Keeps a greedy reply going (as in ci/speed.py).
const COUNT_PROMPT: &str = "Count upward: 1, 2, 3, 4, 5,";

struct Worker {
    child: Child,
    client: Client,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn spawn(rt: &tokio::runtime::Runtime, bin: &PathBuf, model: &PathBuf, backend: &str) -> Worker {
    let port = free_port();
    let child = Command::new(bin)
        .args([
            "--worker-id",
            "6f1d7a2e-0000-4000-8000-0000000bec42",
            "--gpu-device",
            "0",
            "--backend",
            backend,
        ])
        .arg("--model")
        .arg(model)
        .args(["--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the worker starts");
    let worker = Worker {
        child,
        client: Client::new("127.0.0.1", port),
    };
    let started = Instant::now();
    rt.block_on(async {
        loop {
            if let Ok(h) = worker.client.health().await {
                if h["status"] == "healthy" {
                    return;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "the worker did not become healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    worker
}

fn job(rt: &tokio::runtime::Runtime, w: &Worker, body: Value) -> Transcript {
    let t = rt
        .block_on(w.client.run(&body, JOB_TIMEOUT))
        .expect("the job runs");
    assert!(
        t.first("end").is_some(),
        "the job ended with {:?}",
        t.terminal()
    );
    t
}

fn first_token(t: &Transcript) -> Duration {
    t.first("token").expect("a token").at
}

fn http_latency(c: &mut Criterion) {
    let backend = std::env::var("BENCH_BACKEND").unwrap_or_else(|_| "cuda".into());
    if backend == "cuda" && cuda_device_or_skip(BENCH).is_none() {
        return;
    }
    let bin = std::env::var_os("BENCH_WORKER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/worker-orcd")
        });
    if !bin.exists() {
        return skip(
            BENCH,
            &format!(
                "{} does not exist (cargo build --release -p worker-orcd)",
                bin.display()
            ),
        );
    }
    let model = match std::env::var_os("BENCH_HTTP_MODEL") {
        Some(p) => PathBuf::from(p),
        None => match SMOLLM2.model_or_skip(BENCH) {
            Some(p) => p,
            None => return,
        },
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let w = spawn(&rt, &bin, &model, &backend);
    let chat = json!([{"role": "user", "content": "Write a haiku about GPU computing"}]);
    let long = ["The quick brown fox jumps over the lazy dog."; 50].join(" ");
    let mut n = 0u64;
    let mut id = move || {
        n += 1;
        format!("bench-{n}")
    };

    let mut g = c.benchmark_group(format!("http/{backend}"));
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.bench_function("ttft_chat", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| json!({"job_id": id(), "messages": chat, "max_tokens": 1, "temperature": 0}))
                .map(|body| first_token(&job(&rt, &w, body)))
                .sum()
        })
    });
    g.bench_function("ttft_500_tokens", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| json!({"job_id": id(), "prompt": long, "max_tokens": 1, "temperature": 0}))
                .map(|body| first_token(&job(&rt, &w, body)))
                .sum()
        })
    });
    g.bench_function("inter_token", |b| {
        // One iteration is one gap between consecutive tokens.
        b.iter_custom(|iters| {
            let mut gaps = Vec::new();
            while (gaps.len() as u64) < iters {
                let body = json!({"job_id": id(), "prompt": COUNT_PROMPT, "max_tokens": 64, "temperature": 0});
                let t = job(&rt, &w, body);
                let at: Vec<Duration> = t.tokens().map(|e| e.at).collect();
                gaps.extend(at.windows(2).map(|p| p[1] - p[0]));
            }
            gaps.iter().take(iters as usize).sum()
        })
    });
    g.finish();
}

criterion_group!(benches, http_latency);
criterion_main!(benches);
