//! `POST /v1/responses` (issue 43), OpenAI's Responses API, stateless: the
//! input items are mapped onto `/execute`'s request ([`request`]) and run
//! through the same validation, queue and engine as the chat route; the
//! answer is one `response` holding one assistant message, or the stream of
//! named events `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`*, `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete` at `max_output_tokens`);
//! a job's error after the start is an `error` event. Errors are OpenAI's.

pub mod request;
pub mod types;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use self::request::Echo;
use self::types::{OutputMessage, OutputText, ResponseObject, ResponseUsage, ResponsesRequest};
use crate::engine::generate::{GenerationSummary, StopReason};
use crate::engine::job::JobEvent;
use crate::server::openai::error::{OpenAiError, Refusals};
use crate::server::openai::handle::{open, Body};
use crate::server::openai::reply::{collect, Collected, Part, ReplyCtx};
use crate::server::openai::stream::sse_named;
use crate::server::state::AppState;

/// Creates a response.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true`, the Responses API's named \
            SSE events (`response.created` ... `response.completed`)", content(
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
    let mut echo = Echo::default();
    let map = |req, id: &str, served: &[&str]| {
        let (mapped, e) = request::map_responses(req, id, served)?;
        echo = e;
        Ok(mapped)
    };
    let (ctx, events) = open(&state, &headers, body, "resp", map).await?;
    let reply = Reply { ctx, echo };
    if reply.ctx.shape.stream {
        let mut stream = StreamState::default();
        return Ok(sse_named(events, move |e| stream.events(&reply, e)));
    }
    let collected = collect(events).await?;
    Ok(Json(reply.whole(&collected)).into_response())
}

/// One response's fixed facts.
struct Reply {
    ctx: ReplyCtx,
    echo: Echo,
}

impl Reply {
    fn message_id(&self) -> String {
        format!("msg-{}", self.ctx.id.trim_start_matches("resp-"))
    }

    fn item(&self, status: &str, text: Option<&str>) -> OutputMessage {
        OutputMessage {
            kind: "message".into(),
            id: self.message_id(),
            status: status.into(),
            role: "assistant".into(),
            content: text.map(output_text).into_iter().collect(),
        }
    }

    /// The response object: in progress (`end` none), or ended by `end`
    /// with `text`.
    fn object(&self, end: Option<(&GenerationSummary, &str)>) -> ResponseObject {
        let status = match end {
            None => "in_progress",
            Some((s, _)) if s.stop_reason == StopReason::MaxTokens => "incomplete",
            Some(_) => "completed",
        };
        let output = end
            .map(|(_, text)| vec![self.item(status, Some(text))])
            .unwrap_or_default();
        let usage = end.map(|(s, _)| ResponseUsage {
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
            output,
            parallel_tool_calls: false,
            tool_choice: "none".into(),
            tools: Vec::new(),
            temperature: self.echo.temperature,
            top_p: self.echo.top_p,
            store: false,
            usage,
        }
    }

    /// The whole answer of a job collected to its end: the message holds the
    /// text that goes to `content` (a gpt-oss model's analysis channel is
    /// left out, as on the chat route without `reasoning_content`).
    fn whole(&self, c: &Collected) -> ResponseObject {
        let summary = c.summary.as_ref().expect("a collected job has its summary");
        self.object(Some((summary, &c.text_of(&self.ctx, Part::Content))))
    }
}

fn output_text(text: &str) -> OutputText {
    OutputText {
        kind: "output_text".into(),
        text: text.into(),
        annotations: Vec::new(),
    }
}

/// What a stream has sent so far: the events' sequence numbers and the text.
#[derive(Default)]
struct StreamState {
    sequence: u64,
    text: String,
}

impl StreamState {
    /// One named event: its data is `fields` with `type` and `sequence_number`.
    fn event(&mut self, name: &'static str, mut fields: Value) -> (&'static str, String) {
        fields["type"] = json!(name);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (name, fields.to_string())
    }

    /// The events one job event becomes.
    fn events(&mut self, r: &Reply, event: &JobEvent) -> Vec<(&'static str, String)> {
        let id = r.message_id();
        match event {
            JobEvent::Started(_) => {
                let created = json!({"response": r.object(None)});
                vec![
                    self.event("response.created", created.clone()),
                    self.event("response.in_progress", created),
                    self.event(
                        "response.output_item.added",
                        json!({"output_index": 0, "item": r.item("in_progress", None)}),
                    ),
                    self.event(
                        "response.content_part.added",
                        json!({"item_id": id, "output_index": 0, "content_index": 0,
                            "part": output_text("")}),
                    ),
                ]
            }
            JobEvent::Token(t) if t.text.is_empty() || r.ctx.part(t) != Part::Content => Vec::new(),
            JobEvent::Token(t) => {
                self.text.push_str(&t.text);
                vec![self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": 0, "content_index": 0,
                        "delta": t.text, "logprobs": []}),
                )]
            }
            JobEvent::End(summary) => {
                let text = std::mem::take(&mut self.text);
                let done = r.object(Some((summary, &text)));
                let last = if done.status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                vec![
                    self.event(
                        "response.output_text.done",
                        json!({"item_id": id, "output_index": 0, "content_index": 0,
                            "text": text, "logprobs": []}),
                    ),
                    self.event(
                        "response.content_part.done",
                        json!({"item_id": id, "output_index": 0, "content_index": 0,
                            "part": output_text(&text)}),
                    ),
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": 0, "item": done.output[0]}),
                    ),
                    self.event(last, json!({"response": done})),
                ]
            }
            JobEvent::Error(e) => {
                let body = OpenAiError::from(e.clone()).body.error;
                vec![self.event(
                    "error",
                    json!({"code": body.code, "message": body.message, "param": body.param}),
                )]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::openai::reply::tests::{ctx, summary, token};

    fn reply() -> Reply {
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
        let mut s = StreamState::default();
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
