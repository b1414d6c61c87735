//! `/v1/responses`' stream of named events, each numbered
//! (`sequence_number`): `response.created`, `response.in_progress`, then
//! the output items: a message as `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`*,
//! `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`; a call as `response.output_item.added`
//! (arguments empty), `response.function_call_arguments.delta`,
//! `response.function_call_arguments.done`, `response.output_item.done`;
//! then `response.completed` (or `response.incomplete` at
//! `max_output_tokens`). A job's error after the start is an `error`
//! event. Without tools the message opens at the start; with them at the
//! first text (or at the end, empty, when there was neither text nor a
//! call), and each call read from the output is an item once complete.

use serde_json::{json, Value};

use super::reply::{output_text, Reply};
use super::tools::call_item;
use super::types::OutputItem;
use crate::engine::job::JobEvent;
use crate::server::openai::error::OpenAiError;
use crate::server::openai::tools::parse::Released;
use crate::server::openai::tools::release::Release;

/// A named event: its name and its data.
type Named = (&'static str, String);

/// What a stream has sent so far.
pub struct StreamState {
    sequence: u64,
    release: Release,
    /// The items done, in order.
    items: Vec<OutputItem>,
    /// The message open now: its output index and its text so far.
    message: Option<(usize, String)>,
}

impl StreamState {
    pub fn new(r: &Reply) -> Self {
        StreamState {
            sequence: 0,
            release: Release::new(r.ctx.tokenizer.clone(), r.ctx.tools.clone()),
            items: Vec::new(),
            message: None,
        }
    }

    /// One named event: its data is `fields` with `type` and `sequence_number`.
    fn event(&mut self, name: &'static str, mut fields: Value) -> Named {
        fields["type"] = json!(name);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (name, fields.to_string())
    }

    /// The events one job event becomes.
    pub fn events(&mut self, r: &Reply, event: &JobEvent) -> Vec<Named> {
        match event {
            JobEvent::Started(_) => {
                let created = json!({"response": r.object(None)});
                let mut out = vec![
                    self.event("response.created", created.clone()),
                    self.event("response.in_progress", created),
                ];
                if r.ctx.tools.is_none() {
                    out.extend(self.open_message(r));
                }
                out
            }
            JobEvent::Token(t) => {
                let released = self.release.token(t);
                self.released(r, released)
            }
            JobEvent::End(summary) => {
                let released = self.release.finish();
                let mut out = self.released(r, released);
                if self.items.is_empty() && self.message.is_none() {
                    out.extend(self.open_message(r));
                }
                out.extend(self.close_message(r, Reply::item_status(summary)));
                let done = r.object(Some((summary, std::mem::take(&mut self.items))));
                let last = if done.status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                out.push(self.event(last, json!({"response": done})));
                out
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

    /// The events of what the reader released: its text into the open
    /// message (opened if need be), then each call as an item.
    fn released(&mut self, r: &Reply, released: Released) -> Vec<Named> {
        let mut out = Vec::new();
        if !released.content.is_empty() {
            if self.message.is_none() {
                out.extend(self.open_message(r));
            }
            let (index, text) = self.message.as_mut().expect("a message is open");
            text.push_str(&released.content);
            let index = *index;
            out.push(self.event(
                "response.output_text.delta",
                json!({"item_id": r.message_id(index), "output_index": index, "content_index": 0,
                    "delta": released.content, "logprobs": []}),
            ));
        }
        for call in released.calls {
            out.extend(self.close_message(r, "completed"));
            let index = self.items.len();
            let item = call_item(call, "completed");
            let added = json!({"output_index": index,
                "item": call_item_with(&item, "", "in_progress")});
            out.push(self.event("response.output_item.added", added));
            let id = item.id.clone();
            out.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": index, "delta": item.arguments}),
            ));
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": item.arguments}),
            ));
            let item = OutputItem::FunctionCall(item);
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ));
            self.items.push(item);
        }
        out
    }

    fn open_message(&mut self, r: &Reply) -> Vec<Named> {
        let index = self.items.len();
        self.message = Some((index, String::new()));
        let added = json!({"output_index": index, "item": r.message(index, "in_progress", None)});
        let part = json!({"item_id": r.message_id(index), "output_index": index,
            "content_index": 0, "part": output_text("")});
        vec![
            self.event("response.output_item.added", added),
            self.event("response.content_part.added", part),
        ]
    }

    /// Ends the open message, if any, with `status`.
    fn close_message(&mut self, r: &Reply, status: &str) -> Vec<Named> {
        let Some((index, text)) = self.message.take() else {
            return Vec::new();
        };
        let id = r.message_id(index);
        let item = OutputItem::Message(r.message(index, status, Some(&text)));
        let out = vec![
            self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                    "text": text, "logprobs": []}),
            ),
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": output_text(&text)}),
            ),
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ),
        ];
        self.items.push(item);
        out
    }
}

