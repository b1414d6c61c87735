//! Jobs in the queue: order, refusal when full, cancel, disconnect, timeout, concurrency.

use super::*;

/// EXT-003 and M0-W-1301: one job at a time, FIFO, 503 + Retry-After when full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_runs_jobs_in_order_and_refuses_when_full() {
    let backend = ScriptedBackend::spelling("abcdef").with_delay(Duration::from_millis(20));
    let h = start(
        backend,
        Opts {
            queue_depth: 2,
            ..Opts::default()
        },
    )
    .await;
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
    assert_eq!(
        h.execute(json!({"job_id": "q1", "prompt": "1"}))
            .await
            .status(),
        400
    );

    let (a, b, c) = tokio::join!(
        first.all(),
        SseReader::new(second).all(),
        SseReader::new(third).all()
    );
    assert_eq!(a.last().unwrap().event, "end");
    for frames in [&b, &c] {
        assert_eq!(check_grammar(frames), "abcdef");
    }
    let prompts = h.probe.prompts.lock().unwrap().clone();
    assert_eq!(
        prompts,
        vec![vec![b'0' as u32], vec![b'1' as u32], vec![b'2' as u32]]
    );
    assert_eq!(h.state.metrics.requests(Outcome::Rejected), 1);
    // Three accepted, three ended; the full queue's and the duplicate's refusals are neither.
    assert_eq!(h.state.metrics.jobs(), (3, 3));
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
    assert_eq!(
        h.post("/cancel", json!({"job_id": "run"})).await.status(),
        202
    );
    assert_eq!(
        h.post("/cancel", json!({"job_id": "never"})).await.status(),
        202
    );
    assert_eq!(h.post("/cancel", json!({})).await.status(), 400);
    assert_eq!(h.state.metrics.requests(Outcome::Cancelled), 1);
    assert_eq!(h.state.metrics.jobs(), (1, 1));
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
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
    let resp: Value = h
        .post("/cancel", json!({"job_id": "two"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(resp["state"], "queued");
    let frames = tokio::time::timeout(Duration::from_millis(500), second.all())
        .await
        .expect("ended at once");
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0].event, "started");
    assert_eq!(frames[1].data["code"], "CANCELLED");
    assert_eq!(frames[1].data["retriable"], false);
    let rest = first.all().await;
    assert_eq!(rest.last().unwrap().event, "end");
    assert_eq!(
        h.probe.prompts.lock().unwrap().len(),
        1,
        "the cancelled job never ran"
    );
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
    let frames = h
        .run(json!({"job_id": "next", "prompt": "x", "max_tokens": 3}))
        .await;
    assert_eq!(check_grammar(&frames), "abc");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "the next job waited {:?}",
        t.elapsed()
    );
    assert_eq!(h.state.metrics.requests(Outcome::Disconnected), 1);
    assert_eq!(
        h.state.metrics.jobs(),
        (2, 2),
        "the vanished client's job ended too"
    );
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// M0-W-1510: a slow job hits the inference timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_job_times_out() {
    let h = start(
        long_backend(),
        Opts {
            timeout: Duration::from_millis(300),
            ..Opts::default()
        },
    )
    .await;
    let frames = h.run(json!({"job_id": "slow", "prompt": "x"})).await;
    check_grammar(&frames);
    let last = &frames.last().unwrap().data;
    assert_eq!(last["code"], "INFERENCE_TIMEOUT");
    assert_eq!(last["retriable"], false);
    assert!(last["message"].is_string());
    assert_eq!(h.state.metrics.requests(Outcome::Timeout), 1);
    h.shutdown().await;
}

/// EXT-003's check: depth 2, four jobs at once: three accepted and each ends
/// once; one gets 503 with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_jobs_at_once_with_depth_two() {
    let backend = ScriptedBackend::spelling("abc").with_delay(Duration::from_millis(20));
    let h = start(
        backend,
        Opts {
            queue_depth: 2,
            ..Opts::default()
        },
    )
    .await;
    let posts =
        (0..4).map(|n| h.execute(json!({"job_id": format!("j{n}"), "prompt": n.to_string()})));
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
