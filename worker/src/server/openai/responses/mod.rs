//! `POST /v1/responses` (issue 43), OpenAI's Responses API, stateless: the
//! input items are mapped onto `/execute`'s request ([`request`]; function
//! tools and call items in the chat route's terms, [`tools`]) and run
//! through the same validation, queue and engine as the chat route; the
//! answer is one `response` holding an assistant message and, with tools,
//! a `function_call` item per call read from the output, or the stream of
//! named events [`stream`] describes. Errors are OpenAI's.

pub mod request;
pub mod stream;
pub mod tools;
pub mod types;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use self::request::Echo;
use self::stream::StreamState;
use self::tools::call_item;
use self::types::{
    OutputItem, OutputMessage, OutputText, ResponseObject, ResponseUsage, ResponsesRequest,
};
use crate::engine::generate::{GenerationSummary, StopReason};
use crate::server::openai::error::{OpenAiError, Refusals};
use crate::server::openai::handle::{open, Body};
use crate::server::openai::reply::{collect, Collected, ReplyCtx};
use crate::server::openai::stream::sse_named;
use crate::server::openai::tools::format::ToolFormat;
use crate::server::openai::tools::release::Release;
use crate::server::state::AppState;

/// Creates a response.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true`, the Responses API's named \
            SSE events (`response.created` ... `response.completed`; a call's arguments as \
            `response.function_call_arguments.delta`)", content(
            (ResponseObject = "application/json"),
            (String = "text/event-stream"),
        )),
        Refusals,
    )
)]
pub async fn responses(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<ResponsesRequest>,
) -> Result<Response, OpenAiError> {
    let format = ToolFormat::of(&state.tokenizer);
    let mut echo = Echo::default();
    let map = |req, id: &str, served: &[&str]| {
        let (mapped, e) = request::map_responses(req, id, served, format)?;
        echo = e;
        Ok(mapped)
    };
    let (ctx, events) = open(&state, &headers, body, "resp", map).await?;
    let reply = Reply { ctx, echo };
    if reply.ctx.shape.stream {
        let mut stream = StreamState::new(&reply);
        return Ok(sse_named(events, move |e| stream.events(&reply, e)));
    }
    let collected = collect(events).await?;
    Ok(Json(reply.whole(&collected)).into_response())
}

/// One response's fixed facts.
pub struct Reply {
    pub ctx: ReplyCtx,
    pub echo: Echo,
}

impl Reply {
    /// The id of the message at `output_index` (the first is
    /// `msg-<the response's hex>`).
    pub fn message_id(&self, output_index: usize) -> String {
        let hex = self.ctx.id.trim_start_matches("resp-");
        match output_index {
            0 => format!("msg-{hex}"),
            i => format!("msg-{hex}-{i}"),
        }
    }

    pub fn message(&self, output_index: usize, status: &str, text: Option<&str>) -> OutputMessage {
        OutputMessage {
            kind: "message".into(),
            id: self.message_id(output_index),
            status: status.into(),
            role: "assistant".into(),
            content: text.map(output_text).into_iter().collect(),
        }
    }

    /// The response object: in progress (`end` none), or ended by `end`
    /// with its `output`; `incomplete` at `max_output_tokens` unless the
    /// answer holds calls.
    pub fn object(&self, end: Option<(&GenerationSummary, Vec<OutputItem>)>) -> ResponseObject {
        let called = |items: &[OutputItem]| {
            items
                .iter()
                .any(|i| matches!(i, OutputItem::FunctionCall(_)))
        };
        let status = match &end {
            None => "in_progress",
            Some((s, items)) if s.stop_reason == StopReason::MaxTokens && !called(items) => {
                "incomplete"
            }
            Some(_) => "completed",
        };
        let usage = end.as_ref().map(|(s, _)| ResponseUsage {
            input_tokens: self.ctx.prompt_tokens,
            input_tokens_details: json!({"cached_tokens": 0}),
            output_tokens: s.tokens_out,
            output_tokens_details: json!({"reasoning_tokens": 0}),
            total_tokens: self.ctx.prompt_tokens + s.tokens_out,
        });
        ResponseObject {
            id: self.ctx.id.clone(),
            object: "response".into(),
            created_at: self.ctx.created,
            status: status.into(),
            incomplete_details: (status == "incomplete")
                .then(|| json!({"reason": "max_output_tokens"})),
            error: None,
            model: self.ctx.model.clone(),
            instructions: self.echo.instructions.clone(),
            max_output_tokens: self.echo.max_output_tokens,
            output: end.map(|(_, items)| items).unwrap_or_default(),
            parallel_tool_calls: self.echo.parallel_tool_calls,
            tool_choice: self.echo.tool_choice.clone(),
            tools: self.echo.tools.clone(),
            temperature: self.echo.temperature,
            top_p: self.echo.top_p,
            store: false,
            usage,
        }
    }

