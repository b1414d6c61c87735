use serde_json::json;

use super::*;
use crate::server::openai::request::Mapped;
use crate::server::openai::responses::request::{self, Echo};

fn weather() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}, "strict": true})
}

/// A request asking about the weather, with `extra`'s fields.
fn map(extra: Value) -> Result<(Mapped, Echo), OpenAiError> {
    let mut body = json!({"model": "smol", "input": "Weather in Paris?"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    request::tests::map(body)
}

/// Function tools reach the template in the chat route's shape and are
/// echoed as given; `required` and a named function get the grammar.
#[test]
fn function_tools_and_choices_become_the_chat_route_s() {
    let (m, echo) = map(json!({"tools": [weather()], "parallel_tool_calls": false})).unwrap();
    let want = json!({"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city", "parameters": weather()["parameters"]}});
    assert_eq!(m.execute.tools, Some(vec![want]));
    assert_eq!(m.execute.grammar, None);
    let reply = m.tools.unwrap();
    assert_eq!(
        (reply.parallel, reply.names.clone()),
        (false, vec!["get_weather".to_string()])
    );
    assert_eq!(echo.tools, vec![weather()]);
    assert_eq!(
        (echo.tool_choice, echo.parallel_tool_calls),
        (json!("auto"), false)
    );
    for choice in [
        json!("required"),
        json!({"type": "function", "name": "get_weather"}),
    ] {
        let (m, echo) = map(json!({"tools": [weather()], "tool_choice": choice})).unwrap();
        let grammar = m.execute.grammar.unwrap();
        assert!(
            grammar.contains("get_weather") && grammar.contains("<tool_call>"),
            "{grammar}"
        );
        assert_eq!(echo.tool_choice, choice);
    }
    let (m, _) = map(json!({"tools": [weather()], "tool_choice": "none"})).unwrap();
    assert!(m.execute.tools.is_some() && m.tools.is_none());
    let (m, echo) = map(json!({})).unwrap();
    assert!(m.execute.tools.is_none() && echo.tools.is_empty());
    assert_eq!(echo.tool_choice, json!("none"));
}

#[test]
fn refusals_name_the_field_at_fault() {
    let cases = [
        (
            json!({"tools": [{"type": "web_search_preview"}]}),
            "tools[0].type",
            "\"web_search_preview\"",
        ),
        (
            json!({"tools": [{"type": "file_search", "vector_store_ids": []}]}),
            "tools[0].type",
            "file_search",
        ),
        (
            json!({"tools": [{"type": "function", "name": "a b"}]}),
            "tools[0].name",
            "letters",
        ),
        (
            json!({"tools": [weather(), weather()]}),
            "tools[1].name",
            "unique",
        ),
        (
            json!({"tools": [{"type": "function", "name": "f", "function": {}}]}),
            "tools[0].function",
            "known",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "name": "other"}}),
            "tool_choice",
            "not in tools",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "web_search_preview"}}),
            "tool_choice",
            "not served",
        ),
        (
            json!({"tool_choice": "required"}),
            "tool_choice",
            "needs tools",
        ),
    ];
    for (extra, param, why) in cases {
        let e = map(extra.clone()).unwrap_err().body.error;
        assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
        assert!(
            e.message.starts_with(&format!("{param}: ")) && e.message.contains(why),
            "{}",
            e.message
        );
    }
}

/// A message and the calls after it are one assistant turn; each output is
/// a `tool` message naming its call.
#[test]
fn function_call_items_are_the_history_s_calls_and_results() {
    let (m, _) = map(json!({"tools": [weather()], "input": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "22 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "18 C"}]},
        {"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": "{}"}]}))
    .unwrap();
    let sent = m.execute.messages.unwrap();
    let roles: Vec<&str> = sent.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "tool", "assistant"]);
    assert_eq!(sent[1].content.as_deref(), Some("Looking."));
    let calls = sent[1].tool_calls.as_ref().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[1].id.as_str(), calls[1].function.arguments.as_str()),
        ("call_2", "{\"city\": \"Rome\"}")
    );
    assert_eq!(
        (sent[2].tool_call_id.as_deref(), sent[2].content.as_deref()),
        (Some("call_1"), Some("22 C"))
    );
    assert_eq!(sent[3].content.as_deref(), Some("18 C"));
    assert_eq!(
        (
            sent[4].content.as_deref(),
            sent[4].tool_calls.as_ref().map(Vec::len)
        ),
        (None, Some(1))
    );
    for (item, why) in [
        (
            json!({"type": "function_call", "name": "f", "arguments": "{}"}),
            "without call_id",
        ),
        (
            json!({"type": "function_call_output", "call_id": "c"}),
            "without output",
        ),
        (
            json!({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}),
            "input_image",
        ),
    ] {
        let e = map(json!({"input": [item]})).unwrap_err().body.error;
        assert!(
            e.message.starts_with("input: item 0 ") && e.message.contains(why),
            "{}",
            e.message
        );
    }
}

#[test]
fn calls_become_function_call_items() {
    let call = ParsedCall {
        id: "call_0123456789abcdef01234567".into(),
        name: "get_weather".into(),
        arguments: "{\"city\": \"Paris\"}".into(),
    };
    let item = serde_json::to_value(call_item(call, "completed")).unwrap();
    assert_eq!(
        item,
        json!({"type": "function_call", "id": "fc_0123456789abcdef01234567",
               "call_id": "call_0123456789abcdef01234567", "name": "get_weather",
               "arguments": "{\"city\": \"Paris\"}", "status": "completed"})
    );
}
