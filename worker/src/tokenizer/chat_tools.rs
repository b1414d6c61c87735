//! Tools in chat templates, passed as transformers passes them: `tools` is
//! the list of OpenAI-shaped definitions (`{"type": "function", "function":
//! {"name", "description", "parameters"}}`), an assistant message's
//! `tool_calls` are `{"id", "type": "function", "function": {"name",
//! "arguments"}}` with the arguments an object when their JSON text is one
//! (Qwen2.5's template writes `arguments | tojson`, Llama 3.1's expects a
//! mapping), and a `tool` message carries its `tool_call_id`.
//!
//! A template that ignores `tools` (SmolLM2's, the built-in ones) would
//! leave the model unaware of them, and may fail on a message without
//! `content`; the conversation is then rewritten the way Qwen2.5's template
//! writes tools (the Hermes format): the definitions in the system message,
//! each call as `<tool_call>` text in its assistant message, results as a
//! user turn of `<tool_response>`s.

use serde_json::{json, Value};

use super::chat_json::python_json;
use super::chat_message::{ChatMessage, FunctionCall};

/// The name of the tool of the probe conversation: unlikely in any template.
pub const PROBE_TOOL: &str = "worker_orcd_probe_tool";

/// The conversation `ChatTemplate::tool_probe` renders: a system and a user
/// message (Llama 3.1's template puts tools in the first user message, and
/// refuses a conversation without one) and one tool.
pub(super) fn probe() -> (Vec<ChatMessage>, Vec<Value>) {
    let messages = vec![
        ChatMessage::new("system", "S"),
        ChatMessage::new("user", "U"),
    ];
    let tool = json!({"type": "function", "function": {
        "name": PROBE_TOOL,
        "description": "D",
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    }});
    (messages, vec![tool])
}

/// Qwen2.5's tools preamble, with the definitions as its template writes them.
pub fn hermes_preamble(tools: &[Value]) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        out.push('\n');
        out.push_str(&python_json(tool));
    }
    out.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    out
}

/// One call as the Hermes format writes it.
pub fn hermes_call(call: &FunctionCall) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {}}}\n</tool_call>",
        python_json(&Value::String(call.name.clone())),
        python_json(&call.arguments)
    )
}

/// `messages` with `tools` and the tool exchanges written as text, for a
/// template that does not write them: every message then has content.
pub(super) fn hermes_messages(
    messages: &[ChatMessage],
    tools: Option<&[Value]>,
) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    let own_system = messages.first().filter(|m| m.role == "system");
    if let Some(tools) = tools {
        let preamble = hermes_preamble(tools);
        let text = match own_system.and_then(|m| m.content.as_deref()) {
            Some(own) => format!("{own}\n\n{preamble}"),
            None => preamble,
        };
        out.push(ChatMessage::new("system", text));
    }
    let skip = usize::from(tools.is_some() && own_system.is_some());
    // Whether the last message written is a user turn of results.
    let mut results_turn = false;
    for m in &messages[skip..] {
        let content = m.content.clone().unwrap_or_default();
        if m.role == "tool" {
            let response = format!("<tool_response>\n{content}\n</tool_response>");
            // Consecutive results share one user turn, as in Qwen2.5's template.
            match out.last_mut().and_then(|last| last.content.as_mut()) {
                Some(text) if results_turn => {
                    text.push('\n');
                    text.push_str(&response);
                }
                _ => out.push(ChatMessage::new("user", response)),
            }
            results_turn = true;
            continue;
        }
        results_turn = false;
        let mut text = content;
        for call in m.tool_calls.iter().flatten() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&hermes_call(&call.function));
        }
        out.push(ChatMessage::new(m.role.clone(), text));
    }
    out
}
