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
    assert_eq!(h.state.engine.ledger().requests(Outcome::Rejected), 1);
    // Three accepted, three ended; the full queue's and the duplicate's refusals are neither.
    assert_eq!(h.state.engine.ledger().jobs(), (3, 3));
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
    assert_eq!(h.state.engine.ledger().requests(Outcome::Cancelled), 1);
    assert_eq!(h.state.engine.ledger().jobs(), (1, 1));
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
    assert_eq!(h.state.engine.ledger().requests(Outcome::Disconnected), 1);
    assert_eq!(
        h.state.engine.ledger().jobs(),
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
    assert_eq!(h.state.engine.ledger().requests(Outcome::Timeout), 1);
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

/// Issue 18: with three slots, three jobs run alongside (every one streams
/// before any ends, their decode steps batched), each gets its own whole
/// answer and one terminal event; a fourth waits for a free slot, and the
/// queue in front still refuses with 503 when full. `/health` shows the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_slots_run_jobs_alongside() {
    let backend = ScriptedBackend::spelling("abcdef")
        .with_delay(Duration::from_millis(20))
        .with_slots(3);
    let h = start(
        backend,
        Opts {
            queue_depth: 1,
            ..Opts::default()
        },
    )
    .await;
    let health = h.get_json("/health").await;
    assert_eq!(
        (
            &health["slots_total"],
            &health["slots_busy"],
            &health["slots_free"]
        ),
        (&json!(3), &json!(0), &json!(3))
    );
    let mut readers = Vec::new();
    for i in 0..3 {
        let mut r = SseReader::new(
            h.execute(json!({"job_id": format!("p{i}"), "prompt": format!("{i}")}))
                .await,
        );
        assert_eq!(r.next().await.unwrap().event, "started");
        readers.push(r);
    }
    // Each of the three streams a token while all three run.
    for r in &mut readers {
        assert_eq!(r.next().await.unwrap().event, "token");
    }
    let health = h.get_json("/health").await;
    assert_eq!(
        (&health["slots_busy"], &health["slots_free"]),
        (&json!(3), &json!(0))
    );
    // A fourth waits (one place in the queue), a fifth is refused.
    let fourth = h.execute(json!({"job_id": "p3", "prompt": "3"})).await;
    assert_eq!(fourth.status(), 200);
    let full = h.execute(json!({"job_id": "p4", "prompt": "4"})).await;
    assert_eq!(full.status(), 503);
    assert!(full.headers().contains_key("retry-after"));

    let mut ends = Vec::new();
    for r in readers {
        let rest = r.all().await;
        ends.push(rest.last().unwrap().event.clone());
        let tokens: String = rest
            .iter()
            .filter(|f| f.event == "token")
            .map(|f| f.data["t"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(tokens.len(), 5, "the other five of six tokens: {rest:?}");
    }
    assert_eq!(ends, ["end", "end", "end"]);
    let frames = SseReader::new(fourth).all().await;
    assert_eq!(check_grammar(&frames), "abcdef");
    assert_eq!(h.probe.most_open.load(Ordering::SeqCst), 3);
    let rows = h.probe.decode_rows.lock().unwrap().clone();
    assert!(rows.contains(&3), "steps batched three jobs: {rows:?}");
    assert_eq!(h.state.engine.ledger().jobs(), (4, 4));
    // The engine counts a job out just after its terminal event goes.
    let mut metrics = String::new();
    for _ in 0..50 {
        metrics = h
            .client
            .get(format!("{}/metrics", h.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains("worker_running_jobs 0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(metrics.contains("worker_slots 3"), "{metrics}");
    assert!(metrics.contains("worker_running_jobs 0"), "{metrics}");
    assert!(metrics.contains("worker_batch_rows_count"), "{metrics}");
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// Issue 18: among jobs running together, a cancelled one, one whose client
/// leaves and one whose step panics each end alone, with their own terminal
/// event; the others finish whole, and every slot's sequence is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_jobs_end_alone() {
    let backend = ScriptedBackend::spelling("abcdefghijklmnop")
        .with_delay(Duration::from_millis(15))
        .with_slots(4);
    let h = start(backend, Opts::default()).await;
    let mut readers = Vec::new();
    for i in 0..4 {
        let mut r = SseReader::new(
            h.execute(json!({"job_id": format!("e{i}"), "prompt": "x"}))
                .await,
        );
        assert_eq!(r.next().await.unwrap().event, "started");
        assert_eq!(r.next().await.unwrap().event, "token");
        readers.push(r);
    }
    let gone = readers.pop().unwrap();
    drop(gone);
    assert_eq!(
        h.post("/cancel", json!({"job_id": "e2"})).await.status(),
        202
    );
    let mut last = Vec::new();
    for r in readers {
        let frames = r.all().await;
        last.push(frames.last().unwrap().clone());
    }
    assert_eq!(last[0].event, "end");
    assert_eq!(last[1].event, "end");
    assert_eq!(last[2].event, "error");
    assert_eq!(last[2].data["code"], "CANCELLED");
    // Every accepted job ended once, the vanished client's included.
    for _ in 0..50 {
        if h.state.engine.ledger().jobs() == (4, 4) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.state.engine.ledger().jobs(), (4, 4));
    assert_eq!(h.state.engine.ledger().requests(Outcome::Disconnected), 1);
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// Issue 18: a panic in one job's prefill ends that job with INTERNAL; the
/// job beside it goes on to its end, and the engine keeps serving. (A panic
/// in a batched decode step ends every job of the step: it cannot tell whose
/// row it was.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_ends_only_its_own_parallel_job() {
    let backend = ScriptedBackend::spelling("abcdefgh")
        .with_delay(Duration::from_millis(10))
        .with_slots(2)
        .panicking_at(0);
    let h = start(backend, Opts::default()).await;
    let (a, b) = tokio::join!(
        h.run(json!({"job_id": "k0", "prompt": "x"})),
        h.run(json!({"job_id": "k1", "prompt": "y"}))
    );
    let mut ends: Vec<String> = [&a, &b]
        .iter()
        .map(|f| {
            let last = f.last().unwrap();
            match last.event.as_str() {
                "error" => last.data["code"].as_str().unwrap().to_string(),
                e => e.to_string(),
            }
        })
        .collect();
    ends.sort();
    assert_eq!(ends, ["INTERNAL", "end"]);
    let again = h.run(json!({"job_id": "k2", "prompt": "z"})).await;
    assert_eq!(check_grammar(&again), "abcdefgh");
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}

/// Issue 18: with four slots but room for two sequences' KV caches, the
/// third and fourth jobs wait for room (first in line) instead of failing:
/// at most two run at once, every job ends whole, and the one cancelled
/// while it waits ends at once, unrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_wait_for_kv_room_instead_of_failing() {
    let backend = ScriptedBackend::spelling("abcdefghij")
        .with_delay(Duration::from_millis(15))
        .with_slots(4)
        .with_room(2);
    let h = start(backend, Opts::default()).await;
    let mut readers = Vec::new();
    for i in 0..4 {
        let r = SseReader::new(
            h.execute(json!({"job_id": format!("r{i}"), "prompt": "x"}))
                .await,
        );
        readers.push(r);
    }
    // r0 and r1 run; r2 waits for room, r3 behind it.
    for r in readers.iter_mut().take(2) {
        assert_eq!(r.next().await.unwrap().event, "started");
        assert_eq!(r.next().await.unwrap().event, "token");
    }
    assert_eq!(
        h.post("/cancel", json!({"job_id": "r2"})).await.status(),
        202
    );
    let mut ends = Vec::new();
    for (i, r) in readers.into_iter().enumerate() {
        let frames = r.all().await;
        if i == 2 {
            assert_eq!(
                frames.last().unwrap().data["code"],
                "CANCELLED",
                "{frames:?}"
            );
            assert!(frames.iter().all(|f| f.event != "token"), "r2 never ran");
        } else {
            ends.push(frames.last().unwrap().event.clone());
        }
    }
    assert_eq!(ends, ["end", "end", "end"]);
    assert_eq!(h.probe.most_open.load(Ordering::SeqCst), 2);
    assert_eq!(h.probe.sequences_begun.load(Ordering::SeqCst), 3);
    let probe = h.probe.clone();
    h.shutdown().await;
    assert_eq!(h_probe_balance(&probe), 0);
}
