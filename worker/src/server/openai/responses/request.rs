//! OpenAI Responses request → the worker's own [`ExecuteRequest`]:
//! `instructions` becomes a system message before the input, the input's
//! message items become chat messages, and the sampling fields both APIs
//! share are copied as they are, so `/execute`'s validation judges them.
//! Function tools and the `function_call` and `function_call_output` items
//! become the chat route's tools and history (`tools.rs`). The route is
//! stateless; what it cannot honour (stored responses, earlier responses by
//! id, other tool types, images) is refused by name, never ignored.
//! `text.format` becomes `/execute`'s `json_schema`.

use serde_json::{Map, Value};

use super::tools;
use super::types::{InputContent, InputItem, ResponsesInput, ResponsesRequest};
use crate::server::openai::error::OpenAiError;
use crate::server::openai::request::{joined_text, Mapped, ReplyShape};
use crate::server::openai::tools::format::ToolFormat;
use crate::server::openai::types::ResponseFormat;
use crate::server::validation::{Door, ExecuteRequest, MessageIn};

/// What the answer repeats of the request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// The tools as given, `tool_choice` (`none` without tools, else
    /// `auto` unless given) and `parallel_tool_calls`.
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
}

/// Fields accepted and ignored because they do not change the answer, when
/// they hold these values (`null` is always accepted).
fn harmless(field: &str, value: &Value) -> bool {
    let empty = || value.as_array().is_some_and(Vec::is_empty);
    match field {
        "user" | "metadata" | "service_tier" | "prompt_cache_key" | "safety_identifier" => true,
        "store" | "background" => value == &Value::Bool(false),
        "truncation" => value == "disabled",
        "include" => empty(),
        _ => false,
    }
}

/// Refuses the first field the worker does not serve, by name.
fn refuse_unserved(other: &Map<String, Value>) -> Result<(), OpenAiError> {
    let Some((field, _)) = other.iter().find(|(k, v)| !v.is_null() && !harmless(k, v)) else {
        return Ok(());
    };
    let why = match field.as_str() {
        "store" | "previous_response_id" | "conversation" | "background" => {
            "this server keeps no responses (stateless); send the whole input"
        }
        _ => "is not supported by this server",
    };
    Err(OpenAiError::invalid(field, format!("{field}: {why}")))
}

