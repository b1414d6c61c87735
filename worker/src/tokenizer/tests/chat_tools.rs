//! Tools through real chat templates, passed as transformers passes them:
//! Qwen2.5's (Hermes `<tool_call>`), Llama 3.1's (JSON in the first user
//! message), gpt-oss's harmony one, and a template that ignores tools (the
//! Hermes rewrite, `chat_tools.rs`).

use serde_json::{json, Value};

use super::super::*;

const QWEN: &str = include_str!("../testdata/qwen2.5-instruct.jinja");
const LLAMA31: &str = include_str!("../testdata/llama3.1-instruct.jinja");
/// SmolLM2's template: ChatML that knows nothing of tools.
const SMOL: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}\
{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' \
+ message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})
}

/// A user question, the assistant's call (no content), its result.
fn round_trip() -> Vec<ChatMessage> {
    let call = ToolCall {
        id: "call_1".into(),
        kind: "function".into(),
        function: FunctionCall::from_text("get_weather", r#"{"city": "Paris"}"#),
    };
    let mut assistant = ChatMessage::new("assistant", "");
    assistant.content = None;
    assistant.tool_calls = Some(vec![call]);
    let mut result = ChatMessage::new("tool", "22 C, sunny");
    result.tool_call_id = Some("call_1".into());
    vec![
        ChatMessage::new("user", "Weather in Paris?"),
        assistant,
        result,
    ]
}

fn with_tools(tools: &[Value]) -> TemplateInputs<'_> {
    TemplateInputs {
        tools: Some(tools),
        vars: None,
    }
}

fn render(source: &str, messages: &[ChatMessage], tools: &[Value]) -> String {
    let t = ChatTemplate::new(source, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    t.render_with(messages, true, with_tools(tools)).unwrap()
}

#[test]
fn arguments_are_an_object_when_their_text_is_json() {
    let f = FunctionCall::from_text("f", r#"{"a": [1, 2]}"#);
    assert_eq!(f.arguments, json!({"a": [1, 2]}));
    let f = FunctionCall::from_text("f", "not json");
    assert_eq!(f.arguments, json!("not json"));
    // Absent tool fields stay out of what the template sees.
    let v = serde_json::to_value(ChatMessage::new("user", "x")).unwrap();
    assert_eq!(v, json!({"role": "user", "content": "x"}));
}

#[test]
fn qwen25_writes_tools_and_the_round_trip() {
    let t = ChatTemplate::new(QWEN, "", "<|im_end|>").unwrap();
    assert!(t.tool_probe().unwrap().contains("<tool_call>"));
    let out = render(QWEN, &round_trip(), &[weather_tool()]);
    assert!(out
        .contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "));
    assert!(
        out.contains("\"required\": [\"city\"]}}}\n</tools>"),
        "{out}"
    );
    let call = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n";
    assert!(out.contains(call), "{out}");
    let result = "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    assert!(out.ends_with(result), "{out}");
}

#[test]
fn llama31_writes_tools_in_the_first_user_message_and_the_round_trip() {
    let t = ChatTemplate::new(LLAMA31, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    assert!(t
        .tool_probe()
        .unwrap()
        .contains("\"parameters\": dictionary"));
    let out = render(LLAMA31, &round_trip(), &[weather_tool()]);
    assert!(out.contains("Environment: ipython\n"), "{out}");
    let user = out
        .split("<|start_header_id|>user<|end_header_id|>\n\n")
        .nth(1)
        .unwrap();
    assert!(
        user.contains("\"name\": \"get_weather\"") && user.contains("Weather in Paris?<|eot_id|>")
    );
    let call = "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>";
    assert!(out.contains(call), "{out}");
    // The result's content is a string: Jinja iterates strings, so `tojson` quotes it.
    assert!(
        out.contains("<|start_header_id|>ipython<|end_header_id|>\n\n\"22 C, sunny\"<|eot_id|>"),
        "{out}"
    );
}

#[test]
fn harmony_writes_the_functions_namespace_and_the_call() {
    let source = harness::synth::harmony::CHAT_TEMPLATE;
    let t = ChatTemplate::new(source, "<|startoftext|>", "<|return|>").unwrap();
    assert!(t.tool_probe().is_some());
    let out = render(source, &round_trip(), &[weather_tool()]);
    assert!(out.contains("namespace functions {"), "{out}");
    assert!(out.contains("type get_weather = (_: {"), "{out}");
    assert!(out.contains("to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"), "{out}");
    assert!(out.contains("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"22 C, sunny\"<|end|>"), "{out}");
}

#[test]
fn a_template_that_ignores_tools_gets_them_the_hermes_way() {
    let t = ChatTemplate::new(SMOL, "", "<|im_end|>").unwrap();
    assert!(t.tool_probe().is_none());
    let out = render(SMOL, &round_trip(), &[weather_tool()]);
    let system = out.split("<|im_end|>").next().unwrap();
    assert!(system.starts_with("<|im_start|>system\n# Tools\n"), "{out}");
    assert!(system.contains("\"name\": \"get_weather\""));
    assert!(system.contains("<tool_call>\n{\"name\": <function-name>"));
    let call = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>";
    assert!(out.contains(call), "{out}");
    assert!(
        out.contains("<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>")
    );
    // The client's own system message keeps its place, the tools after it;
    // two results share one user turn.
    let mut msgs = round_trip();
    msgs.insert(0, ChatMessage::new("system", "Be brief."));
    let mut second = ChatMessage::new("tool", "rain later");
    second.tool_call_id = Some("call_2".into());
    msgs.push(second);
    let out = render(SMOL, &msgs, &[weather_tool()]);
    assert!(
        out.starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n"),
        "{out}"
    );
    assert!(out.contains("22 C, sunny\n</tool_response>\n<tool_response>\nrain later\n</tool_response><|im_end|>"), "{out}");
    // Without tools, a history of calls still renders (as text).
    let t = ChatTemplate::new(SMOL, "", "").unwrap();
    let out = t.render(&round_trip(), true).unwrap();
    assert!(
        out.contains("<tool_call>") && !out.contains("# Tools"),
        "{out}"
    );
}

#[test]
fn no_tools_renders_as_before() {
    let msgs = [ChatMessage::new("user", "hi")];
    let t = ChatTemplate::new(QWEN, "", "").unwrap();
    let plain = t.render(&msgs, true).unwrap();
    assert_eq!(t.render_with(&msgs, true, with_tools(&[])).unwrap(), plain);
    assert!(!plain.contains("# Tools"));
}
