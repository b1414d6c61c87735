//! Issue #15 against the real binary: hostile clients cannot hold the
//! worker's connections or its shutdown, a cross-site form post cannot stop
//! it, `--api-key` guards every endpoint but /health, absurd framing gets
//! 413/400/408, and an open non-loopback bind is warned about.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const AUTH: &str = "Authorization: Bearer k3y\r\n";
const JSON: &str = "Content-Type: application/json\r\n";

/// Sends `head` on a fresh connection and returns the status line of the
/// answer ("" when the worker closed without one) and how long it took.
async fn raw(port: u16, head: &str, limit: Duration) -> (String, Duration) {
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(limit, s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    (text.lines().next().unwrap_or("").to_string(), t.elapsed())
}

/// How a hostile connection behaves.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// Connects and sends nothing.
    Idle,
    /// Sends a header line one byte every 100 ms, never finishing.
    TrickleHeaders,
    /// Sends complete headers declaring 1000 bytes, then one byte a second.
    TrickleBody,
}

/// Runs one hostile connection until the worker closes it; returns how long
/// that took (or `limit` when it never did).
async fn hostile(port: u16, kind: Hostile, limit: Duration) -> Duration {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    // From the connection's start: 200 connects at once can overflow the
    // listen backlog, and the kernel's SYN retry (1 s) is not the worker's.
    let t = Instant::now();
    let (mut rd, mut wr) = s.split();
    let feed = async {
        match kind {
            Hostile::Idle => std::future::pending::<()>().await,
            Hostile::TrickleHeaders => {
                let line = b"GET /health HTTP/1.1\r\nX-Slow: "
                    .iter()
                    .chain(std::iter::repeat(&b'a'));
                for &b in line {
                    if wr.write_all(&[b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Hostile::TrickleBody => {
                let head = format!(
                    "POST /tokenize HTTP/1.1\r\nHost: x\r\n{JSON}Content-Length: 1000\r\n\r\n"
                );
                let _ = wr.write_all(head.as_bytes()).await;
                loop {
                    if wr.write_all(b" ").await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        std::future::pending::<()>().await
    };
    let mut buf = Vec::new();
    tokio::select! {
        _ = tokio::time::timeout(limit, rd.read_to_end(&mut buf)) => {}
        () = feed => {}
    }
    t.elapsed()
}

/// One GET /health on a fresh connection, timed end to end.
async fn health_ms(port: u16) -> f64 {
    let t = Instant::now();
    let (status, _) = raw(
        port,
        "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(status.contains("200"), "{status}");
    t.elapsed().as_secs_f64() * 1e3
}

/// Issue #15, failure 3: 200 connections that send nothing, trickle headers
/// or stall a body are closed within the documented timeouts, while /health
/// answers in well under 5 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_connections_are_closed_within_the_timeouts() {
    let flags = ["--header-timeout-sec", "2", "--body-timeout-sec", "3"];
    let Some(w) = Worker::start(&flags).await else {
        return;
    };
    let port = w.port;
    let limit = Duration::from_secs(20);
    let kinds = [Hostile::Idle, Hostile::TrickleHeaders, Hostile::TrickleBody];
    let conns: Vec<_> = (0..200)
        .map(|i| {
            let kind = kinds[i % 3];
            tokio::spawn(async move { (kind, hostile(port, kind, limit).await) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut lat = Vec::new();
    for _ in 0..60 {
        lat.push(health_ms(port).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut worst = [Duration::ZERO; 3];
    for c in conns {
        let (kind, took) = c.await.unwrap();
        let (i, allowed) = match kind {
            Hostile::Idle => (0, 2.0),
            Hostile::TrickleHeaders => (1, 2.0),
            Hostile::TrickleBody => (2, 3.0),
        };
        assert!(
            took.as_secs_f64() < allowed + 1.5,
            "{kind:?} held for {took:?} (timeout {allowed} s)"
        );
        worst[i] = worst[i].max(took);
    }
    lat.sort_by(f64::total_cmp);
    let (p50, max) = (lat[lat.len() / 2], lat[lat.len() - 1]);
    eprintln!(
        "200 hostile connections closed: idle {:?}, trickled headers {:?}, trickled body {:?}; \
         /health p50 {p50:.2} ms, max {max:.2} ms over {} requests",
        worst[0],
        worst[1],
        worst[2],
        lat.len()
    );
    assert!(p50 < 5.0, "/health p50 {p50:.2} ms");
    assert!(max < 25.0, "/health max {max:.2} ms");
}

/// Issue #15, failure 4: SIGTERM with stalled connections and a running job
/// exits 0 within 5 s, and the job's stream ends with one terminal event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_is_not_held_up_by_stalled_clients() {
    let Some(mut w) = Worker::start(&[]).await else {
        return;
    };
    let port = w.port;
    let limit = Duration::from_secs(30);
    let kinds = [Hostile::Idle, Hostile::TrickleHeaders, Hostile::TrickleBody];
    for i in 0..60 {
        tokio::spawn(hostile(port, kinds[i % 3], limit));
    }
    let mut stream = w.execute(long_job("sigterm-1")).await;
    stream.tokens(2).await;
    let t = Instant::now();
    w.terminate();
    let status = w.wait_exit(Duration::from_secs(10)).await;
    let took = t.elapsed();
    let rest = stream.all().await;
    let terminal: Vec<_> = rest
        .iter()
        .filter(|f| f.event == "end" || f.event == "error")
        .collect();
    eprintln!(
        "SIGTERM with 60 stalled connections and a running job: exit {status:?} after {took:?}"
    );
    assert_eq!(status.code(), Some(0));
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(terminal.len(), 1, "{rest:?}");
}

fn structured(v: &Value) {
    assert!(
        v["code"].is_string() && v["message"].is_string() && v["retriable"].is_boolean(),
        "{v}"
    );
}

/// Issue #15, failure 5: with `--api-key` every endpoint but /health refuses
/// a missing or wrong key with 401 and a structured error.
#[tokio::test]
async fn the_api_key_guards_every_endpoint_but_health() {
    let Some(w) = Worker::start_with_env(&[], &[("WORKER_API_KEY", "k3y")]).await else {
        return;
    };
    let c = &w.client;
    let url = |p: &str| format!("{}{p}", w.base);
    assert_eq!(c.get(url("/health")).send().await.unwrap().status(), 200);
    let posts = [
        "/execute",
        "/cancel",
        "/shutdown",
        "/tokenize",
        "/detokenize",
        "/v1/anything",
    ];
    for key in [None, Some("wrong"), Some("k3yk3y")] {
        let mut reqs = vec![c.get(url("/metrics")), c.get(url("/nope"))];
        reqs.extend(posts.iter().map(|p| c.post(url(p)).json(&json!({}))));
        for req in reqs {
            let req = match key {
                Some(k) => req.bearer_auth(k),
                None => req,
            };
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 401, "{key:?} {}", resp.url());
            assert_eq!(resp.headers()["www-authenticate"], "Bearer");
            structured(&resp.json().await.unwrap());
        }
    }
    let ok = c
        .get(url("/metrics"))
        .bearer_auth("k3y")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let body = json!({"content": "hi"});
    let ok = c
        .post(url("/tokenize"))
        .bearer_auth("k3y")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

/// Issue #15, failure 5: a cross-site form post to /shutdown (no key
/// configured) is refused and the worker keeps serving; so are a text/plain
/// body and a JSON post from a foreign Origin. The worker's own Origin works.
#[tokio::test]
async fn a_cross_site_post_cannot_stop_the_worker() {
    let Some(mut w) = Worker::start(&[]).await else {
        return;
    };
    let port = w.port;
    let form = format!(
        "POST /shutdown HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://evil.example\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 3\r\nConnection: close\r\n\r\na=b"
    );
    let (status, _) = raw(port, &form, Duration::from_secs(5)).await;
    assert!(status.contains("403"), "{status}");
    let text = format!(
        "POST /shutdown HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw(port, &text, Duration::from_secs(5)).await;
    assert!(status.contains("400"), "{status}");
    // No body and no type, but a foreign Origin (a no-cors fetch): refused.
    let bare = format!(
        "POST /shutdown HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: null\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let (status, _) = raw(port, &bare, Duration::from_secs(5)).await;
    assert!(status.contains("403"), "{status}");
    let foreign = format!(
        "POST /shutdown HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:1\r\n{JSON}\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw(port, &foreign, Duration::from_secs(5)).await;
    assert!(status.contains("403"), "{status}");
    assert!(w.health().await["status"].is_string());
    assert!(w.events("shutdown").is_empty());
    let own = format!(
        "POST /shutdown HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n{JSON}\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let (status, _) = raw(port, &own, Duration::from_secs(5)).await;
    assert!(status.contains("202"), "{status}");
    assert_eq!(w.wait_exit(Duration::from_secs(10)).await.code(), Some(0));
}

/// Issue #15, failure 7: an absurd Content-Length gets 413 at once, a bad
/// chunk size or an unreadable Content-Length 400, a stalled body 408.
#[tokio::test]
async fn absurd_framing_gets_413_400_or_408() {
    let Some(w) = Worker::start(&["--body-timeout-sec", "2", "--api-key", "k3y"]).await else {
        return;
    };
    let port = w.port;
    let head =
        |extra: &str| format!("POST /tokenize HTTP/1.1\r\nHost: x\r\n{AUTH}{JSON}{extra}\r\n");
    let cases = [
        (head("Content-Length: 1000000000000\r\n"), "413", 1.0),
        (
            head("Transfer-Encoding: chunked\r\n") + "FFFFFFFFFFFFFFFFFFFFFF\r\n",
            "400",
            1.0,
        ),
        (
            head("Content-Length: 99999999999999999999999\r\n"),
            "400",
            1.0,
        ),
        (head("Content-Length: 1e3\r\n"), "400", 1.0),
        (head("Content-Length: 100\r\n") + "{", "408", 3.5),
    ];
    for (req, want, secs) in cases {
        let (status, took) = raw(port, &req, Duration::from_secs(10)).await;
        assert!(status.contains(want), "{req:?}: {status:?}");
        assert!(took.as_secs_f64() < secs, "{req:?} took {took:?}");
    }
}

/// Issue #15, failure 8: binding every address without a key is warned about.
#[tokio::test]
async fn an_open_non_loopback_bind_is_warned_about() {
    let Some(w) = Worker::start(&["--host", "0.0.0.0"]).await else {
        return;
    };
    let warned = w
        .log()
        .into_iter()
        .any(|r| r["level"] == "WARN" && r["message"].as_str().unwrap_or("").contains("--api-key"));
    assert!(warned, "{:?}", w.raw_log());
}

/// Issue #15, failure 6: an over-long `job_id` is refused by /cancel and
/// /execute with 400 and never reaches the log.
#[tokio::test]
async fn an_over_long_job_id_is_refused_and_not_logged() {
    let Some(w) = Worker::start(&[]).await else {
        return;
    };
    let long = "x".repeat(900_000);
    let resp = w.post("/cancel", json!({ "job_id": long })).await;
    assert_eq!(resp.status(), 400);
    structured(&resp.json().await.unwrap());
    let body = json!({"job_id": long, "prompt": "hi", "max_tokens": 1});
    assert_eq!(w.post("/execute", body).await.status(), 400);
    let resp = w.post("/cancel", json!({ "job_id": "a\u{7}b" })).await;
    assert_eq!(resp.status(), 400);
    assert_eq!(
        w.post("/cancel", json!({ "job_id": "ok-1" }))
            .await
            .status(),
        202
    );
    w.wait_for_event("cancel", Duration::from_secs(5)).await;
    let longest = w.raw_log().iter().map(String::len).max().unwrap();
    assert!(longest < 4096, "a log line of {longest} bytes");
}

/// Issue #15, failure 8: /health and /metrics name the model's file, not
/// where it lies on the host.
#[tokio::test]
async fn health_and_metrics_show_the_file_name_not_the_path() {
    let Some(w) = Worker::start(&[]).await else {
        return;
    };
    assert_eq!(w.health().await["model"], "smollm2-135m-instruct-q4_1.gguf");
    let metrics = w.metrics().await;
    assert!(
        metrics.contains(r#"model="smollm2-135m-instruct-q4_1.gguf""#),
        "{metrics}"
    );
    let root = workspace_root().display().to_string();
    assert!(!metrics.contains(&root), "{metrics}");
    let frames = w.run(job("name-1", 1)).await;
    assert_eq!(frames[0].data["model"], "smollm2-135m-instruct-q4_1.gguf");
}

/// The reference model with its chat template replaced by `template`, or
/// removed (`None`).
fn model_with_template(model: &Path, template: Option<&str>, dir: &Path) -> PathBuf {
    let f = worker_orcd::gguf::GgufFile::open(model).unwrap();
    let mut out = worker_orcd::gguf::GgufWriter::new();
    for (k, v) in f.metadata.iter() {
        let v = match (k, template) {
            ("tokenizer.chat_template", Some(t)) => worker_orcd::gguf::MetaValue::String(t.into()),
            ("tokenizer.chat_template", None) => continue,
            _ => v.clone(),
        };
        out.metadata(k, v);
    }
    for t in &f.tensors {
        out.tensor(&t.name, &t.dims, t.ggml_type, f.tensor_data(t).to_vec());
    }
    let path = dir.join("template.gguf");
    std::fs::write(&path, out.to_bytes()).unwrap();
    path
}

/// Issue #15, failure 2: a model whose chat template loops, or builds a
/// string of terabytes in a few instructions (found by the chat_template
/// fuzzer: fuel alone did not stop it), gets a clear 400 naming the
/// exhausted budget within a second or two, and the worker serves on.
#[tokio::test]
async fn a_hostile_chat_template_ends_with_a_clear_error() {
    let Some(model) = reference_model() else {
        return;
    };
    let cases = [
        (
            "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
             {% endfor %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        (
            "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}\
             {% endfor %}{{ ns.x }}",
            "memory budget",
        ),
        (
            "{% set s = 'x' * 90000000 %}{% for i in range(100000) %}{% if 'y' in s %}{% endif %}{% endfor %}",
            "time limit",
        ),
    ];
    for (i, (template, want)) in cases.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let path = model_with_template(&model, Some(template), dir.path());
        let w = Worker::start_model(&path, &[], &[]).await;
        let job_id = format!("hostile-template-{i}");
        let body = json!({"job_id": job_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let t = Instant::now();
        let resp = w.post("/execute", body).await;
        let took = t.elapsed();
        assert_eq!(resp.status(), 400, "{template}");
        let err: Value = resp.json().await.unwrap();
        structured(&err);
        assert!(err["message"].as_str().unwrap().contains(want), "{err}");
        assert!(took < Duration::from_secs(2), "{template}: {took:?}");
        let frames = w.run(job(&format!("after-{i}"), 2)).await;
        check_grammar(&frames);
    }
}

/// Issue #13: a model file without a chat template answers `messages` with a
/// 400 that says how to give it one; `--chat-template NAME` does, and the
/// conversation renders with it (here ChatML, which the reference model's
/// own template also is).
#[tokio::test]
async fn a_model_without_a_chat_template_takes_one_by_name() {
    let Some(model) = reference_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bare = model_with_template(&model, None, dir.path());
    let chat = |id: &str| json!({"job_id": id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});

    let w = Worker::start_model(&bare, &[], &[]).await;
    let resp = w.post("/execute", chat("bare-1")).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    structured(&err);
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("--chat-template NAME (chatml, llama3, gemma, phi3)"),
        "{err}"
    );
    let frames = w.run(job("bare-prompt", 2)).await;
    check_grammar(&frames);
    drop(w);

    let w = Worker::start_model(&bare, &["--chat-template", "chatml"], &[]).await;
    let frames = w.run(chat("named-1")).await;
    check_grammar(&frames);
    let tokens: Vec<&Frame> = frames.iter().filter(|f| f.event == "token").collect();
    assert_eq!(tokens.len(), 2, "{frames:?}");
}
