use serde_json::json;

use super::*;
use crate::server::anthropic::request::{map_messages, Mapped};
use crate::server::anthropic::types::MessagesRequest;
use crate::server::openai::tools::format::ToolFormat;

fn weather() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}})
}

fn request(extra: Value) -> Result<Mapped, AnthropicError> {
    let mut body = json!({"model": "smol", "max_tokens": 8,
                          "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let req: MessagesRequest = serde_json::from_value(body).unwrap();
    map_messages(req, "msg_1", &["smol"], ToolFormat::Hermes)
}

/// Anthropic's definitions reach the template in the chat route's shape;
/// `any` and `tool` get the grammar of the calls, `none` reads no call.
#[test]
fn tools_and_choices_become_the_chat_route_s() {
    let m = request(json!({"tools": [weather()]})).unwrap();
    let want = json!({"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city", "parameters": weather()["input_schema"]}});
    assert_eq!(m.execute.tools, Some(vec![want]));
    assert_eq!(m.execute.grammar, None, "auto enforces nothing");
    let reply = m.tools.unwrap();
    assert!(reply.parallel);
    assert_eq!(reply.names, ["get_weather"]);
    for choice in [
        json!({"type": "any"}),
        json!({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}),
    ] {
        let m = request(json!({"tools": [weather()], "tool_choice": choice})).unwrap();
        let grammar = m.execute.grammar.unwrap();
        assert!(
            grammar.contains("get_weather") && grammar.contains("<tool_call>"),
            "{grammar}"
        );
        let single = choice.get("disable_parallel_tool_use").is_some();
        assert_eq!(m.tools.unwrap().parallel, !single);
        assert_eq!(grammar.contains("call)*"), !single, "{grammar}");
    }
    let m = request(json!({"tools": [weather()], "tool_choice": {"type": "none"}})).unwrap();
    assert!(m.execute.tools.is_some() && m.tools.is_none() && m.execute.grammar.is_none());
}

#[test]
fn refusals_name_the_field_at_fault() {
    let cases = [
        (
            json!({"tools": [{"name": "get weather", "input_schema": {}}]}),
            "tools[0].name: ",
        ),
        (json!({"tools": [{"name": "f"}]}), "tools[0].input_schema: "),
        (json!({"tools": [weather(), weather()]}), "tools[1].name: "),
        (
            json!({"tools": [{"type": "bash_20250124", "name": "bash"}]}),
            "tools[0].type: ",
        ),
        (
            json!({"tools": [{"name": "f", "input_schema": {}, "strict": 1}]}),
            "tools[0].strict: ",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "tool", "name": "other"}}),
            "tool_choice: ",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "tool"}}),
            "tool_choice.name: ",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "auto", "name": "f"}}),
            "tool_choice.name: ",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "required"}}),
            "tool_choice.type: ",
        ),
        (
            json!({"tools": [weather()], "tool_choice": "auto"}),
            "tool_choice: ",
        ),
        (json!({"tool_choice": {"type": "any"}}), "tool_choice: "),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "any", "disable_parallel_tool_use": "y"}}),
            "tool_choice.disable_parallel_tool_use: ",
        ),
    ];
    for (extra, want) in cases {
        let e = request(extra.clone()).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        let message = &e.body.error.message;
        assert!(message.starts_with(want), "{extra}: {message}");
        assert_eq!(e.body.error.kind, "invalid_request_error");
    }
}

/// A turn's tool_use blocks are the assistant's calls; the next turn's
/// tool_result blocks are `tool` messages, before that turn's text.
#[test]
fn tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
    let m = request(json!({"tools": [weather()], "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
             "content": [{"type": "text", "text": "no station"}]},
            {"type": "text", "text": "Thanks."}]}]}))
    .unwrap();
    let sent = m.execute.messages.unwrap();
    let turns: Vec<(&str, Option<&str>, Option<&str>)> = sent
        .iter()
        .map(|m| {
            (
                m.role.as_str(),
                m.content.as_deref(),
                m.tool_call_id.as_deref(),
            )
        })
        .collect();
    let want = [
        ("user", Some("Weather in Paris and Rome?"), None),
        ("assistant", Some("Looking."), None),
        ("tool", Some("22 C"), Some("toolu_1")),
        ("tool", Some("Error: no station"), Some("toolu_2")),
        ("user", Some("Thanks."), None),
    ];
    assert_eq!(turns, want);
    let calls: Vec<(&str, &str, &str)> = sent[1]
        .tool_calls
        .iter()
        .flatten()
        .map(|c| {
            (
                c.id.as_str(),
                c.kind.as_str(),
                c.function.arguments.as_str(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("toolu_1", "function", r#"{"city":"Paris"}"#),
            ("toolu_2", "function", r#"{"city":"Rome"}"#)
        ]
    );
    // Calls alone: no content.
    let only = assistant(
        "m",
        vec![block(
            json!({"type": "tool_use", "id": "t", "name": "f", "input": {}}),
        )],
    )
    .unwrap();
    assert_eq!(only.content, None);
}

fn block(v: Value) -> ContentBlockIn {
    serde_json::from_value(v).unwrap()
}

#[test]
fn broken_tool_blocks_are_refused_naming_the_message() {
    for (b, want) in [
        (
            json!({"type": "tool_use", "name": "f", "input": {}}),
            "without id",
        ),
        (
            json!({"type": "tool_use", "id": "t", "name": "f", "input": [1]}),
            "not an object",
        ),
        (json!({"type": "image", "source": {}}), "\"image\""),
    ] {
        let e = assistant("messages: message 1", vec![block(b)]).unwrap_err();
        let message = e.body.error.message;
        assert!(
            message.starts_with("messages: message 1 ") && message.contains(want),
            "{message}"
        );
    }
    for (b, want) in [
        (
            json!({"type": "tool_result", "content": "x"}),
            "without tool_use_id",
        ),
        (
            json!({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}),
            "\"image\"",
        ),
        (json!({"type": "text"}), "without text"),
    ] {
        let message = user("messages: message 2", vec![block(b)])
            .unwrap_err()
            .body
            .error
            .message;
        assert!(message.contains(want), "{message}");
    }
}

#[test]
fn calls_become_tool_use_blocks_or_text() {
    let call = |args: &str| ParsedCall {
        id: "call_0123456789abcdef01234567".into(),
        name: "get_weather".into(),
        arguments: args.into(),
    };
    let block = tool_use(call(r#"{"city": "Paris"}"#)).unwrap();
    assert_eq!(
        serde_json::to_value(block).unwrap(),
        json!({"type": "tool_use", "id": "toolu_0123456789abcdef01234567", "name": "get_weather",
               "input": {"city": "Paris"}})
    );
    let text = tool_use(call("[1]")).unwrap_err();
    let text: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(text, json!({"name": "get_weather", "arguments": [1]}));
}
