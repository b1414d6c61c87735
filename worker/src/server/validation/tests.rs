use super::*;
use crate::engine::testing::{byte_tokenizer, BYTE_VOCAB_SIZE};

const LIMITS: Limits = Limits::new(64, BYTE_VOCAB_SIZE, 128);

fn base() -> serde_json::Value {
    serde_json::json!({"job_id": "j1", "prompt": "hello"})
}

fn run(body: serde_json::Value, limits: &Limits) -> Result<ValidExecuteRequest, ValidationErrors> {
    let req: ExecuteRequest = serde_json::from_value(body).expect("parses");
    validate(req, limits, &byte_tokenizer(), || 7)
}

fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut b = base();
    b[field] = value;
    b
}

#[test]
fn defaults_are_filled_in() {
    let v = run(base(), &LIMITS).unwrap();
    assert_eq!(v.job_id, "j1");
    assert_eq!(
        v.prompt_tokens,
        b"hello".iter().map(|&b| b as u32).collect::<Vec<_>>()
    );
    // Default 2048 shrinks to the room left in the 128-token context.
    assert_eq!(v.max_tokens, 128 - 5);
    assert_eq!(v.sampling.temperature, 1.0);
    assert_eq!(v.sampling.top_p, 1.0);
    assert_eq!(v.sampling.top_k, 0);
    assert_eq!(v.sampling.min_p, 0.0);
    assert_eq!(v.sampling.repetition_penalty, 1.0);
    assert_eq!(v.sampling.seed, 7);
    assert!(!v.seed_given);
    assert_eq!(v.logprobs, 0);
    assert!(v.stop.is_empty());
    assert_eq!(v.prompt_chars, 5);
    assert_eq!(v.prompt_sha256, sha256_hex("hello"));
    let big = Limits {
        context_length: 8192,
        max_tokens_in: 8192,
        ..LIMITS
    };
    assert_eq!(
        run(base(), &big).unwrap().max_tokens,
        DEFAULT_MAX_TOKENS_OUT
    );
    let capped = Limits {
        execute: Caps::execute(None, Some(5)),
        ..big
    };
    assert_eq!(run(base(), &capped).unwrap().max_tokens, 5);
}

#[test]
fn all_fields_pass_through() {
    let body = serde_json::json!({
        "job_id": "j", "prompt": "hi", "max_tokens": 10, "temperature": 0.7, "top_p": 0.9,
        "top_k": 40, "repetition_penalty": 1.1, "min_p": 0.05, "stop": ["\n\n", "END"],
        "seed": u64::MAX, "logprobs": 20
    });
    let v = run(body, &LIMITS).unwrap();
    assert_eq!(v.max_tokens, 10);
    assert_eq!(v.sampling.temperature, 0.7);
    assert_eq!(v.sampling.top_k, 40);
    assert_eq!(v.sampling.seed, u64::MAX);
    assert!(v.seed_given);
    assert_eq!(v.stop, vec!["\n\n".to_string(), "END".to_string()]);
    assert_eq!(v.logprobs, 20);
}

#[test]
fn messages_are_rendered_with_the_template() {
    let body = serde_json::json!({"job_id": "j", "messages": [{"role": "user", "content": "hi"}]});
    let v = run(body, &LIMITS).unwrap();
    let tok = byte_tokenizer();
    let text = tok.decode(&v.prompt_tokens).unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(v.prompt_sha256, sha256_hex(&text));
}

