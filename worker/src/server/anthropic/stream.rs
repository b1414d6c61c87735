//! `/v1/messages`' stream of named events, as Anthropic sends it:
//! `message_start`, then the content blocks, each `content_block_start`,
//! its `content_block_delta`s (`text_delta` for text, `input_json_delta`
//! with `partial_json` for a `tool_use` block's input) and
//! `content_block_stop`; then `message_delta` (stop reason and output
//! tokens) and `message_stop`; a job's error after the start is an `error`
//! event. Without tools the one text block opens at the start, before the
//! `ping`; with them a text block opens at the first text, and each call
//! read from the output is a `tool_use` block of its own once complete.

use serde_json::{json, Value};

use super::error::AnthropicError;
use super::reply::{blocks, stop_of, MessageCtx};
use super::types::ContentBlock;
use crate::engine::job::JobEvent;
use crate::server::openai::tools::parse::Released;
use crate::server::openai::tools::release::Release;

/// A named event: its name and its data.
type Named = (&'static str, String);

/// One answer's stream.
pub struct MessageStream {
    ctx: MessageCtx,
    release: Release,
    /// The index of the text block open now.
    open_text: Option<usize>,
    /// Blocks started so far.
    blocks: usize,
    called: bool,
}

fn named(name: &'static str, data: Value) -> Named {
    (name, data.to_string())
}

impl MessageStream {
    pub fn new(ctx: MessageCtx) -> Self {
        MessageStream {
            release: ctx.release(),
            ctx,
            open_text: None,
            blocks: 0,
            called: false,
        }
    }

    /// The events one job event becomes.
    pub fn events(&mut self, event: &JobEvent) -> Vec<Named> {
        match event {
            JobEvent::Started(_) => {
                let start = json!({"type": "message_start",
                    "message": self.ctx.message(Vec::new(), None, false)});
                let mut out = vec![named("message_start", start)];
                if self.ctx.tools.is_none() {
                    out.push(self.open_text());
                }
                out.push(named("ping", json!({"type": "ping"})));
                out
            }
            JobEvent::Token(t) => {
                let released = self.release.token(t);
                self.released(released)
            }
            JobEvent::End(summary) => {
                let released = self.release.finish();
                let mut out = self.released(released);
                out.extend(self.close_text());
                let (stop_reason, stop_sequence) = stop_of(summary, self.called);
                out.push(named(
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                        "usage": {"output_tokens": summary.tokens_out}}),
                ));
                out.push(named("message_stop", json!({"type": "message_stop"})));
                out
            }
            JobEvent::Error(e) => vec![("error", AnthropicError::from(e.clone()).to_json())],
        }
    }

    fn open_text(&mut self) -> Named {
        let index = self.blocks;
        self.blocks += 1;
        self.open_text = Some(index);
        named(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                "content_block": ContentBlock::text("")}),
        )
    }

    fn close_text(&mut self) -> Option<Named> {
        let index = self.open_text.take()?;
        Some(named(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ))
    }

    /// The events of what the reader released: its text into the open
    /// text block (opened if need be), then each call as a block.
    fn released(&mut self, released: Released) -> Vec<Named> {
        let (text, calls) = blocks(released);
        let mut out = Vec::new();
        if !text.is_empty() {
            if self.open_text.is_none() {
                out.push(self.open_text());
            }
            out.push(named(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": self.open_text,
                    "delta": {"type": "text_delta", "text": text}}),
            ));
        }
        for call in calls {
            out.extend(self.close_text());
            out.extend(self.call_events(call));
        }
        out
    }

    /// A `tool_use` block: started with an empty input, the input as one
    /// `input_json_delta`, stopped.
    fn call_events(&mut self, call: ContentBlock) -> Vec<Named> {
        let ContentBlock::ToolUse { id, name, input } = call else {
            return Vec::new();
        };
        let index = self.blocks;
        self.blocks += 1;
        self.called = true;
        let start = ContentBlock::ToolUse {
            id,
            name,
            input: json!({}),
        };
        vec![
            named(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": start}),
            ),
            named(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            ),
            named(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::generate::StopReason;
    use crate::server::anthropic::reply::tests::{ctx, token};
    use crate::server::openai::reply::tests::{started, summary};
    use crate::server::openai::reply::Collected;

    /// Every event of a stream as `(name, data)`; each data names its event.
    fn run(stream: &mut MessageStream, events: &[JobEvent]) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        for event in events {
            for (name, data) in stream.events(event) {
                let v: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(v["type"], name, "each event's data names it");
                out.push((name, v));
            }
        }
        out
    }

    #[test]
    fn a_stream_is_anthropic_s_event_sequence() {
        let mut s = MessageStream::new(ctx(false));
        let out = run(
            &mut s,
            &[
                started(),
                JobEvent::Token(token(0, "H")),
                JobEvent::Token(token(1, "")),
                JobEvent::Token(token(2, "i")),
                JobEvent::End(summary(StopReason::MaxTokens)),
            ],
        );
        let names: Vec<&str> = out.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let texts: String = out
            .iter()
            .filter_map(|(_, v)| v["delta"]["text"].as_str())
            .collect();
        assert_eq!(texts, "Hi");
        assert_eq!(out[0].1["message"]["usage"]["input_tokens"], 5);
        assert_eq!(out[0].1["message"]["stop_reason"], Value::Null);
        assert_eq!(out[6].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(out[6].1["usage"]["output_tokens"], 2);
        let failed = s.events(&JobEvent::Error(crate::engine::JobError::timeout(1)));
        assert_eq!(failed[0].0, "error");
        let v: Value = serde_json::from_str(&failed[0].1).unwrap();
        assert_eq!(v["error"]["type"], "timeout_error");
    }

    /// Text, then a call cut across tokens: a text block, closed when the
    /// call is complete, then the tool_use block (start with an empty
    /// input, the input as one input_json_delta, stop), `tool_use` as the
    /// stop reason; the blocks are the whole answer's.
    #[test]
    fn a_call_streams_as_a_tool_use_block_after_the_text() {
        let tokens = [
            token(0, "Sure.\n<tool_"),
            token(1, "call>\n{\"name\": \"get_weather\", \"arguments\": "),
            token(2, "{\"city\": \"Paris\"}}\n</tool_call>"),
        ];
        let mut events = vec![started()];
        events.extend(tokens.iter().cloned().map(JobEvent::Token));
        events.push(JobEvent::End(summary(StopReason::Eos)));
        let out = run(&mut MessageStream::new(ctx(true)), &events);
        let shape: Vec<(&str, Value)> = out.iter().map(|(n, v)| (*n, v["index"].clone())).collect();
        let want = [
            ("message_start", Value::Null),
            ("ping", Value::Null),
            ("content_block_start", json!(0)),
            ("content_block_delta", json!(0)),
            ("content_block_stop", json!(0)),
            ("content_block_start", json!(1)),
            ("content_block_delta", json!(1)),
            ("content_block_stop", json!(1)),
            ("message_delta", Value::Null),
            ("message_stop", Value::Null),
        ];
        assert_eq!(shape, want);
        assert_eq!(
            out[3].1["delta"],
            json!({"type": "text_delta", "text": "Sure."})
        );
        let start = &out[5].1["content_block"];
        assert_eq!(
            (&start["type"], &start["name"], &start["input"]),
            (&json!("tool_use"), &json!("get_weather"), &json!({}))
        );
        let delta = &out[6].1["delta"];
        assert_eq!(delta["type"], "input_json_delta");
        let input: Value = serde_json::from_str(delta["partial_json"].as_str().unwrap()).unwrap();
        assert_eq!(out[8].1["delta"]["stop_reason"], "tool_use");

        let whole = ctx(true).whole(&Collected {
            tokens: tokens.to_vec(),
            summary: Some(summary(StopReason::Eos)),
        });
        let whole = serde_json::to_value(whole).unwrap();
        assert_eq!(whole["content"][1]["input"], input);
        assert_eq!(whole["content"][0]["text"], "Sure.");
    }

    /// With tools and no text, no text block is opened.
    #[test]
    fn an_answer_of_calls_alone_has_no_text_block() {
        let call = token(
            0,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
        );
        let out = run(
            &mut MessageStream::new(ctx(true)),
            &[
                started(),
                JobEvent::Token(call),
                JobEvent::End(summary(StopReason::Eos)),
            ],
        );
        let starts: Vec<&Value> = out
            .iter()
            .filter(|(n, _)| *n == "content_block_start")
            .map(|(_, v)| &v["content_block"]["type"])
            .collect();
        assert_eq!(starts, [&json!("tool_use")]);
    }
}
