//! The Responses API's function tools in the chat route's terms
//! (`server::openai::tools`): `tools`, `tool_choice` and
//! `parallel_tool_calls` become the same [`ToolSpec`] (the same template
//! rendering and, for `required` or a named function, the same grammar);
//! `function_call` input items become the assistant's `tool_calls` and
//! `function_call_output` items `tool` messages; the calls read from the
//! answer become `function_call` output items.

use serde_json::Value;

use super::types::{FunctionCallItem, InputContent, InputItem};
use crate::server::openai::error::OpenAiError;
use crate::server::openai::request::joined_text;
use crate::server::openai::tools::parse::ParsedCall;
use crate::server::openai::tools::spec::{
    function_of, mode, tool_list, tool_object, Choice, Function, FunctionShape, Refusal, ToolSpec,
};
use crate::server::validation::{FunctionCallIn, MessageIn, ToolCallIn};

/// A function tool's fields (beside `type`, not under `function`).
const FUNCTION_TOOL: FunctionShape = FunctionShape {
    known: &["type", "name", "description", "parameters", "strict"],
    schema_key: "parameters",
    schema_required: false,
};

/// One entry of `tools`: a function; other tool types are refused by name.
fn tool(i: usize, v: &Value) -> Result<Function, Refusal> {
    let (path, object) = tool_object(i, v)?;
    match object.get("type").and_then(Value::as_str) {
        Some("function") => function_of(object, &path, &FUNCTION_TOOL),
        Some(other) => Err(Refusal::new(
            &format!("{path}.type"),
            format!("{other:?} tools are not served; only \"function\""),
        )),
        None => Err(Refusal::new(
            &format!("{path}.type"),
            "must be \"function\"",
        )),
    }
}

/// `tool_choice`: a mode, or `{"type": "function", "name": ...}`.
fn choice(v: Option<&Value>) -> Result<Choice, Refusal> {
    let named = |v: &Value| -> Option<String> {
        let o = v.as_object()?;
        let well_formed = o.len() == 2 && o.get("type")? == "function";
        well_formed.then(|| o.get("name")?.as_str().map(str::to_string))?
    };
    let chosen = match v {
        None | Some(Value::Null) => Some(Choice::Auto),
        Some(Value::String(s)) => mode(s),
        Some(v) => named(v).map(Choice::Named),
    };
    chosen.ok_or_else(|| {
        Refusal::new(
            "tool_choice",
            "must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...} \
             (other tool types are not served)",
        )
    })
}

/// The request's tools, checked; none without tools.
pub fn spec(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    parallel_tool_calls: Option<bool>,
) -> Result<Option<ToolSpec>, OpenAiError> {
    let functions = tool_list(tools, tool, |i| format!("tools[{i}].name"))?;
    let definitions = functions.iter().map(Function::definition).collect();
    let choice = choice(tool_choice)?;
    let parallel = parallel_tool_calls.unwrap_or(true);
    Ok(ToolSpec::new(definitions, functions, choice, parallel)?)
}

fn invalid(i: usize, why: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid("input", format!("input: item {i} {why}"))
}

/// A `function_call` item: added to the assistant message just before it
/// (the same turn: the message items and calls of one answer), else an
/// assistant message of its own.
pub fn add_call(
    messages: &mut Vec<MessageIn>,
    i: usize,
    item: InputItem,
) -> Result<(), OpenAiError> {
    let (Some(id), Some(name), Some(arguments)) = (
        item.call_id.filter(|c| !c.is_empty()),
        item.name,
        item.arguments,
    ) else {
        return Err(invalid(
            i,
            "is a function_call without call_id, name or arguments",
        ));
    };
    let call = ToolCallIn {
        id,
        kind: "function".into(),
        function: FunctionCallIn { name, arguments },
    };
    match messages.last_mut().filter(|m| m.role == "assistant") {
        Some(turn) => turn.tool_calls.get_or_insert_with(Vec::new).push(call),
        None => messages.push(MessageIn {
            role: "assistant".into(),
            content: None,
            tool_calls: Some(vec![call]),
            tool_call_id: None,
            ..MessageIn::default()
        }),
    }
    Ok(())
}

/// A `function_call_output` item as a `tool` message.
pub fn output_message(i: usize, item: InputItem) -> Result<MessageIn, OpenAiError> {
    let Some(id) = item.call_id.filter(|c| !c.is_empty()) else {
        return Err(invalid(i, "is a function_call_output without call_id"));
    };
    let content = match item.output {
        None => return Err(invalid(i, "is a function_call_output without output")),
        Some(InputContent::Text(text)) => text,
        Some(InputContent::Parts(parts)) => joined_text(
            parts.into_iter().map(|p| (p.kind, p.text)),
            &["input_text", "output_text"],
        )
        .map_err(|kind| {
            invalid(
                i,
                format!("has an output part of type {kind:?}; only text is served"),
            )
        })?,
    };
    Ok(MessageIn {
        role: "tool".into(),
        content: Some(content),
        tool_calls: None,
        tool_call_id: Some(id),
        ..MessageIn::default()
    })
}

/// A call read from the answer as a `function_call` output item: its
/// `call_id` is the call's id, its `id` `fc_` and the same digits.
pub fn call_item(call: ParsedCall, status: &str) -> FunctionCallItem {
    FunctionCallItem {
        kind: "function_call".into(),
        id: format!("fc_{}", call.id.trim_start_matches("call_")),
        call_id: call.id,
        name: call.name,
        arguments: call.arguments,
        status: status.into(),
    }
}

#[cfg(test)]
mod tests;
