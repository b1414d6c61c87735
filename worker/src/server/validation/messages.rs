//! `messages` of `/execute` and of the routes mapped onto it: each message's
//! rules, tool calls and tool results included (issue 43), and the
//! conversation rendered by the model's chat template.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::tokenizer::{
    is_reserved_variable, ChatMessage, FunctionCall, TemplateInputs, Tokenizer, ToolCall,
};

/// `/execute`'s longest `prompt`, and longest total text of `messages`
/// (contents, call names and arguments), in characters, unless
/// `--max-prompt-chars` says otherwise (M0-W-1300's number).
pub const DEFAULT_MAX_PROMPT_CHARS: usize = 32_768;
/// `/execute`'s most entries in `messages`.
pub const MAX_MESSAGES: usize = 256;

/// How much `messages` may hold.
#[derive(Clone, Copy, Debug)]
pub struct MessageBounds {
    /// Total characters (`None`: the context alone bounds them).
    pub chars: Option<usize>,
    /// Entries.
    pub count: usize,
}
/// Roles accepted in `messages`.
pub const CHAT_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// One chat message as the client sends it.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageIn {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text; absent or null only in an assistant message with `tool_calls`.
    #[serde(default)]
    pub content: Option<String>,
    /// An assistant message's calls, as OpenAI writes them.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message: the id of the call it answers (required there).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning (a reply's `reasoning_content`, sent
    /// back), for templates that read it (Qwen3's).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

impl MessageIn {
    /// A message of text.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        MessageIn {
            role: role.into(),
            content: Some(content.into()),
            ..MessageIn::default()
        }
    }
}

/// A call in an assistant message: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIn {
    pub id: String,
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCallIn,
}

#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallIn {
    pub name: String,
    /// The arguments as JSON text; the template gets them as an object when
    /// they parse as one.
    pub arguments: String,
}

/// What is wrong with message `i`, if anything; adds its text's length to `chars`.
fn check_message(i: usize, m: &MessageIn, chars: &mut usize) -> Option<String> {
    if !CHAT_ROLES.contains(&m.role.as_str()) {
        let roles = CHAT_ROLES.join(", ");
        return Some(format!(
            "message {i} has unknown role (expected one of {roles})"
        ));
    }
    *chars += m.content.as_deref().map_or(0, |c| c.chars().count());
    if let Some(reasoning) = &m.reasoning_content {
        if m.role != "assistant" {
            return Some(format!(
                "message {i} has reasoning_content; only assistant messages do"
            ));
        }
        *chars += reasoning.chars().count();
    }
    let calls = m.tool_calls.as_deref().unwrap_or_default();
    if !calls.is_empty() && m.role != "assistant" {
        return Some(format!(
            "message {i} has tool_calls; only assistant messages do"
        ));
    }
    if m.content.is_none() && calls.is_empty() {
        return Some(format!("message {i} has no content"));
    }
    match (m.role == "tool", m.tool_call_id.as_deref()) {
        (true, None) => return Some(format!("message {i} (a tool result) has no tool_call_id")),
        (false, Some(_)) => {
            return Some(format!(
                "message {i} has a tool_call_id; only tool messages do"
            ))
        }
        _ => {}
    }
    for (j, call) in calls.iter().enumerate() {
        if call.kind != "function" {
            return Some(format!(
                "message {i} tool call {j} has type {:?}; only \"function\" is served",
                call.kind
            ));
        }
        if call.function.name.is_empty() {
            return Some(format!(
                "message {i} tool call {j} has an empty function name"
            ));
        }
        *chars += call.function.name.chars().count() + call.function.arguments.chars().count();
    }
    None
}

/// The message as the template sees it.
fn chat_message(m: MessageIn) -> ChatMessage {
    let tool_calls = m.tool_calls.filter(|c| !c.is_empty()).map(|calls| {
        calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                kind: c.kind,
                function: FunctionCall::from_text(c.function.name, &c.function.arguments),
            })
            .collect()
    });
    ChatMessage {
        role: m.role,
        content: m.content,
        tool_calls,
        tool_call_id: m.tool_call_id,
        reasoning_content: m.reasoning_content,
    }
}

/// The request's own variables for the chat template: the keys of
/// `chat_template_kwargs` (an object of any JSON values, as vLLM and
/// llama-server take it; no key may hide a variable or function the
/// template gets from the worker), and `reasoning_effort` when given (over
/// a key of that name). The error says what is wrong with the kwargs.
pub fn template_vars(
    kwargs: Option<Value>,
    reasoning_effort: Option<&str>,
) -> Result<Map<String, Value>, String> {
    let mut vars = match kwargs {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(format!(
                "must be an object of the chat template's variables (got {})",
                json_kind(&other)
            ))
        }
    };
    if let Some(key) = vars.keys().find(|k| is_reserved_variable(k)) {
        return Err(format!(
            "{key:?} is a variable or function the worker gives the chat template; it cannot be set"
        ));
    }
    if let Some(effort) = reasoning_effort {
        vars.insert("reasoning_effort".into(), Value::from(effort));
    }
    Ok(vars)
}

/// A JSON value's kind, for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks `messages` and renders them by the model's chat template, with
/// the request's tools (OpenAI-shaped definitions) and variables
/// ([`template_vars`]); each message of the error names a broken rule of
/// the `messages` field.
pub fn render_messages(
    messages: Vec<MessageIn>,
    bounds: MessageBounds,
    tokenizer: &Tokenizer,
    inputs: TemplateInputs<'_>,
) -> Result<String, Vec<String>> {
    if messages.is_empty() {
        return Err(vec!["must not be empty".into()]);
    }
    if messages.len() > bounds.count {
        let (most, n) = (bounds.count, messages.len());
        return Err(vec![format!("at most {most} messages (got {n})")]);
    }
    let mut chars = 0usize;
    let mut errs: Vec<String> = messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| check_message(i, m, &mut chars))
        .collect();
    if let Some(most) = bounds.chars.filter(|&most| chars > most) {
        errs.push(format!(
            "contents total at most {most} characters (got {chars})"
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    let Some(template) = tokenizer.chat_template() else {
        let fix = format!(
            "start the worker with --chat-template NAME ({}) or --chat-template-file PATH, \
             or send a prompt instead",
            crate::tokenizer::builtin_template_names()
        );
        let why = match tokenizer.chat_template_error() {
            Some(e) => format!("the model's chat template does not compile ({e}): {fix}"),
            None => format!("the model has no chat template: {fix}"),
        };
        return Err(vec![why]);
    };
    let messages: Vec<ChatMessage> = messages.into_iter().map(chat_message).collect();
    match template.render_with(&messages, true, inputs) {
        Ok(text) => Ok(tokenizer.without_added_specials(&text).to_string()),
        Err(e) => Err(vec![format!("the chat template failed: {e}")]),
    }
}