/// `POST /v1/responses` → `/execute` with `messages`.
pub fn map_responses(
    req: ResponsesRequest,
    job_id: &str,
    served: &[&str],
    format: ToolFormat,
) -> Result<(Mapped, Echo), OpenAiError> {
    refuse_unserved(&req.other)?;
    if !served.contains(&req.model.as_str()) {
        return Err(OpenAiError::model_not_found(&req.model, served[0]));
    }
    let reasoning = req.reasoning.unwrap_or_default();
    if let Some((field, _)) = reasoning.other.iter().find(|(_, v)| !v.is_null()) {
        return Err(OpenAiError::invalid(
            "reasoning",
            format!("reasoning.{field}: is not supported by this server"),
        ));
    }
    let text = req.text.unwrap_or_default();
    if let Some((field, _)) = text.other.iter().find(|(_, v)| !v.is_null()) {
        return Err(OpenAiError::invalid(
            "text",
            format!("text.{field}: is not supported by this server"),
        ));
    }
    let spec = tools::spec(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    let mut messages = Vec::new();
    if let Some(instructions) = &req.instructions {
        messages.push(message("system", instructions.clone()));
    }
    match req.input {
        ResponsesInput::Text(text) => messages.push(message("user", text)),
        ResponsesInput::Items(items) => {
            for (i, item) in items.into_iter().enumerate() {
                match item.kind.as_deref() {
                    Some("function_call") => tools::add_call(&mut messages, i, item)?,
                    Some("function_call_output") => messages.push(tools::output_message(i, item)?),
                    _ => messages.push(item_message(i, item)?),
                }
            }
        }
    }
    let echo = Echo {
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        tools: req
            .tools
            .as_ref()
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
        tool_choice: match (&req.tool_choice, &spec) {
            (Some(c), _) if !c.is_null() => c.clone(),
            (_, Some(_)) => Value::from("auto"),
            _ => Value::from("none"),
        },
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
    };
    let mut execute = ExecuteRequest {
        job_id: Some(job_id.to_string()),
        messages: Some(messages),
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed.map(i128::from),
        reasoning_effort: reasoning.effort,
        json_schema: text.format.and_then(|f| ResponseFormat::from(f).schema()),
        door: Door::V1,
        ..ExecuteRequest::default()
    };
    let shape = ReplyShape {
        stream: req.stream,
        include_usage: false,
        continuous_usage: false,
        logprobs: false,
        top_logprobs: 0,
        choices: 1,
    };
    let tools = spec.and_then(|t| crate::server::openai::tools::apply(&t, format, &mut execute));
    let mapped = Mapped {
        execute,
        prompt_ids: None,
        shape,
        tools,
    };
    Ok((mapped, echo))
}

fn message(role: &str, content: String) -> MessageIn {
    MessageIn::text(role, content)
}

/// One input item as a chat message: a message item's role and text parts.
fn item_message(i: usize, item: InputItem) -> Result<MessageIn, OpenAiError> {
    let invalid = |why: String| OpenAiError::invalid("input", format!("input: item {i} {why}"));
    match item.kind.as_deref() {
        None | Some("message") => {}
        Some(kind) => {
            return Err(invalid(format!(
                "has type {kind:?}; served are message, function_call and function_call_output"
            )))
        }
    }
    let role = match item.role.as_deref() {
        Some("developer") | Some("system") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        other => return Err(invalid(format!("has role {other:?}"))),
    };
    let text = match item.content {
        None => return Err(invalid("has no content".into())),
        Some(InputContent::Text(text)) => text,
        Some(InputContent::Parts(parts)) => joined_text(
            parts.into_iter().map(|p| (p.kind, p.text)),
            &["input_text", "output_text"],
        )
        .map_err(|kind| {
            invalid(format!(
                "has a content part of type {kind:?}; only text is served"
            ))
        })?,
    };
    Ok(message(role, text))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn map(body: Value) -> Result<(Mapped, Echo), OpenAiError> {
        map_responses(
            serde_json::from_value(body).unwrap(),
            "resp-1",
            &["smol"],
            ToolFormat::Hermes,
        )
    }

    #[test]
    fn instructions_and_message_items_become_chat_messages() {
        let (m, echo) = map(json!({
            "model": "smol", "instructions": "Be brief.", "max_output_tokens": 9,
            "temperature": 0.5, "stream": true, "store": false, "reasoning": {"effort": "low"},
            "text": {"format": {"type": "text"}}, "metadata": {"k": "v"},
            "input": [
                {"role": "developer", "content": "Answer in English."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
                {"role": "user", "content": "Name a colour."}
            ]
        }))
        .unwrap();
        let got: Vec<(String, String)> = m
            .execute
            .messages
            .unwrap()
            .into_iter()
            .map(|m| (m.role, m.content.unwrap_or_default()))
            .collect();
        let want = [
            ("system", "Be brief."),
            ("system", "Answer in English."),
            ("user", "Hi"),
            ("assistant", "Hello."),
            ("user", "Name a colour."),
        ];
        assert_eq!(
            got,
            want.map(|(r, c)| (r.to_string(), c.to_string())).to_vec()
        );
        assert_eq!(m.execute.max_tokens, Some(9));
        assert_eq!(m.execute.reasoning_effort.as_deref(), Some("low"));
        assert!(m.shape.stream);
        assert_eq!(echo.instructions.as_deref(), Some("Be brief."));
        let (m, _) = map(json!({"model": "smol", "input": "Hi"})).unwrap();
        assert_eq!(
            m.execute.messages.unwrap()[0].content.as_deref(),
            Some("Hi")
        );
    }

    #[test]
    fn text_formats_become_the_schema_execute_enforces() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let format = |f: Value| {
            let body = json!({"model": "smol", "input": "Hi", "text": {"format": f}});
            map(body).unwrap().0.execute.json_schema
        };
        assert_eq!(format(json!({"type": "text"})), None);
        assert_eq!(
            format(json!({"type": "json_object"})),
            Some(json!({"type": "object"}))
        );
        let named = json!({"type": "json_schema", "name": "x", "schema": schema, "strict": true});
        assert_eq!(format(named), Some(schema));
    }

    #[test]
    fn state_tools_and_other_formats_are_refused_by_name() {
        let refused = |extra: Value| {
            let mut body = json!({"model": "smol", "input": "Hi"});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            map(body).unwrap_err().body.error
        };
        for (extra, param) in [
            (json!({"store": true}), "store"),
            (
                json!({"previous_response_id": "resp-0"}),
                "previous_response_id",
            ),
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"text": {"verbosity": "low"}}), "text"),
            (json!({"reasoning": {"summary": "auto"}}), "reasoning"),
            (
                json!({"input": [{"type": "function_call_output", "output": "4"}]}),
                "input",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": []}]}),
                "input",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input",
            ),
            (json!({"frequency_penalty": 1}), "frequency_penalty"),
        ] {
            let e = refused(extra.clone());
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
            assert!(e.message.starts_with(param), "{}", e.message);
        }
        let e = map(json!({"model": "gpt-5", "input": "Hi"})).unwrap_err();
        assert_eq!(e.status.as_u16(), 404);
    }
}
