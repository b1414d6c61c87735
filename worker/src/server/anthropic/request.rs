//! Anthropic Messages request → the worker's own [`ExecuteRequest`]: the
//! system prompt becomes the first message, text blocks are joined, and the
//! sampling fields both APIs share are copied as they are, so `/execute`'s
//! validation judges them and names them in its errors. What the worker
//! cannot honour (tools, images, extended thinking, any other field) is
//! refused by name, never ignored.

use serde_json::{Map, Value};

use super::error::AnthropicError;
use super::types::{Content, MessagesRequest};
use crate::server::openai::request::joined_text;
use crate::server::validation::{ExecuteRequest, MessageIn};

/// Fields accepted and ignored because they do not change the answer, when
/// they hold these values (`null` is always accepted).
fn harmless(field: &str, value: &Value) -> bool {
    match field {
        // Where or how fast to run, who asks, and prompt caching (the worker
        // reuses prompts on its own): none changes the answer.
        "metadata" | "service_tier" | "inference_geo" | "speed" | "cache_control" => true,
        "tools" => value.as_array().is_some_and(Vec::is_empty),
        "tool_choice" => value.get("type").and_then(Value::as_str) == Some("none"),
        _ => false,
    }
}

/// Refuses the first field the worker does not serve, by name.
fn refuse_unserved(other: &Map<String, Value>) -> Result<(), AnthropicError> {
    match other.iter().find(|(k, v)| !v.is_null() && !harmless(k, v)) {
        Some((field, _)) if field == "tools" || field == "tool_choice" => Err(
            AnthropicError::invalid(format!("{field}: tool use is not served yet")),
        ),
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
}

/// `POST /v1/messages` → `/execute` with `messages` (the system prompt first).
pub fn map_messages(
    req: MessagesRequest,
    job_id: &str,
    served: &[&str],
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
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system {
        messages.push(MessageIn::text("system", text_of(system, "system")?));
    }
    for (i, m) in req.messages.into_iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(AnthropicError::invalid(format!(
                "messages: message {i} has role {:?}; roles are \"user\" and \"assistant\" \
                 (the system prompt goes in `system`)",
                m.role
            )));
        }
        let content = text_of(m.content, &format!("messages: message {i}"))?;
        messages.push(MessageIn::text(m.role, content));
    }
    let execute = ExecuteRequest {
        job_id: Some(job_id.to_string()),
        messages: Some(messages),
        max_tokens: Some(req.max_tokens),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences,
        ..ExecuteRequest::default()
    };
    Ok(Mapped {
        execute,
        stream: req.stream,
    })
}

/// The text of `content`: its text blocks joined; any other block refused,
/// named by `place` (`system`, `messages: message 2`).
fn text_of(content: Content, place: &str) -> Result<String, AnthropicError> {
    let blocks = match content {
        Content::Text(text) => return Ok(text),
        Content::Blocks(blocks) => blocks,
    };
    joined_text(blocks.into_iter().map(|b| (b.kind, b.text)), &["text"]).map_err(|kind| {
        AnthropicError::invalid(match kind.as_str() {
            "tool_use" | "tool_result" => {
                format!("{place} has a {kind} block: tool use is not served yet")
            }
            _ => format!("{place} has a content block of type {kind:?}; only text is served"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<Mapped, AnthropicError> {
        let req: MessagesRequest = serde_json::from_value(body).unwrap();
        map_messages(req, "msg_1", &["smol"])
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
            serde_json::json!({"tools": [{"name": "f", "input_schema": {"type": "object"}}]});
        assert!(message_of(request(base(tools)).unwrap_err()).starts_with("tools: "));
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
        let result = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "4"}]}]});
        assert!(message_of(request(base(result)).unwrap_err()).contains("tool_result"));
        let system_role = serde_json::json!({"messages": [{"role": "system", "content": "x"}]});
        assert!(message_of(request(base(system_role)).unwrap_err()).contains("`system`"));
        let other_model = serde_json::json!({"model": "claude-sonnet-4"});
        let e = request(base(other_model)).unwrap_err();
        assert_eq!(e.status.as_u16(), 404);
    }
}
