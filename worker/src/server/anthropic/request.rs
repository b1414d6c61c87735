//! Anthropic Messages request → the worker's own [`ExecuteRequest`]: the
//! system prompt becomes the first message, text blocks are joined,
//! `tool_use` and `tool_result` blocks become the chat route's assistant
//! `tool_calls` and `tool` messages, `tools` and `tool_choice` the chat
//! route's tools (`tools.rs`), and the sampling fields both APIs share are
//! copied as they are, so `/execute`'s validation judges them and names
//! them in its errors. What the worker cannot honour (server tools, images,
//! extended thinking, any other field) is refused by name, never ignored.

use serde_json::{Map, Value};

use super::error::AnthropicError;
use super::tools;
use super::types::{Content, MessagesRequest};
use crate::server::openai::request::joined_text;
use crate::server::openai::tools::format::ToolFormat;
use crate::server::openai::tools::parse::ToolReply;
use crate::server::validation::{Door, ExecuteRequest, MessageIn};

/// Fields accepted and ignored because they do not change the answer (where
/// or how fast to run, who asks, and prompt caching: the worker reuses
/// prompts on its own).
fn harmless(field: &str) -> bool {
    matches!(
        field,
        "metadata" | "service_tier" | "inference_geo" | "speed" | "cache_control"
    )
}

/// Refuses the first field the worker does not serve, by name.
fn refuse_unserved(other: &Map<String, Value>) -> Result<(), AnthropicError> {
    match other.iter().find(|(k, v)| !v.is_null() && !harmless(k)) {
        Some((field, _)) => Err(AnthropicError::invalid(format!(
            "{field}: is not supported by this server"
        ))),
        None => Ok(()),
    }
}

/// A `/v1/messages` request mapped onto the worker's own.
#[derive(Clone, Debug)]
pub struct Mapped {
    pub execute: ExecuteRequest,
    pub stream: bool,
    /// How to read calls from the answer; none without tools or with
    /// `tool_choice` `none`.
    pub tools: Option<ToolReply>,
}

/// `POST /v1/messages` → `/execute` with `messages` (the system prompt
/// first) and, with tools, their definitions and (`any`, `tool`) the
/// grammar of the calls in `format`, the model's.
pub fn map_messages(
    req: MessagesRequest,
    job_id: &str,
    served: &[&str],
    format: ToolFormat,
) -> Result<Mapped, AnthropicError> {
    refuse_unserved(&req.other)?;
    if !served.contains(&req.model.as_str()) {
        return Err(AnthropicError::model_not_found(&req.model, served[0]));
    }
    if let Some(t) = req.thinking.as_ref().filter(|t| t.kind != "disabled") {
        return Err(AnthropicError::invalid(format!(
            "thinking: {:?} is not served; only \"disabled\"",
            t.kind
        )));
    }
    let spec = tools::spec(req.tools.as_ref(), req.tool_choice.as_ref())?;
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system {
        messages.push(MessageIn::text("system", text_of(system, "system")?));
    }
    for (i, m) in req.messages.into_iter().enumerate() {
        let place = format!("messages: message {i}");
        let blocks = match m.content {
            Content::Text(text) if m.role == "user" || m.role == "assistant" => {
                messages.push(MessageIn::text(m.role, text));
                continue;
            }
            Content::Text(_) => Vec::new(),
            Content::Blocks(blocks) => blocks,
        };
        match m.role.as_str() {
            "user" => messages.extend(tools::user(&place, blocks)?),
            "assistant" => messages.push(tools::assistant(&place, blocks)?),
            role => {
                return Err(AnthropicError::invalid(format!(
                    "{place} has role {role:?}; roles are \"user\" and \"assistant\" \
                     (the system prompt goes in `system`)"
                )))
            }
        }
    }
    let mut execute = ExecuteRequest {
        job_id: Some(job_id.to_string()),
        messages: Some(messages),
        max_tokens: Some(req.max_tokens),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        seed: req.seed.map(i128::from),
        stop: req.stop_sequences,
        door: Door::V1,
        ..ExecuteRequest::default()
    };
    let tools = spec.and_then(|t| crate::server::openai::tools::apply(&t, format, &mut execute));
    Ok(Mapped {
        execute,
        stream: req.stream,
        tools,
    })
}

/// The system prompt's text: its text blocks joined; any other block refused.
fn text_of(content: Content, place: &str) -> Result<String, AnthropicError> {
    let blocks = match content {
        Content::Text(text) => return Ok(text),
        Content::Blocks(blocks) => blocks,
    };
    joined_text(blocks.into_iter().map(|b| (b.kind, b.text)), &["text"]).map_err(|kind| {
        AnthropicError::invalid(format!(
            "{place} has a content block of type {kind:?}; only text is served"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<Mapped, AnthropicError> {
        let req: MessagesRequest = serde_json::from_value(body).unwrap();
        map_messages(req, "msg_1", &["smol"], ToolFormat::Hermes)
    }

    fn message_of(e: AnthropicError) -> String {
        e.body.error.message
    }

    #[test]
    fn system_blocks_and_messages_become_execute_messages() {
        let m = request(serde_json::json!({
            "model": "smol", "max_tokens": 7, "stream": true,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                {"role": "user", "content": "Name a colour."}
            ],
            "stop_sequences": ["\n"], "temperature": 0.5, "top_k": 4,
            "metadata": {"user_id": "u-1"}, "tools": [], "thinking": {"type": "disabled"}
        }))
        .unwrap();
        assert!(m.stream);
        let e = m.execute;
        let got: Vec<(String, String)> = e
            .messages
            .unwrap()
            .into_iter()
            .map(|m| (m.role, m.content.unwrap_or_default()))
            .collect();
        let want = [
            ("system", "Be brief."),
            ("user", "Hi"),
            ("assistant", "Hello."),
            ("user", "Name a colour."),
        ];
        assert_eq!(
            got,
            want.map(|(r, c)| (r.to_string(), c.to_string())).to_vec()
        );
        assert_eq!(e.max_tokens, Some(7));
        assert_eq!(e.stop, Some(vec!["\n".to_string()]));
        assert_eq!((e.temperature, e.top_k), (Some(0.5), Some(4)));
        assert_eq!(e.job_id.as_deref(), Some("msg_1"));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = |extra: Value| {
            let mut body = serde_json::json!({
                "model": "smol", "max_tokens": 4,
                "messages": [{"role": "user", "content": "Hi"}]
            });
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            body
        };
        let tools =
            serde_json::json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]});
        assert!(message_of(request(base(tools)).unwrap_err()).starts_with("tools[0].type: "));
        let thinking = serde_json::json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
        assert!(message_of(request(base(thinking)).unwrap_err()).starts_with("thinking: "));
        let unknown = serde_json::json!({"container": "c-1"});
        assert!(message_of(request(base(unknown)).unwrap_err()).starts_with("container: "));
        let image = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]});
        let e = message_of(request(base(image)).unwrap_err());
        assert!(
            e.starts_with("messages: message 0 ") && e.contains("\"image\""),
            "{e}"
        );
        let misplaced = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}]});
        assert!(message_of(request(base(misplaced)).unwrap_err()).contains("\"tool_use\""));
        let system_role = serde_json::json!({"messages": [{"role": "system", "content": "x"}]});
        assert!(message_of(request(base(system_role)).unwrap_err()).contains("`system`"));
        let other_model = serde_json::json!({"model": "claude-sonnet-4"});
        let e = request(base(other_model)).unwrap_err();
        assert_eq!(e.status.as_u16(), 404);
    }
}
