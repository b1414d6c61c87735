//! Constrained output (issue #43) over the real router and engine: the
//! scripted backend spells text that breaks the constraint, and what comes
//! out keeps to it anyway, on `/execute` and on both OpenAI routes; specs that
//! cannot be enforced are refused naming their field.

use super::*;

/// The text of a whole chat answer.
async fn chat_text(h: &Harness, body: Value) -> (String, Value) {
    let resp = h.post("/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    (text, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_keeps_to_a_regex_a_schema_and_a_grammar() {
    let h = start(ScriptedBackend::spelling("Hello!"), Opts::default()).await;
    let cases = [
        (json!({"regex": "[0-9]{3}-[a-z]{2}"}), "regex"),
        (
            json!({"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                   "required": ["ok"], "additionalProperties": false}}),
            "json",
        ),
        (
            json!({"grammar": "start: (\"yes\" | \"no\") \"!\""}),
            "lark",
        ),
    ];
    for (field, kind) in cases {
        for seed in [1, 2] {
            let mut body = json!({"job_id": format!("{kind}-{seed}"), "prompt": "hi",
                                  "temperature": 1.0, "seed": seed});
            body.as_object_mut()
                .unwrap()
                .extend(field.as_object().unwrap().clone());
            let frames = SseReader::new(h.execute(body).await).all().await;
            let text = check_grammar(&frames);
            let end = &frames.last().unwrap().data;
            assert_eq!(end["stop_reason"], "eos", "{kind}: {text:?}");
            let b = text.as_bytes();
            match kind {
                "regex" => {
                    assert_eq!(b.len(), 6, "{text:?}");
                    assert!(
                        b[..3].iter().all(u8::is_ascii_digit) && b[3] == b'-',
                        "{text:?}"
                    );
                    assert!(b[4..].iter().all(u8::is_ascii_lowercase), "{text:?}");
                }
                "json" => {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    assert!(v["ok"].is_boolean() && v.as_object().unwrap().len() == 1);
                }
                _ => assert!(text == "yes!" || text == "no!", "{text:?}"),
            }
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_response_formats_are_enforced() {
    let h = start(ScriptedBackend::spelling("Hi there"), Opts::default()).await;
    let schema = json!({"type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 8},
                                       "rank": {"enum": [1, 2, 3]}},
                        "required": ["city", "rank"], "additionalProperties": false});
    let format = json!({"type": "json_schema",
                        "json_schema": {"name": "place", "schema": schema, "strict": true}});
    for seed in 0..4 {
        let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "x"}],
                          "response_format": format, "temperature": 1.0, "seed": seed});
        let (text, v) = chat_text(&h, body).await;
        let out: Value = serde_json::from_str(&text).unwrap();
        assert!(out["city"].as_str().unwrap().chars().count() <= 8, "{text}");
        assert!([1, 2, 3].contains(&out["rank"].as_i64().unwrap()), "{text}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "x"}],
                      "response_format": {"type": "json_object"}, "seed": 1});
    let (text, _) = chat_text(&h, body).await;
    assert!(
        serde_json::from_str::<Value>(&text).unwrap().is_object(),
        "{text}"
    );
    let resp = h
        .post(
            "/v1/completions",
            json!({"model": "scripted", "prompt": "x", "max_tokens": 30,
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "n", "schema": {"enum": ["up", "down"]}}}}),
        )
        .await;
    let v: Value = resp.json().await.unwrap();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text == "\"up\"" || text == "\"down\"", "{text}");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_that_cannot_be_enforced_are_refused_by_field() {
    let h = start(ScriptedBackend::spelling("ok"), Opts::default()).await;
    let rows = [
        (
            json!({"json_schema": {"type": "array", "uniqueItems": true}}),
            "json_schema",
            "uniqueItems",
        ),
        (json!({"json_schema": 5}), "json_schema", "object"),
        (json!({"regex": "(a"}), "regex", "regex"),
        (json!({"grammar": "start: nowhere"}), "grammar", "nowhere"),
        (
            json!({"regex": "a", "grammar": "start: \"a\""}),
            "grammar",
            "at most one",
        ),
        (json!({"regex": "x".repeat(70_000)}), "regex", "bytes"),
    ];
    for (extra, field, says) in rows {
        let mut body = json!({"job_id": "j", "prompt": "x"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let resp = h.execute(body).await;
        assert_eq!(resp.status(), 400, "{extra}");
        let err: Value = resp.json().await.unwrap();
        let message = err["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains(says),
            "{extra}: {err}"
        );
    }
    let resp = h
        .post(
            "/v1/chat/completions",
            json!({"model": "scripted", "messages": [{"role": "user", "content": "x"}],
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "n", "schema": {"type": "strnig"}}}}),
        )
        .await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["param"], "json_schema", "{e}");
    let resp = h
        .post(
            "/v1/chat/completions",
            json!({"model": "scripted", "messages": [{"role": "user", "content": "x"}],
                   "ignore_eos": true, "response_format": {"type": "json_object"}}),
        )
        .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(h.state.engine.ledger().requests(Outcome::Completed), 0);
    h.shutdown().await;
}
