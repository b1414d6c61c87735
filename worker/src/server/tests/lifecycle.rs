//! The worker around its jobs: shutdown, /health, /metrics, /tokenize and /detokenize.

use super::*;

/// M0-W-1340: shutdown refuses new jobs, cancels queued ones (retriable),
/// gives the running job its grace, then cancels it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_the_queue_and_the_running_job() {
    let h = start(
        long_backend(),
        Opts {
            grace: Duration::from_millis(300),
            ..Opts::default()
        },
    )
    .await;
    let mut running = SseReader::new(h.execute(json!({"job_id": "r", "prompt": "x"})).await);
    running.next().await.unwrap();
    running.next().await.unwrap();
    let queued = SseReader::new(h.execute(json!({"job_id": "q", "prompt": "x"})).await);
    let probe = h.probe.clone();

    let resp = h
        .client
        .post(format!("{}/shutdown", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let t = Instant::now();
    let refused = h.execute(json!({"job_id": "late", "prompt": "x"})).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(
        refused.json::<Value>().await.unwrap()["code"],
        "SHUTTING_DOWN"
    );
    assert_eq!(h.get_json("/health").await["shutting_down"], true);

    let q = queued.all().await;
    assert_eq!(q.len(), 2);
    assert_eq!(q[1].data["code"], "CANCELLED");
    assert_eq!(q[1].data["retriable"], true);
    let r = running.all().await;
    let last = &r.last().unwrap().data;
    assert_eq!(last["code"], "CANCELLED");
    assert_eq!(last["retriable"], true);
    let outcome = tokio::time::timeout(Duration::from_secs(5), h.served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(outcome.running_job_cancelled);
    assert_eq!(outcome.reason, "request");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert_eq!(h_probe_balance(&probe), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_body_must_be_empty_or_an_empty_object() {
    let h = start(ScriptedBackend::spelling("a"), Opts::default()).await;
    let bad = h
        .client
        .post(format!("{}/shutdown", h.base))
        .header("content-type", "application/json")
        .body("{\"now\": true}")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(!h.state.shutdown.is_triggered());
    assert_eq!(h.post("/shutdown", json!({})).await.status(), 202);
    let outcome = tokio::time::timeout(Duration::from_secs(5), h.served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
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
    assert!(
        worst < Duration::from_millis(50),
        "slowest /health took {worst:?}"
    );
    drop(s);
    h.shutdown().await;
}

/// M0-W-1350: counters move by one request and by `tokens_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_job() {
    let h = start(ScriptedBackend::spelling("abcd"), Opts::default()).await;
    let scrape = || async {
        let resp = h
            .client
            .get(format!("{}/metrics", h.base))
            .send()
            .await
            .unwrap();
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text"));
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
        value(&after, "worker_tokens_generated_total")
            - value(&before, "worker_tokens_generated_total"),
        tokens_out
    );
    assert_eq!(value(&after, "worker_inference_duration_ms_count"), 1.0);
    assert!(after.contains("worker_info{") && after.contains("quant_kind=\"Q4_1\""));
    for name in [
        "worker_vram_bytes",
        "worker_uptime_seconds",
        "worker_queue_depth",
        "worker_inter_token_ms_count",
    ] {
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
    let toks = h
        .post("/tokenize", json!({"content": "hi<|im_end|>"}))
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(toks["tokens"], json!([104, 105, 258]));
    let plain = h
        .post(
            "/tokenize",
            json!({"content": "hi<|im_end|>", "add_special": false, "parse_special": false}),
        )
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(plain["tokens"].as_array().unwrap().len(), 12);
    let text = h
        .post("/detokenize", json!({"tokens": [104, 105]}))
        .await
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(text["content"], "hi");
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "tokenize waited {:?}",
        t.elapsed()
    );
    for bad in [
        json!({"tokens": [-1]}),
        json!({"tokens": [BYTE_VOCAB_SIZE]}),
        json!({"tokens": "x"}),
    ] {
        let resp = h.post("/detokenize", bad).await;
        assert_eq!(resp.status(), 400);
        assert_eq!(
            resp.json::<Value>().await.unwrap()["code"],
            "INVALID_REQUEST"
        );
    }
    assert_eq!(
        h.post("/tokenize", json!({"text": "x"})).await.status(),
        400
    );
    let nowhere = h
        .client
        .get(format!("{}/nowhere", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(nowhere.status(), 404);
    assert_eq!(
        nowhere.json::<Value>().await.unwrap()["code"],
        "INVALID_REQUEST"
    );
    let wrong = h
        .client
        .get(format!("{}/execute", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 405);
    assert_eq!(
        wrong.json::<Value>().await.unwrap()["code"],
        "INVALID_REQUEST"
    );
    drop(s);
    h.shutdown().await;
}
