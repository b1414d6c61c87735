//! One chat message as a template sees it, tool calls included (see
//! `chat_tools.rs` for how transformers passes them).

use serde_json::Value;

/// One chat message. `content` is none only for an assistant message that
/// holds `tool_calls`. A field that is none is left out of what the template
/// sees: templates test `'tool_calls' in message`, and gpt-oss's searches
/// `message.content` when `"content" in message` (which fails on none).
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning, as a reply's `reasoning_content`
    /// gave it: Qwen3's template writes it back into the turn's think block
    /// (for the turns after the last question; earlier ones drop it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: None,
            tool_call_id: None,
            reasoning_content: None,
        }
    }

    /// Whether the message is part of a tool exchange (a call or a result).
    pub fn is_tool_exchange(&self) -> bool {
        self.tool_calls.is_some() || self.role == "tool"
    }
}

/// One call in an assistant message.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function a call names and its arguments: an object when the
/// client's JSON text was one, else that text as a string.
#[derive(serde::Deserialize, serde::Serialize, Clone, Debug, PartialEq, Eq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: Value,
}

impl FunctionCall {
    /// `arguments` as OpenAI sends them (JSON text), parsed when they parse.
    pub fn from_text(name: impl Into<String>, arguments: &str) -> Self {
        FunctionCall {
            name: name.into(),
            arguments: serde_json::from_str(arguments)
                .unwrap_or_else(|_| Value::String(arguments.to_string())),
        }
    }
}
