//! `/v1/messages`' whole answer: one `message`, its content the text, then
//! a `tool_use` block per call read from the output when the request has
//! tools (`stop_reason` `tool_use` then). The stream is in `stream.rs`.

use std::sync::Arc;

use super::tools::tool_use;
use super::types::{ContentBlock, Message, MessagesUsage};
use crate::engine::generate::{GenerationSummary, StopReason};
use crate::server::openai::reply::Collected;
use crate::server::openai::tools::parse::{Released, ToolReply};
use crate::server::openai::tools::release::Release;
use crate::tokenizer::Tokenizer;

/// One answer's fixed facts.
#[derive(Clone)]
pub struct MessageCtx {
    /// `msg_<hex>`, also the job's id.
    pub id: String,
    pub model: String,
    pub input_tokens: usize,
    pub tokenizer: Arc<Tokenizer>,
    /// How to read calls from the answer (tools given, `tool_choice` not `none`).
    pub tools: Option<ToolReply>,
}

impl MessageCtx {
    /// A reader of the answer's tokens: a gpt-oss model's analysis channel
    /// and structure tokens are left out (extended thinking is not served).
    pub fn release(&self) -> Release {
        Release::new(self.tokenizer.clone(), self.tools.clone())
    }

    /// The message with `content`; `end` none while it is under way.
    pub fn message(
        &self,
        content: Vec<ContentBlock>,
        end: Option<&GenerationSummary>,
        called: bool,
    ) -> Message {
        let (stop_reason, stop_sequence) = end.map(|s| stop_of(s, called)).unzip();
        Message {
            id: self.id.clone(),
            kind: "message".into(),
            role: "assistant".into(),
            model: self.model.clone(),
            content,
            stop_reason: stop_reason.map(str::to_string),
            stop_sequence: stop_sequence.flatten(),
            usage: MessagesUsage {
                input_tokens: self.input_tokens,
                output_tokens: end.map_or(0, |s| s.tokens_out),
            },
        }
    }

    /// The whole answer of a job collected to its end: a text block (none
    /// when there is no text), then the calls.
    pub fn whole(&self, c: &Collected) -> Message {
        let released = Release::whole(self.tokenizer.clone(), self.tools.clone(), &c.tokens);
        let (text, calls) = blocks(released);
        let called = !calls.is_empty();
        let content = Some(text)
            .filter(|t| !t.is_empty())
            .map(ContentBlock::text)
            .into_iter()
            .chain(calls)
            .collect();
        self.message(content, c.summary.as_ref(), called)
    }
}

/// What the reader released, as Anthropic content: the text (with any call
/// that cannot be a `tool_use` block, see [`tool_use`]) and the
/// `tool_use` blocks.
pub fn blocks(released: Released) -> (String, Vec<ContentBlock>) {
    let mut text = released.content;
    let mut calls = Vec::new();
    for call in released.calls {
        match tool_use(call) {
            Ok(block) => calls.push(block),
            Err(as_text) => text.push_str(&as_text),
        }
    }
    (text, calls)
}