/// A call item as first added: its arguments and status so far.
fn call_item_with(
    item: &super::types::FunctionCallItem,
    arguments: &str,
    status: &str,
) -> OutputItem {
    let mut item = item.clone();
    item.arguments = arguments.into();
    item.status = status.into();
    OutputItem::FunctionCall(item)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::generate::StopReason;
    use crate::engine::job::TokenOut;
    use crate::server::openai::reply::tests::{started, summary, token};
    use crate::server::openai::reply::Collected;
    use crate::server::openai::responses::reply::tests::reply;
    use crate::server::openai::tools::format::ToolFormat;
    use crate::server::openai::tools::parse::ToolReply;

    fn tool_reply() -> Reply {
        let mut r = reply();
        r.ctx.tools = Some(ToolReply {
            format: ToolFormat::Hermes,
            parallel: true,
            names: vec!["get_weather".into()],
        });
        r.echo.tool_choice = json!("required");
        r
    }

    fn text(index: usize, text: &str) -> TokenOut {
        TokenOut {
            index,
            id: 1,
            text: text.into(),
            logprobs: None,
            channel: None,
        }
    }

    /// A stream of `tokens` ended at the end-of-generation token; each
    /// event's data names it and carries its place in the stream.
    fn run(r: &Reply, tokens: &[TokenOut]) -> Vec<(&'static str, Value)> {
        let mut s = StreamState::new(r);
        let mut events = vec![started()];
        events.extend(tokens.iter().cloned().map(JobEvent::Token));
        events.push(JobEvent::End(summary(StopReason::Eos)));
        let mut out = Vec::new();
        for e in &events {
            for (name, data) in s.events(r, e) {
                let v: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(v["type"], name);
                assert_eq!(v["sequence_number"], out.len());
                out.push((name, v));
            }
        }
        out
    }

    fn names<'a>(out: &[(&'a str, Value)]) -> Vec<&'a str> {
        out.iter().map(|(n, _)| *n).collect()
    }

    /// A call alone: no message item, the call as one item whose
    /// arguments come in one delta, the final response's output that item,
    /// as in the whole answer.
    #[test]
    fn a_call_streams_as_a_function_call_item() {
        let r = tool_reply();
        let tokens = [
            text(0, "<tool_call>\n{\"name\": \"get_weather\", "),
            text(1, "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        ];
        let out = run(&r, &tokens);
        assert_eq!(
            names(&out),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let added = &out[2].1["item"];
        assert_eq!(
            (&added["type"], &added["arguments"], &added["status"]),
            (&json!("function_call"), &json!(""), &json!("in_progress"))
        );
        let id = added["id"].as_str().unwrap();
        assert!(id.starts_with("fc_"));
        assert_eq!(out[3].1["item_id"], id);
        assert_eq!(out[3].1["delta"], "{\"city\":\"Paris\"}");
        assert_eq!(out[4].1["arguments"], "{\"city\":\"Paris\"}");
        let done = &out[5].1["item"];
        assert_eq!(done["status"], "completed");
        let last = &out[6].1["response"];
        assert_eq!(last["output"], json!([done]));
        assert_eq!(last["tool_choice"], "required");

        let whole = r.whole(&Collected {
            tokens: tokens.to_vec(),
            summary: Some(summary(StopReason::Eos)),
        });
        let whole = serde_json::to_value(whole).unwrap();
        let item = &whole["output"][0];
        assert_eq!(whole["output"].as_array().unwrap().len(), 1);
        assert_eq!(
            (&item["name"], &item["arguments"]),
            (&done["name"], &done["arguments"])
        );
    }

    /// Text then a call: the message (output 0) is done before the call
    /// (output 1) is added.
    #[test]
    fn text_before_a_call_is_a_message_item_first() {
        let r = tool_reply();
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
        let out = run(&r, &[text(0, "Sure.\n"), text(1, call)]);
        let shape: Vec<(&str, Value)> = out
            .iter()
            .filter(|(n, _)| n.starts_with("response.output_item"))
            .map(|(n, v)| (*n, v["item"]["type"].clone()))
            .collect();
        assert_eq!(
            shape,
            [
                ("response.output_item.added", json!("message")),
                ("response.output_item.done", json!("message")),
                ("response.output_item.added", json!("function_call")),
                ("response.output_item.done", json!("function_call")),
            ]
        );
        let last = &out.last().unwrap().1["response"];
        assert_eq!(last["output"][0]["content"][0]["text"], "Sure.");
        assert_eq!(last["output"][1]["name"], "get_weather");
        // Neither text nor call: one empty message all the same.
        let out = run(&r, &[]);
        let last = &out.last().unwrap().1["response"];
        assert_eq!(last["output"][0]["content"][0]["text"], "");
    }

    #[test]
    fn a_stream_is_the_responses_event_sequence_numbered_in_order() {
        let out = run(&reply(), &[token(0, b'H', &[]), token(1, b'i', &[])]);
        assert_eq!(
            names(&out),
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
        // `run` checked each event's type and sequence number.
        let last = &out[9].1;
        assert_eq!(last["response"]["output"][0]["content"][0]["text"], "Hi");
        assert_eq!(last["response"]["usage"]["output_tokens"], 2);
    }
}
