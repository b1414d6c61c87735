//! The OpenAI routes (issue 16) over the real router, queue and engine: both
//! endpoints streaming and not, the shared limits and refusals in OpenAI's
//! error shape, cancel on disconnect, and the OpenAPI document.

use super::*;

/// The `data:` payloads of a finished OpenAI stream (`[DONE]` as a string).
async fn data_lines(resp: reqwest::Response) -> Vec<Value> {
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.to_string())))
        .collect()
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "scripted", "messages": [{"role": "user", "content": "hello"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_answers_whole_and_streamed() {
    let h = start(ScriptedBackend::spelling("Hi!"), Opts::default()).await;
    let resp = h
        .post("/v1/chat/completions", chat(json!({"seed": 3})))
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "scripted");
    assert_eq!(v["choices"][0]["message"]["content"], "Hi!");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let prompt_tokens = h.probe.prompts.lock().unwrap()[0].len() as u64;
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 3);

    let body =
        chat(json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 2}));
    let lines = data_lines(h.post("/v1/chat/completions", body).await).await;
    assert_eq!(lines.last().unwrap(), "[DONE]");
    assert_eq!(lines[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = lines
        .iter()
        .filter_map(|l| l["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hi");
    let finish = &lines[lines.len() - 3];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(lines[lines.len() - 2]["usage"]["completion_tokens"], 2);
    assert_eq!(h.state.engine.ledger().requests(Outcome::Completed), 2);
    h.shutdown().await;
}

/// `n` choices (issue 43): a job each, queued together; the whole answer
/// lists them by index, the stream interleaves their chunks and ends with
/// one usage chunk and one `[DONE]`; usage counts the prompt once and every
/// choice's tokens; more than the queue can hold is refused naming `n`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_whole_and_streamed() {
    let h = start(ScriptedBackend::spelling("Hi!"), Opts::default()).await;
    let v: Value = h
        .post("/v1/chat/completions", chat(json!({"n": 3, "seed": 3})))
        .await
        .json()
        .await
        .unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], "Hi!");
    }
    let prompt_tokens = h.probe.prompts.lock().unwrap()[0].len() as u64;
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 9);

    let body = chat(json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}}));
    let lines = data_lines(h.post("/v1/chat/completions", body).await).await;
    assert_eq!(lines.last().unwrap(), "[DONE]");
    assert_eq!(lines.iter().filter(|l| *l == "[DONE]").count(), 1);
    for i in 0..2 {
        let of_choice = |l: &&Value| l["choices"][0]["index"] == i;
        let text: String = lines
            .iter()
            .filter(of_choice)
            .filter_map(|l| l["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hi!", "choice {i}");
        let finishes = lines
            .iter()
            .filter(of_choice)
            .filter(|l| l["choices"][0]["finish_reason"] == "stop")
            .count();
        assert_eq!(finishes, 1, "choice {i}");
    }
    let usage: Vec<&Value> = lines.iter().filter(|l| l["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0]["usage"]["completion_tokens"], 6);
    assert_eq!(lines[lines.len() - 2], *usage[0], "the usage comes last");

    let body = json!({"model": "scripted", "prompt": "x", "n": 2});
    let v: Value = h.post("/v1/completions", body).await.json().await.unwrap();
    assert_eq!(v["choices"][1]["index"], 1);
    assert_eq!(v["choices"][1]["text"], "Hi!");
    assert_eq!(v["usage"]["completion_tokens"], 6);

    // Four waiting behind one running: at most five jobs at once.
    let resp = h.post("/v1/chat/completions", chat(json!({"n": 6}))).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["param"], "n");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 5"));
    assert_eq!(h.state.engine.ledger().requests(Outcome::Completed), 7);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_take_text_or_ids_and_stop_strings() {
    let h = start(ScriptedBackend::spelling("ab\n\ncd"), Opts::default()).await;
    let body = json!({"model": "scripted", "prompt": [[104, 105]], "stop": "\n\n", "logprobs": 1});
    let v: Value = h.post("/v1/completions", body).await.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "ab");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(h.probe.prompts.lock().unwrap()[0], vec![104, 105]);
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"][0], "a");
    assert!(lp["token_logprobs"][0].as_f64().unwrap() <= 0.0);

    let body = json!({"model": "scripted", "prompt": "x", "stream": true});
    let lines = data_lines(h.post("/v1/completions", body).await).await;
    let text: String = lines
        .iter()
        .filter_map(|l| l["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "ab\n\ncd");
    assert_eq!(lines.last().unwrap(), "[DONE]");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_openai_errors_with_execute_statuses() {
    let backend = ScriptedBackend::spelling("abcdef").with_delay(Duration::from_millis(50));
    let opts = Opts {
        queue_depth: 1,
        ..Opts::default()
    };
    let h = start(backend, opts).await;
    let resp = h
        .post("/v1/chat/completions", chat(json!({"temperature": 3})))
        .await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["param"], "temperature");
    let resp = h
        .post("/v1/chat/completions", chat(json!({"tools": {}})))
        .await;
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"]["param"],
        "tools"
    );
    let resp = h
        .post("/v1/completions", json!({"model": "other", "prompt": "x"}))
        .await;
    assert_eq!(resp.status(), 404);
    let resp = h
        .post(
            "/v1/completions",
            json!({"model": "scripted", "prompt": [300]}),
        )
        .await;
    assert_eq!(resp.status(), 400, "an id outside the vocabulary");

    let big = "x".repeat(MAX_BODY_BYTES + 1);
    let resp = h
        .post(
            "/v1/completions",
            json!({"model": "scripted", "prompt": big}),
        )
        .await;
    assert_eq!(resp.status(), 413);
    assert!(resp.json::<Value>().await.unwrap()["error"]["message"].is_string());

    // One running, one queued, the next refused: 503 with Retry-After.
    let running = h.post(
        "/v1/completions",
        json!({"model": "scripted", "prompt": "1", "stream": true}),
    );
    let running = running.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued = h.post(
        "/v1/completions",
        json!({"model": "scripted", "prompt": "2", "stream": true}),
    );
    let queued = queued.await;
    let full = h
        .post(
            "/v1/completions",
            json!({"model": "scripted", "prompt": "3"}),
        )
        .await;
    assert_eq!(full.status(), 503);
    assert!(full.headers().contains_key("retry-after"));
    assert_eq!(
        full.json::<Value>().await.unwrap()["error"]["code"],
        "queue_full"
    );
    drop((running, queued));
    assert!(h.state.engine.ledger().requests(Outcome::Invalid) >= 5);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_cancels_its_job() {
    let h = start(long_backend(), Opts::default()).await;
    let resp = h
        .post("/v1/chat/completions", chat(json!({"stream": true})))
        .await;
    let mut body = resp.bytes_stream();
    for _ in 0..3 {
        body.next().await.unwrap().unwrap();
    }
    drop(body);
    let t = Instant::now();
    while h.state.engine.ledger().requests(Outcome::Disconnected) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the job was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.shutdown().await;
}

/// A non-streaming client waits for the whole answer; when it gives up, the
/// handler's future is dropped with its event stream, which cancels the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_a_whole_answer_cancels_its_job() {
    let h = start(long_backend(), Opts::default()).await;
    let body = json!({"model": "scripted", "prompt": "x", "max_tokens": 2000});
    let waited =
        tokio::time::timeout(Duration::from_millis(300), h.post("/v1/completions", body)).await;
    assert!(
        waited.is_err(),
        "the answer came before the job could have ended"
    );
    let t = Instant::now();
    while h.state.engine.ledger().requests(Outcome::Disconnected) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the job was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_the_openapi_document_are_served() {
    let h = start(ScriptedBackend::spelling("a"), Opts::default()).await;
    let models = h.get_json("/v1/models").await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "scripted");
    assert_eq!(models["data"][0]["owned_by"], "worker-orcd");
    assert!(models["data"][0]["created"].as_u64().unwrap() > 1_700_000_000);
    let doc = h.get_json("/openapi.json").await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["paths"]["/v1/chat/completions"]["post"].is_object());
    h.shutdown().await;
}

/// The byte tokenizer with Qwen2.5's chat template, over a script that
/// spells `reply` (the prompt, long with tools, in one prefill call: each
/// forward call takes a step of the script).
async fn qwen_worker(reply: &str) -> Harness {
    let template = include_str!("../../tokenizer/testdata/qwen2.5-instruct.jinja");
    let spec = crate::engine::testing::byte_vocab_spec(Some(template));
    let opts = Opts {
        tokenizer: Some(Arc::new(
            crate::tokenizer::Tokenizer::from_spec(spec).unwrap(),
        )),
        ..Opts::default()
    };
    start(
        ScriptedBackend::spelling(reply).with_prefill_chunk(4096),
        opts,
    )
    .await
}

const WEATHER_CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

/// A conversation with a finished call and its result, and the tool.
fn with_tools(extra: Value) -> Value {
    let mut body = chat(json!({
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    }));
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_whole_and_streamed() {
    let h = qwen_worker(WEATHER_CALL).await;
    let v: Value = h
        .post("/v1/chat/completions", with_tools(json!({})))
        .await
        .json()
        .await
        .unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    // The template saw the tools and the earlier round trip.
    let prompt = h.probe.prompts.lock().unwrap()[0].clone();
    let prompt = h.state.tokenizer.decode(&prompt).unwrap();
    assert!(
        prompt.contains("<tools>\n{\"type\": \"function\""),
        "{prompt}"
    );
    assert!(prompt.contains("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"));
    assert!(prompt.contains("<tool_response>\n18 C\n</tool_response>"));

    let lines = data_lines(
        h.post("/v1/chat/completions", with_tools(json!({"stream": true})))
            .await,
    )
    .await;
    let deltas: Vec<&Value> = lines
        .iter()
        .filter_map(|l| l.get("choices")?.get(0))
        .map(|c| &c["delta"])
        .collect();
    assert!(
        deltas
            .iter()
            .all(|d| d["content"].as_str().is_none_or(str::is_empty)),
        "{lines:?}"
    );
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
    assert_eq!(calls.len(), 2, "{lines:?}");
    let head = &calls[0][0];
    assert_eq!(
        (head["index"].as_u64(), head["type"].as_str()),
        (Some(0), Some("function"))
    );
    assert_eq!(
        head["function"],
        json!({"name": "get_weather", "arguments": ""})
    );
    assert!(head["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        calls[1][0],
        json!({"index": 0, "function": {"arguments": "{\"city\":\"Paris\"}"}})
    );
    assert_eq!(
        lines[lines.len() - 2]["choices"][0]["finish_reason"],
        "tool_calls"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_none_leaves_the_text_and_bad_tools_are_refused() {
    let h = qwen_worker(WEATHER_CALL).await;
    let v: Value = h
        .post(
            "/v1/chat/completions",
            with_tools(json!({"tool_choice": "none"})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], WEATHER_CALL);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    for (extra, param) in [
        (
            json!({"tools": [{"type": "function", "function": {"name": "get weather"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "other"}}}),
            "tool_choice",
        ),
        // Parameters the grammar of the calls cannot enforce: the client
        // sent tools, not a grammar.
        (
            json!({"tool_choice": "required", "tools": [{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object", "properties": {
                    "a": {"type": "array", "uniqueItems": true}}}}}]}),
            "tools",
        ),
    ] {
        let resp = h.post("/v1/chat/completions", with_tools(extra)).await;
        assert_eq!(resp.status(), 400);
        let e: Value = resp.json().await.unwrap();
        assert_eq!(e["error"]["param"], param, "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
    }
    // A tool result without the call it answers is named by validation.
    let body = chat(json!({"messages": [{"role": "tool", "content": "18 C"}]}));
    let e: Value = h
        .post("/v1/chat/completions", body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(e["error"]["param"], "messages", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tool_call_id"),
        "{e}"
    );
    h.shutdown().await;
}

/// Qwen3 (issue 46): `chat_template_kwargs` reach its template
/// (`enable_thinking` false closes an empty think block in the prompt); a
/// think block in the answer is `reasoning_content`, whole and streamed, and
/// the `analysis` channel of `/execute`'s token events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen3_think_blocks_are_reasoning_content() {
    use crate::engine::testing::{think_byte_tokenizer, THINK_CLOSE_ID, THINK_OPEN_ID};
    let bytes = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
    let script: Vec<u32> = [
        vec![THINK_OPEN_ID],
        bytes("\nHm\n"),
        vec![THINK_CLOSE_ID],
        bytes("\n\nYes"),
    ]
    .concat();
    let vocab = BYTE_VOCAB_SIZE + 2;
    let opts = Opts {
        tokenizer: Some(think_byte_tokenizer()),
        limits: Limits {
            vocab_size: vocab,
            ..Opts::default().limits
        },
        ..Opts::default()
    };
    let h = start(ScriptedBackend::new(script, vocab), opts).await;
    let body = chat(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    let v: Value = h
        .post("/v1/chat/completions", body)
        .await
        .json()
        .await
        .unwrap();
    let closed = [
        &bytes("assistant\n")[..],
        &[THINK_OPEN_ID],
        &bytes("\n\n"),
        &[THINK_CLOSE_ID],
        &bytes("\n\n"),
    ]
    .concat();
    assert!(h.probe.prompts.lock().unwrap()[0].ends_with(&closed));
    let message = &v["choices"][0]["message"];
    assert_eq!(
        (&message["content"], &message["reasoning_content"]),
        (&json!("Yes"), &json!("Hm"))
    );

    let lines = data_lines(
        h.post("/v1/chat/completions", chat(json!({"stream": true})))
            .await,
    )
    .await;
    let part = |key: &str| -> String {
        lines
            .iter()
            .filter_map(|l| l["choices"][0]["delta"][key].as_str())
            .collect()
    };
    assert_eq!(
        (part("reasoning_content"), part("content")),
        ("Hm".into(), "Yes".into())
    );

    let bad = chat(json!({"chat_template_kwargs": {"tools": []}}));
    let resp = h.post("/v1/chat/completions", bad).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["param"], "chat_template_kwargs", "{e}");

    let frames = h
        .run(json!({"job_id": "t", "prompt": "Q", "max_tokens": 4}))
        .await;
    let channels: Vec<Option<&str>> = frames
        .iter()
        .filter(|f| f.event == "token")
        .map(|f| f.data["channel"].as_str())
        .collect();
    assert_eq!(
        channels,
        [None, Some("analysis"), Some("analysis"), Some("analysis")]
    );
    h.shutdown().await;
}
