//! The worker's lifecycle over HTTP: nothing listens before the model is
//! loaded, the ready callback, and `/shutdown` and SIGTERM during a job, on
//! the reference model with `--backend cpu`. Skipped (with a note) when the
//! model is absent, unless `CI` is set.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// M0-W-1340: `/shutdown` during a job: 202, new jobs 503, the queued job
/// CANCELLED (retriable), the running one (no grace) cancelled, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_job_exits_zero() {
    let Some(mut w) = Worker::start(&["--shutdown-grace-sec", "0"]).await else {
        return;
    };
    let mut running = w.execute(long_job("running")).await;
    running.tokens(2).await;
    let queued = w.execute(job("queued", 8)).await;
    let t = Instant::now();
    let resp = w
        .client
        .post(format!("{}/shutdown", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let refused = w.post("/execute", job("late", 4)).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        refused.json::<Value>().await.unwrap()["code"],
        "SHUTTING_DOWN"
    );

    let q = queued.all().await;
    assert_eq!(q[1].data["code"], "CANCELLED");
    assert_eq!(q[1].data["retriable"], true);
    let r = running.all().await;
    assert_eq!(r.last().unwrap().data["code"], "CANCELLED");
    assert_eq!(r.last().unwrap().data["retriable"], true);
    let status = w.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        t.elapsed()
    );
    let phases: Vec<Value> = w
        .events("shutdown")
        .iter()
        .map(|r| r["phase"].clone())
        .collect();
    assert_eq!(phases, vec![json!("begin"), json!("complete")]);
}

/// M0-W-1340: SIGTERM takes the same path; within its grace the running job finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_job_exits_zero() {
    let Some(mut w) = Worker::start(&["--shutdown-grace-sec", "10"]).await else {
        return;
    };
    let mut running = w.execute(job("running", 24)).await;
    running.tokens(2).await;
    w.terminate();
    let r = running.all().await;
    assert_eq!(
        r.last().unwrap().event,
        "end",
        "the job finished within its grace: {r:?}"
    );
    let status = w.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(w.events("shutdown")[0]["reason"], "SIGTERM");
}

/// M0-W-1110: nothing accepts connections before the model is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listens_before_the_model_is_loaded() {
    let Some(model) = reference_model() else {
        return;
    };
    let _turn = model_turn();
    let port = free_port();
    let mut child = cpu_worker(&model, port)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut first_accept = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let attempt = std::time::SystemTime::now();
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            first_accept = Some(attempt);
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first_accept: chrono::DateTime<chrono::Utc> =
        first_accept.expect("the worker never listened").into();
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert!(child.wait().unwrap().success());
    let lines = reader.join().unwrap();
    let loaded = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["event"] == "model_load_complete")
        .expect("model_load_complete");
    let loaded: chrono::DateTime<chrono::Utc> =
        loaded["timestamp"].as_str().unwrap().parse().unwrap();
    assert!(
        first_accept >= loaded,
        "accepted at {first_accept} before the load completed at {loaded}"
    );
}

/// `--callback-url`: the ready callback carries worker_id, model_ref, vram_bytes and uri.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ready_callback_is_posted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ready", listener.local_addr().unwrap());
    let received = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = sock.read(&mut chunk).await.unwrap();
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            if let Some(head_end) = text.find("\r\n\r\n") {
                let len: usize = text[..head_end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if buf.len() >= head_end + 4 + len {
                    sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await
                        .unwrap();
                    return (
                        text[..head_end].to_string(),
                        text[head_end + 4..].to_string(),
                    );
                }
            }
            if n == 0 {
                panic!("callback connection closed early");
            }
        }
    });
    let Some(w) = Worker::start(&["--callback-url", &url]).await else {
        return;
    };
    let (head, body) = tokio::time::timeout(Duration::from_secs(10), received)
        .await
        .unwrap()
        .unwrap();
    assert!(head.starts_with("POST /ready "), "{head}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["worker_id"], WORKER_ID);
    assert!(body["model_ref"].as_str().unwrap().ends_with(".gguf"));
    assert_eq!(body["vram_bytes"], 0);
    assert_eq!(body["uri"], format!("http://127.0.0.1:{}", w.port));
    w.wait_for_event("callback", Duration::from_secs(5)).await;
}
