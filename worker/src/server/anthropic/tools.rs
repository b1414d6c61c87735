//! Anthropic's tool use in the chat route's terms (`server::openai::tools`):
//! `tools` and `tool_choice` become the same [`ToolSpec`] (so the same
//! template rendering and, for `any` and `tool`, the same grammar), a
//! turn's `tool_use` blocks become the assistant message's `tool_calls`
//! and `tool_result` blocks `tool` messages, and the calls read from the
//! answer become `tool_use` blocks.

use serde_json::{json, Value};

use super::error::AnthropicError;
use super::types::{ContentBlock, ContentBlockIn};
use crate::server::openai::request::joined_text;
use crate::server::openai::responses::types::InputContent;
use crate::server::openai::tools::parse::ParsedCall;
use crate::server::openai::tools::spec::{
    function_of, known_keys, tool_list, tool_object, Choice, Function, FunctionShape, Refusal,
    ToolSpec,
};
use crate::server::validation::{FunctionCallIn, MessageIn, ToolCallIn};

/// A client tool's fields.
const TOOL: FunctionShape = FunctionShape {
    known: &[
        "type",
        "name",
        "description",
        "input_schema",
        "cache_control",
    ],
    schema_key: "input_schema",
    schema_required: true,
};

/// One entry of `tools`: a client tool; server tools are refused by type.
fn tool(i: usize, v: &Value) -> Result<Function, Refusal> {
    let (path, object) = tool_object(i, v)?;
    match object.get("type") {
        None | Some(Value::Null) => {}
        Some(t) if t == "custom" => {}
        Some(t) => {
            return Err(Refusal::new(
                &format!("{path}.type"),
                format!("{t} is not served; only client tools (name, description, input_schema)"),
            ))
        }
    }
    function_of(object, &path, &TOOL)
}

/// `tool_choice`: the choice and whether an answer may hold several calls.
fn choice(v: Option<&Value>) -> Result<(Choice, bool), Refusal> {
    let Some(object) = v.filter(|v| !v.is_null()) else {
        return Ok((Choice::Auto, true));
    };
    let Some(object) = object.as_object() else {
        return Err(Refusal::new("tool_choice", "must be an object with a type"));
    };
    known_keys(
        object,
        &["type", "name", "disable_parallel_tool_use"],
        "tool_choice",
    )?;
    let single = match object.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Refusal::new(
                "tool_choice.disable_parallel_tool_use",
                "must be true or false",
            ))
        }
    };
    let name = object.get("name").filter(|n| !n.is_null());
    let choice = match (object.get("type").and_then(Value::as_str), name) {
        (Some("auto"), None) => Choice::Auto,
        (Some("any"), None) => Choice::Required,
        (Some("none"), None) => Choice::None,
        (Some("tool"), Some(Value::String(n))) => Choice::Named(n.clone()),
        (Some("tool"), _) => {
            return Err(Refusal::new(
                "tool_choice.name",
                "must name the tool to call",
            ))
        }
        (Some("auto" | "any" | "none"), Some(_)) => {
            return Err(Refusal::new(
                "tool_choice.name",
                "is only given with type \"tool\"",
            ))
        }
        _ => {
            return Err(Refusal::new(
                "tool_choice.type",
                "must be \"auto\", \"any\", \"tool\" or \"none\"",
            ))
        }
    };
    Ok((choice, !single))
}

/// The request's tools, checked; none without tools.
pub fn spec(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
) -> Result<Option<ToolSpec>, AnthropicError> {
    let functions = tool_list(tools, tool, |i| format!("tools[{i}].name"))?;
    let definitions = functions.iter().map(Function::definition).collect();
    let (choice, parallel) = choice(tool_choice)?;
    Ok(ToolSpec::new(definitions, functions, choice, parallel)?)
}

fn invalid(place: &str, why: impl std::fmt::Display) -> AnthropicError {
    AnthropicError::invalid(format!("{place} {why}"))
}

/// A block's text, which a `text` block must have.
fn block_text(place: &str, b: &mut ContentBlockIn) -> Result<String, AnthropicError> {
    b.text
        .take()
        .ok_or_else(|| invalid(place, "has a text block without text"))
}

