//! The device under the engine: backend failures, parity logging, residency checks, CUDA error codes.

use super::*;

/// M0-W-1501 in a job: errors map to codes, and the worker keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_end_the_job_and_the_worker_goes_on() {
    let oom = ScriptedBackend::spelling("abc").failing_at(1, || BackendError::OutOfMemory {
        needed: 10,
        available: 1,
    });
    let h = start(oom, Opts::default()).await;
    let frames = h.run(json!({"job_id": "oom", "prompt": "x"})).await;
    assert_eq!(check_grammar(&frames), "a");
    assert_eq!(frames.last().unwrap().data["code"], "VRAM_OOM");
    assert_eq!(frames.last().unwrap().data["retriable"], false);
    assert_eq!(
        h.get_json("/health").await["status"],
        "healthy",
        "memory is back at the post-load level"
    );
    assert_eq!(
        check_grammar(&h.run(json!({"job_id": "after", "prompt": "x"})).await),
        "abc"
    );
    h.shutdown().await;

    let kernel = ScriptedBackend::spelling("abc")
        .failing_at(0, || BackendError::KernelLaunchFailed("k".into()));
    let h = start(kernel, Opts::default()).await;
    let frames = h.run(json!({"job_id": "k", "prompt": "x"})).await;
    assert_eq!(
        frames.last().unwrap().data["code"],
        "INTERNAL",
        "a device failure on cpu is ours"
    );
    h.shutdown().await;

    let panicking = ScriptedBackend::spelling("abc").panicking_at(1);
    let h = start(panicking, Opts::default()).await;
    let frames = h.run(json!({"job_id": "p", "prompt": "x"})).await;
    check_grammar(&frames);
    assert_eq!(frames.last().unwrap().data["code"], "INTERNAL");
    assert_eq!(
        check_grammar(&h.run(json!({"job_id": "p2", "prompt": "x"})).await),
        "abc"
    );
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
    let h = start(
        ScriptedBackend::spelling("parity!"),
        Opts {
            parity: Some(sender),
            ..Opts::default()
        },
    )
    .await;
    let logged = h.run(body).await;
    h.shutdown().await;
    writer.join();
    let ids = |frames: &[Frame]| {
        frames
            .iter()
            .filter(|f| f.event == "token")
            .map(|f| f.data["id"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&plain), ids(&logged));
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
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
    let backend = ScriptedBackend::spelling("ab")
        .on_cuda()
        .with_memory(MemoryUse {
            weights: 1000,
            kv_cache: 0,
            scratch: 0,
        });
    let opts = Opts {
        residency_check: Some(Duration::from_millis(50)),
        ..Opts::default()
    };
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
    let backend = ScriptedBackend::spelling("abc")
        .on_cuda()
        .failing_at(1, || BackendError::KernelLaunchFailed("k".into()));
    let h = start(backend, Opts::default()).await;
    let frames = h.run(json!({"job_id": "k", "prompt": "x"})).await;
    check_grammar(&frames);
    assert_eq!(frames.last().unwrap().data["code"], "CUDA_ERROR");
    assert_eq!(frames.last().unwrap().data["retriable"], false);
    h.shutdown().await;
}

/// Issue 47: a sticky CUDA error (a kernel fault) in one job's step ends
/// every running job and every queued one with one `INFERENCE_FAILED`
/// (retriable) event; `/health` turns unhealthy naming the GPU, new jobs are
/// refused, and the engine thread stops (serving then exits; `cli::serve`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_device_ends_every_job_once() {
    let backend = ScriptedBackend::spelling("abcdefghijklmnopqrstuvwxyz")
        .on_cuda()
        .with_delay(Duration::from_millis(15))
        .with_slots(3)
        .failing_at(6, || BackendError::DeviceLost {
            what: "launching sample_select".into(),
            // What cudarc's error reads as (formatting one needs libcuda).
            source: Arc::new(std::io::Error::other(
                "DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access was encountered\")",
            )),
        });
    let h = start(backend, Opts::default()).await;
    let mut readers = Vec::new();
    for i in 0..5 {
        let mut r = SseReader::new(
            h.execute(json!({"job_id": format!("d{i}"), "prompt": "x"}))
                .await,
        );
        assert_eq!(r.next().await.unwrap().event, "started");
        readers.push(r);
    }
    for (i, r) in readers.into_iter().enumerate() {
        let frames = r.all().await;
        let terminal: Vec<_> = frames
            .iter()
            .filter(|f| f.event == "end" || f.event == "error")
            .collect();
        assert_eq!(terminal.len(), 1, "job d{i}: {frames:?}");
        assert_eq!(terminal[0].event, "error", "job d{i}");
        assert_eq!(terminal[0].data["code"], "INFERENCE_FAILED", "job d{i}");
        assert_eq!(terminal[0].data["retriable"], true, "job d{i}");
        assert!(std::ptr::eq(terminal[0], frames.last().unwrap()));
    }
    let health = h.get_json("/health").await;
    assert_eq!(health["status"], "unhealthy", "{health}");
    assert!(
        health["reason"].as_str().unwrap().contains("GPU failed"),
        "{health}"
    );
    assert!(h.state.engine.status().device_lost());
    assert!(h.state.engine.is_closed(), "no job is taken any more");
    let after = h.execute(json!({"job_id": "after", "prompt": "x"})).await;
    assert_eq!(after.status(), 503);
    assert_eq!(h.state.engine.ledger().jobs(), (5, 5));
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}