    /// The status an ended item has: `incomplete` at `max_output_tokens`.
    pub fn item_status(summary: &GenerationSummary) -> &'static str {
        match summary.stop_reason {
            StopReason::MaxTokens => "incomplete",
            _ => "completed",
        }
    }

    /// The whole answer of a job collected to its end: the message holds
    /// the text that goes to `content` (a gpt-oss model's analysis channel
    /// is left out, as on the chat route without `reasoning_content`); it
    /// is left out when the answer is calls alone.
    fn whole(&self, c: &Collected) -> ResponseObject {
        let summary = c.summary.as_ref().expect("a collected job has its summary");
        let released = Release::whole(
            self.ctx.tokenizer.clone(),
            self.ctx.tools.clone(),
            &c.tokens,
        );
        let mut output = Vec::new();
        if !released.content.is_empty() || released.calls.is_empty() {
            let status = Self::item_status(summary);
            let message = self.message(0, status, Some(&released.content));
            output.push(OutputItem::Message(message));
        }
        let calls = released.calls.into_iter();
        output.extend(calls.map(|c| OutputItem::FunctionCall(call_item(c, "completed"))));
        self.object(Some((summary, output)))
    }
}

pub fn output_text(text: &str) -> OutputText {
    OutputText {
        kind: "output_text".into(),
        text: text.into(),
        annotations: Vec::new(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::job::JobEvent;
    use crate::server::openai::reply::tests::{ctx, summary, token};
    use serde_json::Value;

    pub(crate) fn reply() -> Reply {
        Reply {
            ctx: ctx(false, 0, false),
            echo: Echo {
                instructions: Some("Be brief.".into()),
                max_output_tokens: Some(2),
                ..Echo::default()
            },
        }
    }

    #[test]
    fn a_whole_response_holds_one_message_and_its_usage() {
        let c = Collected {
            tokens: vec![token(0, b'H', &[]), token(1, b'i', &[])],
            summary: Some(summary(StopReason::Eos)),
        };
        let v = serde_json::to_value(reply().whole(&c)).unwrap();
        assert_eq!(
            (v["object"].clone(), v["status"].clone()),
            (json!("response"), json!("completed"))
        );
        assert_eq!(v["output"][0]["content"][0]["text"], "Hi");
        assert_eq!(v["output"][0]["role"], "assistant");
        assert_eq!(v["usage"]["total_tokens"], 7);
        assert_eq!(v["instructions"], "Be brief.");
        assert_eq!(v["store"], false);
        let c = Collected {
            summary: Some(summary(StopReason::MaxTokens)),
            ..c
        };
        let v = serde_json::to_value(reply().whole(&c)).unwrap();
        assert_eq!(v["status"], "incomplete");
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    }

    #[test]
    fn a_stream_is_the_responses_event_sequence_numbered_in_order() {
        let r = reply();
        let mut s = StreamState::new(&r);
        let started = JobEvent::Started(crate::engine::job::JobStarted {
            job_id: "resp-1".into(),
            model: "smol".into(),
            started_at: chrono::Utc::now(),
            seed: 1,
        });
        let mut out = Vec::new();
        for e in [
            started,
            JobEvent::Token(token(0, b'H', &[])),
            JobEvent::Token(token(1, b'i', &[])),
            JobEvent::End(summary(StopReason::Eos)),
        ] {
            out.extend(s.events(&r, &e));
        }
        let names: Vec<&str> = out.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, (name, data)) in out.iter().enumerate() {
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(
                (v["type"].as_str(), v["sequence_number"].as_u64()),
                (Some(*name), Some(i as u64))
            );
        }
        let last: Value = serde_json::from_str(&out[9].1).unwrap();
        assert_eq!(last["response"]["output"][0]["content"][0]["text"], "Hi");
        assert_eq!(last["response"]["usage"]["output_tokens"], 2);
    }
}