fn refused_block(place: &str, kind: &str) -> AnthropicError {
    invalid(
        place,
        format!(
            "has a content block of type {kind:?}; served are text, tool_use (in assistant \
             messages) and tool_result (in user messages)"
        ),
    )
}

/// An assistant turn's blocks: its text and its calls.
pub fn assistant(place: &str, blocks: Vec<ContentBlockIn>) -> Result<MessageIn, AnthropicError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for mut b in blocks {
        match b.kind.as_str() {
            "text" => text.push_str(&block_text(place, &mut b)?),
            "tool_use" => calls.push(call_in(place, b)?),
            kind => return Err(refused_block(place, kind)),
        }
    }
    Ok(MessageIn {
        role: "assistant".into(),
        content: (!text.is_empty() || calls.is_empty()).then_some(text),
        tool_calls: (!calls.is_empty()).then_some(calls),
        tool_call_id: None,
        ..MessageIn::default()
    })
}

/// A `tool_use` block as the chat route's call (its input as JSON text).
fn call_in(place: &str, b: ContentBlockIn) -> Result<ToolCallIn, AnthropicError> {
    let (Some(id), Some(name)) = (b.id.filter(|i| !i.is_empty()), b.name) else {
        return Err(invalid(place, "has a tool_use block without id or name"));
    };
    let Some(input) = b.input.filter(Value::is_object) else {
        return Err(invalid(
            place,
            format!("has a tool_use block ({name}) whose input is not an object"),
        ));
    };
    Ok(ToolCallIn {
        id,
        kind: "function".into(),
        function: FunctionCallIn {
            name,
            arguments: input.to_string(),
        },
    })
}

/// A user turn's blocks: each `tool_result` a `tool` message, the text
/// between them user messages, in order.
pub fn user(place: &str, blocks: Vec<ContentBlockIn>) -> Result<Vec<MessageIn>, AnthropicError> {
    let mut out = Vec::new();
    let mut text: Option<String> = None;
    for mut b in blocks {
        match b.kind.as_str() {
            "text" => text
                .get_or_insert_with(String::new)
                .push_str(&block_text(place, &mut b)?),
            "tool_result" => {
                out.extend(text.take().map(|t| MessageIn::text("user", t)));
                out.push(result_in(place, b)?);
            }
            kind => return Err(refused_block(place, kind)),
        }
    }
    if text.is_some() || out.is_empty() {
        out.push(MessageIn::text("user", text.unwrap_or_default()));
    }
    Ok(out)
}

/// A `tool_result` block as a `tool` message.
fn result_in(place: &str, b: ContentBlockIn) -> Result<MessageIn, AnthropicError> {
    let Some(id) = b.tool_use_id.filter(|i| !i.is_empty()) else {
        return Err(invalid(
            place,
            "has a tool_result block without tool_use_id",
        ));
    };
    let content = match b.content {
        None => String::new(),
        Some(InputContent::Text(t)) => t,
        Some(InputContent::Parts(blocks)) => {
            joined_text(blocks.into_iter().map(|p| (p.kind, p.text)), &["text"]).map_err(
                |kind| {
                    invalid(
                place,
                format!("has a tool_result holding a block of type {kind:?}; only text is served"),
            )
                },
            )?
        }
    };
    let content = if b.is_error == Some(true) {
        format!("Error: {content}")
    } else {
        content
    };
    Ok(MessageIn {
        role: "tool".into(),
        content: Some(content),
        tool_calls: None,
        tool_call_id: Some(id),
        ..MessageIn::default()
    })
}

/// A call read from the answer as a `tool_use` block (`toolu_` and the
/// call's own hexadecimal digits); arguments that are not an object (the
/// model's own, under `auto`) cannot be an input, and the call is given
/// back as text, `{"name": ..., "arguments": ...}`.
pub fn tool_use(call: ParsedCall) -> Result<ContentBlock, String> {
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(input @ Value::Object(_)) => Ok(ContentBlock::ToolUse {
            id: format!("toolu_{}", call.id.trim_start_matches("call_")),
            name: call.name,
            input,
        }),
        parsed => {
            let arguments = parsed.unwrap_or(Value::String(call.arguments));
            Err(json!({"name": call.name, "arguments": arguments}).to_string())
        }
    }
}

#[cfg(test)]
mod tests;