/// `reasoning_effort` goes to the template with `messages` (this one does
/// not read it, so the prompt is as without it); another value, or with a
/// `prompt`, is refused naming the field.
#[test]
fn reasoning_effort_is_for_messages_and_three_values() {
    let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
    for effort in REASONING_EFFORTS {
        let body =
            serde_json::json!({"job_id": "j", "messages": messages, "reasoning_effort": effort});
        let v = run(body, &LIMITS).unwrap();
        let text = byte_tokenizer().decode(&v.prompt_tokens).unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
    let rows = [
        serde_json::json!({"job_id": "j", "messages": messages, "reasoning_effort": "max"}),
        serde_json::json!({"job_id": "j", "prompt": "hi", "reasoning_effort": "low"}),
    ];
    for body in rows {
        let e = run(body.clone(), &LIMITS).unwrap_err();
        assert!(e.to_string().contains("reasoning_effort"), "{body}: {e}");
    }
}

/// `chat_template_kwargs` are variables of the template of `messages`:
/// Qwen3's `enable_thinking` false writes an empty think block into the
/// prompt. Not an object, a key that would hide the worker's own variables,
/// or with a `prompt`: refused naming the field (and the key).
#[test]
fn chat_template_kwargs_reach_the_template_of_messages() {
    let tok = crate::engine::testing::think_byte_tokenizer();
    let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
    let render = |kwargs: serde_json::Value| {
        let body = serde_json::json!({"job_id": "j", "messages": messages, "chat_template_kwargs": kwargs});
        let req: ExecuteRequest = serde_json::from_value(body).unwrap();
        validate(req, &LIMITS, &tok, || 7)
    };
    let text = |v: ValidExecuteRequest| tok.decode(&v.prompt_tokens).unwrap();
    let off = text(render(serde_json::json!({"enable_thinking": false})).unwrap());
    assert!(
        off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{off}"
    );
    let on = text(render(serde_json::json!({"enable_thinking": true, "other": [1]})).unwrap());
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on}");
    assert_eq!(text(render(serde_json::Value::Null).unwrap()), on);
    for (kwargs, says) in [
        (serde_json::json!(["enable_thinking"]), "must be an object"),
        (serde_json::json!({"messages": []}), "\"messages\""),
        (serde_json::json!({"namespace": 1}), "\"namespace\""),
    ] {
        let e = render(kwargs.clone()).unwrap_err();
        assert_eq!(e.fields(), ["chat_template_kwargs"], "{kwargs}: {e}");
        assert!(e.to_string().contains(says), "{kwargs}: {e}");
    }
    let body = serde_json::json!({"job_id": "j", "prompt": "hi", "chat_template_kwargs": {}});
    let e = run(body, &LIMITS).unwrap_err();
    assert_eq!(e.fields(), ["chat_template_kwargs"]);
}

/// An assistant message may hold its reasoning (`reasoning_content`, as a
/// reply gave it); another message may not.
#[test]
fn reasoning_content_is_for_assistant_messages() {
    let turn = |role: &str| {
        serde_json::json!({"job_id": "j", "messages": [
            {"role": "user", "content": "hi"},
            {"role": role, "content": "Hello.", "reasoning_content": "Greet back."},
            {"role": "user", "content": "bye"}]})
    };
    assert!(run(turn("assistant"), &LIMITS).is_ok());
    let e = run(turn("user"), &LIMITS).unwrap_err();
    assert_eq!(e.fields(), ["messages"]);
    assert!(e.to_string().contains("reasoning_content"), "{e}");
}

/// One row per rule: (field to set, value, the field the error must name).
#[test]
fn each_rule_names_its_field() {
    let long_prompt = "x".repeat(DEFAULT_MAX_PROMPT_CHARS + 1);
    let rows: Vec<(serde_json::Value, &str)> = vec![
        (serde_json::json!({"prompt": "hi"}), "job_id"),
        (with("job_id", "".into()), "job_id"),
        (with("job_id", "  ".into()), "job_id"),
        (
            with("job_id", "x".repeat(MAX_JOB_ID_CHARS + 1).into()),
            "job_id",
        ),
        (with("job_id", "a\nb".into()), "job_id"),
        (serde_json::json!({"job_id": "j"}), "prompt/messages"),
        (
            with(
                "messages",
                serde_json::json!([{"role": "user", "content": "x"}]),
            ),
            "prompt/messages",
        ),
        (with("prompt", "".into()), "prompt"),
        (with("prompt", long_prompt.into()), "prompt"),
        (with("prompt", "x".repeat(65).into()), "prompt"),
        (
            serde_json::json!({"job_id": "j", "messages": []}),
            "messages",
        ),
        (
            serde_json::json!({"job_id": "j", "messages": [{"role": "wizard", "content": "x"}]}),
            "messages",
        ),
        (with("max_tokens", 0.into()), "max_tokens"),
        (with("max_tokens", 2049.into()), "max_tokens"),
        (with("max_tokens", (-1).into()), "max_tokens"),
        (with("max_tokens", 124.into()), "max_tokens"),
        (with("temperature", 2.1.into()), "temperature"),
        (with("temperature", (-0.1).into()), "temperature"),
        (with("top_p", 1.5.into()), "top_p"),
        (with("top_k", (BYTE_VOCAB_SIZE as i64 + 1).into()), "top_k"),
        (with("top_k", (-1).into()), "top_k"),
        (with("repetition_penalty", 2.5.into()), "repetition_penalty"),
        (with("min_p", 1.01.into()), "min_p"),
        (
            with("stop", serde_json::json!(["a", "b", "c", "d", "e"])),
            "stop",
        ),
        (with("stop", serde_json::json!([""])), "stop"),
        (with("stop", serde_json::json!(["y".repeat(33)])), "stop"),
        (with("seed", (-1).into()), "seed"),
        (with("logprobs", 21.into()), "logprobs"),
        (with("logprobs", (-1).into()), "logprobs"),
    ];
    for (body, field) in rows {
        let shown = body.to_string();
        let err = run(body, &LIMITS).expect_err(&shown);
        assert_eq!(err.fields(), vec![field], "{shown}: {err}");
        assert!(err.to_string().starts_with(field), "{err}");
    }
}

