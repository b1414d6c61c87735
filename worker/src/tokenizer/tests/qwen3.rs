//! Qwen3's own chat template (`testdata/qwen3.jinja`) rendered by the
//! worker's engine: `enable_thinking` from the request's variables, earlier
//! turns' reasoning dropped as the template drops it, tools.

use serde_json::{json, Map, Value};

use super::super::*;

const QWEN3: &str = include_str!("../testdata/qwen3.jinja");

fn template() -> ChatTemplate {
    ChatTemplate::new(QWEN3, "", "<|im_end|>").unwrap()
}

/// The conversation rendered with the variables `vars` (an object).
fn render(messages: &[ChatMessage], vars: Value) -> String {
    let vars: Map<String, Value> = vars.as_object().unwrap().clone();
    let inputs = TemplateInputs {
        tools: None,
        vars: Some(&vars),
    };
    template().render_with(messages, true, inputs).unwrap()
}

fn question() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "2+2?"),
    ]
}

/// `enable_thinking` false: the template writes an empty think block after
/// the turn's opening, so the model answers at once.
#[test]
fn enable_thinking_false_closes_an_empty_think_block() {
    let out = render(&question(), json!({"enable_thinking": false}));
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n\
         <|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
}

/// Unset or true, the turn opens bare and the model writes `<think>` itself.
#[test]
fn enable_thinking_unset_or_true_leaves_the_block_to_the_model() {
    let plain = template().render(&question(), true).unwrap();
    assert!(plain.ends_with("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"));
    assert_eq!(render(&question(), json!({"enable_thinking": true})), plain);
    assert_eq!(render(&question(), json!({})), plain);
}

/// An earlier answer's reasoning is dropped (the template splits it off at
/// `</think>`); an answer after the last question (a tool round) keeps its
/// block.
#[test]
fn earlier_reasoning_is_dropped_later_reasoning_kept() {
    let answer = "<think>\nTwo and two.\n</think>\n\nFour.";
    let mut messages = question();
    messages.push(ChatMessage::new("assistant", answer));
    messages.push(ChatMessage::new("user", "3+3?"));
    let out = template().render(&messages, true).unwrap();
    assert!(
        out.contains("<|im_start|>assistant\nFour.<|im_end|>\n<|im_start|>user\n3+3?"),
        "{out}"
    );
    assert!(!out.contains("Two and two"), "{out}");

    let out = template().render(
        &tool_round("<think>\nAsk the tool.\n</think>\n\n", None),
        true,
    );
    assert!(out.unwrap().ends_with(TOOL_ROUND));
}

/// A tool round as the template writes it, its reasoning kept.
const TOOL_ROUND: &str = "<|im_start|>assistant\n<think>\nAsk the tool.\n</think>\n\n<tool_call>\n\
    {\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 2}}\n</tool_call><|im_end|>\n\
    <|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

/// The question, the assistant's call (`content`, `reasoning_content`), its result.
fn tool_round(content: &str, reasoning: Option<&str>) -> Vec<ChatMessage> {
    let mut call = ChatMessage::new("assistant", content);
    call.reasoning_content = reasoning.map(str::to_string);
    call.tool_calls = Some(vec![ToolCall {
        id: "call_1".into(),
        kind: "function".into(),
        function: FunctionCall::from_text("add", r#"{"a": 2, "b": 2}"#),
    }]);
    let mut result = ChatMessage::new("tool", "4");
    result.tool_call_id = Some("call_1".into());
    let mut messages = question();
    messages.extend([call, result]);
    messages
}

/// A reply's reasoning sent back apart (`reasoning_content`, as the chat
/// route answers it) renders as the same reasoning inside `content` does.
#[test]
fn reasoning_content_sent_back_fills_the_think_block() {
    let out = template().render(&tool_round("", Some("Ask the tool.")), true);
    assert!(out.unwrap().ends_with(TOOL_ROUND));
}

/// Tools go into the system message as the template writes them, and its
/// calls are Hermes' `<tool_call>`.
#[test]
fn tools_render() {
    let t = template();
    assert!(t.tool_probe().unwrap().contains("<tool_call>"));
    let tool = json!({"type": "function", "function": {"name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}});
    let inputs = TemplateInputs {
        tools: Some(std::slice::from_ref(&tool)),
        vars: None,
    };
    let out = t.render_with(&question(), true, inputs).unwrap();
    assert!(
        out.starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n"),
        "{out}"
    );
    assert!(
        out.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"add\", "),
        "{out}"
    );
}

/// The worker's own variables and functions are reserved; a request's
/// variable of such a name (were it let through) never hides them.
#[test]
fn the_worker_s_variables_win_over_the_request_s() {
    for name in [
        "messages",
        "add_generation_prompt",
        "tools",
        "bos_token",
        "namespace",
        "range",
        "raise_exception",
    ] {
        assert!(is_reserved_variable(name), "{name}");
    }
    for name in ["enable_thinking", "reasoning_effort", "custom_instructions"] {
        assert!(!is_reserved_variable(name), "{name}");
    }
    let out = render(
        &question(),
        json!({"add_generation_prompt": false, "messages": []}),
    );
    assert!(
        out.ends_with("2+2?<|im_end|>\n<|im_start|>assistant\n"),
        "{out}"
    );
}
