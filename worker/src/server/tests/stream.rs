//! Streams: the event grammar, stop strings, log-probabilities, UTF-8, chat templates, refusals.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_streams_started_tokens_and_end() {
    let h = start(ScriptedBackend::spelling("Hi!"), Opts::default()).await;
    let resp = h
        .execute(json!({"job_id": "j1", "prompt": "hello", "seed": 5}))
        .await;
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
    let ids: Vec<u64> = frames[1..4]
        .iter()
        .map(|f| f.data["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![b'H' as u64, b'i' as u64, b'!' as u64]);
    let end = &frames[4].data;
    assert_eq!(end["stop_reason"], "eos");
    assert!(end.get("stop_sequence").is_none());
    assert!(end["decode_time_ms"].is_u64() && end["first_token_ms"].is_u64());
    assert_eq!(
        h.probe.prompts.lock().unwrap()[0],
        b"hello".iter().map(|&b| b as u32).collect::<Vec<_>>()
    );
    assert_eq!(h.state.engine.ledger().requests(Outcome::Completed), 1);
    assert_eq!(h.state.metrics.tokens_generated(), 3);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_stop_sequences_logprobs_and_chosen_seed() {
    let h = start(ScriptedBackend::spelling("ab\n\ncd"), Opts::default()).await;
    let frames = h
        .run(json!({"job_id": "m", "prompt": "x", "max_tokens": 2}))
        .await;
    assert_eq!(check_grammar(&frames), "ab");
    assert_eq!(frames.last().unwrap().data["stop_reason"], "max_tokens");
    assert!(
        frames[0].data["seed"].is_u64(),
        "a missing seed is chosen and reported"
    );

    let frames = h
        .run(json!({"job_id": "s", "prompt": "x", "stop": ["\n\n"]}))
        .await;
    assert_eq!(check_grammar(&frames), "ab");
    let end = &frames.last().unwrap().data;
    assert_eq!(end["stop_reason"], "stop_sequence");
    assert_eq!(end["stop_sequence"], "\n\n");

    let frames = h
        .run(json!({"job_id": "l", "prompt": "x", "max_tokens": 1, "logprobs": 3}))
        .await;
    let lps = frames[1].data["logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), 3);
    assert_eq!(lps[0]["id"], b'a' as u64);
    assert_eq!(lps[0]["t"], "a");
    let values: Vec<f64> = lps.iter().map(|l| l["logprob"].as_f64().unwrap()).collect();
    assert!(
        values.windows(2).all(|w| w[0] >= w[1]) && values[0] <= 0.0,
        "{values:?}"
    );
    h.shutdown().await;
}

/// M0-W-1824: a 4-byte emoji over 4 byte tokens gives three empty `t` values, then the emoji.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_text_is_whole_utf8() {
    let h = start(ScriptedBackend::spelling("a😀b"), Opts::default()).await;
    let frames = h.run(json!({"job_id": "u", "prompt": "x"})).await;
    let texts: Vec<&str> = frames[1..frames.len() - 1]
        .iter()
        .map(|f| f.data["t"].as_str().unwrap())
        .collect();
    assert_eq!(texts, vec!["a", "", "", "", "😀", "b"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_templated() {
    let h = start(ScriptedBackend::spelling("ok"), Opts::default()).await;
    let frames = h
        .run(json!({"job_id": "c", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(check_grammar(&frames), "ok");
    let prompt = h.probe.prompts.lock().unwrap()[0].clone();
    assert_eq!(
        h.state.tokenizer.decode(&prompt).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    h.shutdown().await;
}

/// M0-W-1302 and EXT-004: refusals are JSON, name the field, and open no stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors() {
    let limits = Limits {
        execute: Caps::execute(None, Some(5)),
        ..Limits::new(16, BYTE_VOCAB_SIZE, 4096)
    };
    let h = start(
        ScriptedBackend::spelling("ok"),
        Opts {
            limits,
            ..Opts::default()
        },
    )
    .await;
    let rows: Vec<(Value, &str)> = vec![
        (json!({"job_id": "", "prompt": "x"}), "job_id"),
        (json!({"job_id": "j"}), "prompt/messages"),
        (
            json!({"job_id": "j", "prompt": "x", "messages": []}),
            "prompt/messages",
        ),
        (
            json!({"job_id": "j", "prompt": "x", "max_tokens": 0}),
            "max_tokens",
        ),
        (
            json!({"job_id": "j", "prompt": "x", "max_tokens": 6}),
            "max_tokens",
        ),
        (
            json!({"job_id": "j", "prompt": "x", "temperature": 2.1}),
            "temperature",
        ),
        (json!({"job_id": "j", "prompt": "x", "top_p": 1.5}), "top_p"),
        (
            json!({"job_id": "j", "prompt": "x", "top_k": BYTE_VOCAB_SIZE + 1}),
            "top_k",
        ),
        (
            json!({"job_id": "j", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
        ),
        (json!({"job_id": "j", "prompt": "x", "seed": -1}), "seed"),
        (json!({"job_id": "j", "prompt": "x".repeat(17)}), "prompt"),
        (
            json!({"job_id": "j", "messages": [{"role": "alien", "content": "x"}]}),
            "messages",
        ),
        (
            json!({"job_id": "j", "prompt": "x", "bogus": true}),
            "bogus",
        ),
        (
            json!({"job_id": "j", "prompt": "x", "max_tokens": "5"}),
            "max_tokens",
        ),
    ];
    for (body, field) in rows {
        let resp = h.execute(body.clone()).await;
        assert_eq!(resp.status(), 400, "{body}");
        assert_eq!(resp.headers()["content-type"], "application/json");
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["code"], "INVALID_REQUEST", "{body}");
        assert_eq!(err["retriable"], false);
        assert!(
            err["message"].as_str().unwrap().contains(field),
            "{body}: {err}"
        );
    }

    let url = format!("{}/execute", h.base);
    let raw = |ct: &'static str, body: Vec<u8>| {
        h.client
            .post(&url)
            .header("content-type", ct)
            .body(body)
            .send()
    };
    let cases: Vec<(reqwest::Response, u16)> = vec![
        (
            raw("application/json", b"{\"job_id\": \"j\", ".to_vec())
                .await
                .unwrap(),
            400,
        ),
        (
            raw(
                "application/json",
                b"{\"job_id\": \"j\xff\xfe\", \"prompt\": \"x\"}".to_vec(),
            )
            .await
            .unwrap(),
            400,
        ),
        (
            raw("text/plain", br#"{"job_id": "j", "prompt": "x"}"#.to_vec())
                .await
                .unwrap(),
            400,
        ),
        (
            raw("application/json", vec![b' '; MAX_BODY_BYTES + 1])
                .await
                .unwrap(),
            413,
        ),
        (
            raw("application/json", b"[1, 2]".to_vec()).await.unwrap(),
            400,
        ),
    ];
    for (resp, status) in cases {
        assert_eq!(resp.status().as_u16(), status);
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["code"], "INVALID_REQUEST");
        assert_eq!(err["retriable"], false);
    }
    assert_eq!(
        h.probe.sequences_begun.load(Ordering::SeqCst),
        0,
        "nothing was queued"
    );
    assert_eq!(h.state.engine.ledger().requests(Outcome::Invalid), 19);
    // The worker still serves.
    assert_eq!(h.get_json("/health").await["status"], "healthy");
    assert_eq!(
        check_grammar(
            &h.run(json!({"job_id": "ok", "prompt": "x", "max_tokens": 5}))
                .await
        ),
        "ok"
    );
    h.shutdown().await;
}

/// gpt-oss's harmony format: each token of a message's text names its
/// channel; the structure tokens and headers name none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_tokens_carry_their_channel() {
    use crate::engine::testing::{harmony_byte_tokenizer, HARMONY_IDS};
    let [begin, channel, message, end, _, _] = HARMONY_IDS;
    let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
    let script: Vec<u32> = [
        vec![channel],
        bytes("analysis"),
        vec![message],
        bytes("Hm"),
        vec![end, begin],
        bytes("assistant"),
        vec![channel],
        bytes("final"),
        vec![message],
        bytes("Yes"),
    ]
    .concat();
    let vocab = BYTE_VOCAB_SIZE + HARMONY_IDS.len();
    let opts = Opts {
        tokenizer: Some(harmony_byte_tokenizer()),
        limits: Limits {
            vocab_size: vocab,
            ..Opts::default().limits
        },
        ..Opts::default()
    };
    let h = start(ScriptedBackend::new(script.clone(), vocab), opts).await;
    let frames = h.run(json!({"job_id": "h", "prompt": "x"})).await;
    let channels: Vec<(u64, Option<&str>)> = frames
        .iter()
        .filter(|f| f.event == "token")
        .map(|f| (f.data["id"].as_u64().unwrap(), f.data["channel"].as_str()))
        .collect();
    assert_eq!(channels.len(), script.len());
    let of = |text: &str| -> Vec<Option<&str>> {
        channels
            .iter()
            .filter(|(id, _)| text.bytes().any(|b| u64::from(b) == *id))
            .map(|(_, c)| *c)
            .collect()
    };
    assert_eq!(of("H"), [Some("analysis")]);
    assert_eq!(of("Y"), [Some("final")]);
    let structure = channels
        .iter()
        .filter(|(id, _)| HARMONY_IDS.contains(&(*id as u32)));
    assert!(structure.clone().count() == 6 && structure.clone().all(|(_, c)| c.is_none()));
    h.shutdown().await;
}