#[test]
fn max_tokens_out_caps_max_tokens() {
    let limits = Limits {
        execute: Caps::execute(None, Some(5)),
        ..LIMITS
    };
    assert!(run(with("max_tokens", 5.into()), &limits).is_ok());
    let err = run(with("max_tokens", 6.into()), &limits).unwrap_err();
    assert_eq!(err.fields(), vec!["max_tokens"]);
    assert!(err.to_string().contains("between 1 and 5"), "{err}");
}

#[test]
fn several_errors_are_reported_together() {
    let body = serde_json::json!({"job_id": "", "prompt": "x", "temperature": 3, "top_p": 2});
    let err = run(body, &LIMITS).unwrap_err();
    assert_eq!(err.fields(), vec!["job_id", "temperature", "top_p"]);
}

#[test]
fn errors_never_quote_the_prompt() {
    let secret = "SECRET-MARKER ".repeat(10);
    let err = run(with("prompt", secret.into()), &LIMITS).unwrap_err();
    assert!(!err.to_string().contains("SECRET"), "{err}");
}

#[test]
fn missing_template_and_template_failure_are_refused() {
    use crate::engine::testing::byte_vocab_spec;
    use crate::tokenizer::Tokenizer;
    let body = || -> ExecuteRequest {
        serde_json::from_value(
            serde_json::json!({"job_id": "j", "messages": [{"role": "user", "content": "x"}]}),
        )
        .unwrap()
    };
    let no_template = Tokenizer::from_spec(byte_vocab_spec(None)).unwrap();
    let err = validate(body(), &LIMITS, &no_template, || 0).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    let failing = Tokenizer::from_spec(byte_vocab_spec(Some(
        "{{ raise_exception('FAIL: bad roles') }}",
    )))
    .unwrap();
    let err = validate(body(), &LIMITS, &failing, || 0).unwrap_err();
    assert_eq!(err.fields(), vec!["messages"]);
}

#[test]
fn unknown_fields_and_wrong_types_fail_to_parse() {
    assert!(serde_json::from_value::<ExecuteRequest>(
        serde_json::json!({"job_id": "j", "bogus": 1})
    )
    .is_err());
    assert!(serde_json::from_value::<ExecuteRequest>(
        serde_json::json!({"job_id": "j", "max_tokens": "5"})
    )
    .is_err());
    // The OpenAI routes' `ignore_eos` is no `/execute` field (M0-W-1300).
    let err = serde_json::from_value::<ExecuteRequest>(
        serde_json::json!({"job_id": "j", "prompt": "x", "ignore_eos": true}),
    )
    .unwrap_err();
    assert!(err.to_string().contains("ignore_eos"), "{err}");
}