/// `stop_reason` and `stop_sequence` of a finished job; `tool_use` when
/// the answer holds calls.
pub fn stop_of(summary: &GenerationSummary, called: bool) -> (&'static str, Option<String>) {
    match &summary.stop_reason {
        _ if called => ("tool_use", None),
        StopReason::MaxTokens => ("max_tokens", None),
        StopReason::Eos => ("end_turn", None),
        StopReason::StopSequence(s) => ("stop_sequence", Some(s.clone())),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::engine::job::TokenOut;
    use crate::engine::testing::byte_tokenizer;
    use crate::server::openai::reply::tests::summary;
    use crate::server::openai::tools::format::ToolFormat;

    pub(crate) fn ctx(tools: bool) -> MessageCtx {
        MessageCtx {
            id: "msg_1".into(),
            model: "smol".into(),
            input_tokens: 5,
            tokenizer: byte_tokenizer(),
            tools: tools.then(|| ToolReply {
                format: ToolFormat::Hermes,
                parallel: true,
                names: vec!["get_weather".into()],
            }),
        }
    }

    pub(crate) fn token(index: usize, text: &str) -> TokenOut {
        TokenOut {
            index,
            id: u32::from(text.as_bytes().first().copied().unwrap_or(0)),
            text: text.into(),
            logprobs: None,
            channel: None,
        }
    }

    #[test]
    fn a_whole_answer_has_its_text_stop_reason_and_usage() {
        let c = Collected {
            tokens: vec![token(0, "H"), token(1, "i")],
            summary: Some(summary(StopReason::StopSequence("\n".into()))),
        };
        let m = serde_json::to_value(ctx(false).whole(&c)).unwrap();
        assert_eq!(m["type"], "message");
        assert_eq!(m["role"], "assistant");
        assert_eq!(m["content"], json!([{"type": "text", "text": "Hi"}]));
        assert_eq!(m["stop_reason"], "stop_sequence");
        assert_eq!(m["stop_sequence"], "\n");
        assert_eq!(m["usage"], json!({"input_tokens": 5, "output_tokens": 2}));
        let empty = Collected {
            tokens: Vec::new(),
            summary: Some(summary(StopReason::Eos)),
        };
        let m = serde_json::to_value(ctx(false).whole(&empty)).unwrap();
        assert_eq!(
            (m["content"].clone(), m["stop_reason"].clone()),
            (json!([]), json!("end_turn"))
        );
    }

    /// A think block (Qwen3) is left out of the text, as gpt-oss's
    /// analysis channel is: extended thinking is not served.
    #[test]
    fn a_think_block_is_left_out_of_the_text() {
        use crate::engine::testing::{think_byte_tokenizer, THINK_CLOSE_ID, THINK_OPEN_ID};
        let marker = |index: usize, id: u32, text: &str| TokenOut {
            id,
            ..token(index, text)
        };
        let mut reasoning = token(1, "Hm");
        reasoning.channel = Some(crate::tokenizer::think::CHANNEL.into());
        let c = Collected {
            tokens: vec![
                marker(0, THINK_OPEN_ID, "<think>"),
                reasoning,
                marker(2, THINK_CLOSE_ID, "</think>"),
                token(3, "\n\nHi"),
            ],
            summary: Some(summary(StopReason::Eos)),
        };
        let mut think = ctx(false);
        think.tokenizer = think_byte_tokenizer();
        let m = serde_json::to_value(think.whole(&c)).unwrap();
        assert_eq!(m["content"], json!([{"type": "text", "text": "Hi"}]));
    }

    /// With tools, a call in the output is a tool_use block after the
    /// text, and the stop reason is `tool_use`; without them it is text.
    #[test]
    fn a_whole_answer_with_a_call_has_a_tool_use_block() {
        let c = Collected {
            tokens: vec![
                token(0, "Sure.\n<tool_call>\n{\"name\": \"get_weather\", "),
                token(1, "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            ],
            summary: Some(summary(StopReason::Eos)),
        };
        let m = serde_json::to_value(ctx(true).whole(&c)).unwrap();
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["stop_sequence"], Value::Null);
        assert_eq!(m["content"][0], json!({"type": "text", "text": "Sure."}));
        let call = &m["content"][1];
        assert_eq!(
            (&call["type"], &call["name"], &call["input"]),
            (
                &json!("tool_use"),
                &json!("get_weather"),
                &json!({"city": "Paris"})
            )
        );
        let id = call["id"].as_str().unwrap();
        assert!(id.starts_with("toolu_") && id.len() == 30, "{id}");
        let m = serde_json::to_value(ctx(false).whole(&c)).unwrap();
        assert_eq!(m["stop_reason"], "end_turn");
        assert_eq!(m["content"].as_array().unwrap().len(), 1);
    }
}
