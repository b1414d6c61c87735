//! What a response is made of: its fixed facts ([`Reply`]), the response
//! object, its message item and the whole answer of a collected job (a
//! message, then a `function_call` item per call read from the output).

use serde_json::json;

use super::request::Echo;
use super::tools::call_item;
use super::types::{OutputItem, OutputMessage, OutputText, ResponseObject, ResponseUsage};
use crate::engine::generate::{GenerationSummary, StopReason};
use crate::server::openai::reply::{Collected, ReplyCtx};
use crate::server::openai::tools::release::Release;

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
            input_tokens_details: json!({"cached_tokens": s.tokens_cached}),
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
    pub fn whole(&self, c: &Collected) -> ResponseObject {
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
    use crate::server::openai::reply::tests::{ctx, summary, token};

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
}