/// Issue 43: a call and its result render (the byte tokenizer's ChatML
/// template ignores tools, so they are written as text); the rules of tool
/// messages each name `messages` and the message.
#[test]
fn tool_calls_and_results_in_messages() {
    let call = serde_json::json!({"id": "c1", "type": "function",
        "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}});
    let ok = serde_json::json!({"job_id": "j", "messages": [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "noon"}]});
    let limits = Limits {
        max_tokens_in: 1024,
        context_length: 2048,
        ..LIMITS
    };
    let v = run(ok, &limits).unwrap();
    let text = byte_tokenizer().decode(&v.prompt_tokens).unwrap();
    assert!(
        text.contains(
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>"
        ),
        "{text}"
    );
    assert!(
        text.contains("<tool_response>\nnoon\n</tool_response>"),
        "{text}"
    );
    let mut other_type = call.clone();
    other_type["type"] = "custom".into();
    let cases = [
        (
            serde_json::json!([{"role": "tool", "content": "noon"}]),
            "no tool_call_id",
        ),
        (
            serde_json::json!([{"role": "user", "content": "x", "tool_call_id": "c1"}]),
            "only tool messages",
        ),
        (
            serde_json::json!([{"role": "user", "content": "x", "tool_calls": [call]}]),
            "only assistant messages",
        ),
        (serde_json::json!([{"role": "assistant"}]), "has no content"),
        (
            serde_json::json!([{"role": "assistant", "tool_calls": [other_type]}]),
            "only \"function\"",
        ),
    ];
    for (messages, want) in cases {
        let body = serde_json::json!({"job_id": "j", "messages": messages});
        let err = run(body, &limits).unwrap_err();
        assert_eq!(err.fields(), vec!["messages"], "{err}");
        assert!(err.to_string().contains(want), "{want}: {err}");
    }
    // Arguments count towards the messages' length limit.
    let mut long = call;
    long["function"]["arguments"] = "x".repeat(DEFAULT_MAX_PROMPT_CHARS).into();
    let body = serde_json::json!({"job_id": "j", "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [long]}]});
    let err = run(body, &limits).unwrap_err();
    assert!(err.to_string().contains("contents total at most"), "{err}");
}

/// Issue 45: the `/v1` routes are bounded by the context only, unless the
/// operator set a cap; `/execute` keeps M0-W-1300's numbers as defaults.
#[test]
fn v1_routes_are_bounded_by_the_context_and_the_flags_set() {
    let long = Limits::new(40_000, BYTE_VOCAB_SIZE, 40_000);
    let body = |max_tokens: usize| {
        let mut b = with("prompt", "x".repeat(DEFAULT_MAX_PROMPT_CHARS + 1).into());
        b["max_tokens"] = max_tokens.into();
        b
    };
    let run_v1 = |body: serde_json::Value, limits: &Limits| {
        let mut req: ExecuteRequest = serde_json::from_value(body).expect("parses");
        req.door = Door::V1;
        validate(req, limits, &byte_tokenizer(), || 7)
    };
    // /execute: the prompt and max_tokens over its defaults, each named.
    let err = run(body(DEFAULT_MAX_TOKENS_OUT + 1), &long).unwrap_err();
    assert_eq!(err.fields(), vec!["prompt", "max_tokens"], "{err}");
    // /v1: both fit the context, so both are taken; the default fills it.
    let room = 40_000 - (DEFAULT_MAX_PROMPT_CHARS + 1);
    let v = run_v1(body(room), &long).unwrap();
    assert_eq!(v.max_tokens, room);
    let mut no_max = body(1);
    no_max.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(run_v1(no_max, &long).unwrap().max_tokens, room);
    let err = run_v1(body(room + 1), &long).unwrap_err();
    assert!(
        err.to_string()
            .contains("exceeds the context length (40000)"),
        "{err}"
    );
    let err = run_v1(body(40_000), &long).unwrap_err();
    assert!(err.to_string().contains("between 1 and 39999"), "{err}");

    // The flags: /execute takes what they allow; /v1 is held to them too.
    let flags = Limits {
        execute: Caps::execute(Some(DEFAULT_MAX_PROMPT_CHARS + 1), Some(3000)),
        v1: Caps::v1(Some(DEFAULT_MAX_PROMPT_CHARS + 1), Some(3000)),
        ..long
    };
    assert_eq!(run(body(3000), &flags).unwrap().max_tokens, 3000);
    for door in [Door::Execute, Door::V1] {
        let mut req: ExecuteRequest = serde_json::from_value(body(3001)).unwrap();
        req.door = door;
        let err = validate(req, &flags, &byte_tokenizer(), || 7).unwrap_err();
        assert!(
            err.to_string().contains("between 1 and 3000"),
            "{door:?}: {err}"
        );
        let mut req: ExecuteRequest =
            serde_json::from_value(with("prompt", "x".repeat(32_770).into())).unwrap();
        req.door = door;
        let err = validate(req, &flags, &byte_tokenizer(), || 7).unwrap_err();
        assert!(
            err.to_string().contains("at most 32769 characters"),
            "{door:?}: {err}"
        );
    }

    // Messages: /execute's count and characters; /v1's context.
    let many: Vec<_> = (0..MAX_MESSAGES + 1)
        .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")}))
        .collect();
    let body = serde_json::json!({"job_id": "j", "messages": many});
    let err = run(body.clone(), &long).unwrap_err();
    assert!(err.to_string().contains("at most 256 messages"), "{err}");
    let mut req: ExecuteRequest = serde_json::from_value(body).unwrap();
    req.door = Door::V1;
    let v = validate(req, &long, &byte_tokenizer(), || 7).unwrap();
    let text = byte_tokenizer().decode(&v.prompt_tokens).unwrap();
    assert!(text.contains("m256"), "{text}");
}

/// The body limit: M0's 1 MiB, more where the context needs it.
#[test]
fn the_body_limit_grows_with_the_context() {
    assert_eq!(
        Limits::new(8192, 1, 8192).body_bytes(),
        crate::server::MAX_BODY_BYTES
    );
    assert_eq!(Limits::new(1, 1, 131_072).body_bytes(), 4 << 20);
    assert_eq!(Limits::new(1, 1, 10_000_000).body_bytes(), 32 << 20);
}
