//! `/v1/messages`' answers: one `message`, or Anthropic's stream of named
//! events: `message_start`, `content_block_start`, `ping`, a
//! `content_block_delta` per token that releases text, `content_block_stop`,
//! `message_delta` (stop reason and output tokens), `message_stop`; a job's
//! error after the start is an `error` event.

use std::sync::Arc;

use serde_json::{json, Value};

use super::error::AnthropicError;
use super::types::{Message, MessagesUsage, TextBlock};
use crate::engine::generate::{GenerationSummary, StopReason};
use crate::engine::job::{JobEvent, TokenOut};
use crate::server::openai::reply::{part_of, Collected, Part};
use crate::tokenizer::Tokenizer;

/// One answer's fixed facts.
#[derive(Clone)]
pub struct MessageCtx {
    /// `msg_<hex>`, also the job's id.
    pub id: String,
    pub model: String,
    pub input_tokens: usize,
    pub tokenizer: Arc<Tokenizer>,
}

impl MessageCtx {
    /// Whether a token's text belongs in the answer: a gpt-oss model's
    /// analysis channel and structure tokens do not (extended thinking is
    /// not served).
    fn shows(&self, token: &TokenOut) -> bool {
        part_of(&self.tokenizer, token) == Part::Content
    }

    fn message(&self, content: Vec<TextBlock>, end: Option<&GenerationSummary>) -> Message {
        let (stop_reason, stop_sequence) = end.map(stop_of).unzip();
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

    /// The whole answer of a job collected to its end.
    pub fn whole(&self, c: &Collected) -> Message {
        let text: String = c
            .tokens
            .iter()
            .filter(|t| self.shows(t))
            .map(|t| t.text.as_str())
            .collect();
        let content = if text.is_empty() {
            Vec::new()
        } else {
            vec![TextBlock::new(text)]
        };
        self.message(content, c.summary.as_ref())
    }

    /// The `(event, data)` pairs one job event becomes.
    pub fn events(&self, event: &JobEvent) -> Vec<(&'static str, String)> {
        let data = |v: Value| v.to_string();
        match event {
            JobEvent::Started(_) => vec![
                (
                    "message_start",
                    data(
                        json!({"type": "message_start", "message": self.message(Vec::new(), None)}),
                    ),
                ),
                (
                    "content_block_start",
                    data(json!({"type": "content_block_start", "index": 0,
                        "content_block": TextBlock::new("")})),
                ),
                ("ping", data(json!({"type": "ping"}))),
            ],
            JobEvent::Token(t) if t.text.is_empty() || !self.shows(t) => Vec::new(),
            JobEvent::Token(t) => vec![(
                "content_block_delta",
                data(json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": t.text}})),
            )],
            JobEvent::End(summary) => {
                let (stop_reason, stop_sequence) = stop_of(summary);
                vec![
                    (
                        "content_block_stop",
                        data(json!({"type": "content_block_stop", "index": 0})),
                    ),
                    (
                        "message_delta",
                        data(json!({"type": "message_delta",
                            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                            "usage": {"output_tokens": summary.tokens_out}})),
                    ),
                    ("message_stop", data(json!({"type": "message_stop"}))),
                ]
            }
            JobEvent::Error(e) => vec![("error", AnthropicError::from(e.clone()).to_json())],
        }
    }
}

/// `stop_reason` and `stop_sequence` of a finished job.
fn stop_of(summary: &GenerationSummary) -> (&'static str, Option<String>) {
    match &summary.stop_reason {
        StopReason::MaxTokens => ("max_tokens", None),
        StopReason::Eos => ("end_turn", None),
        StopReason::StopSequence(s) => ("stop_sequence", Some(s.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::byte_tokenizer;
    use crate::server::openai::reply::tests::summary;

    fn ctx() -> MessageCtx {
        MessageCtx {
            id: "msg_1".into(),
            model: "smol".into(),
            input_tokens: 5,
            tokenizer: byte_tokenizer(),
        }
    }

    fn token(index: usize, text: &str) -> TokenOut {
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
        let m = serde_json::to_value(ctx().whole(&c)).unwrap();
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
        let m = serde_json::to_value(ctx().whole(&empty)).unwrap();
        assert_eq!(
            (m["content"].clone(), m["stop_reason"].clone()),
            (json!([]), json!("end_turn"))
        );
    }

    #[test]
    fn a_stream_is_anthropic_s_event_sequence() {
        let c = ctx();
        let started = JobEvent::Started(crate::engine::job::JobStarted {
            job_id: "msg_1".into(),
            model: "smol".into(),
            started_at: chrono::Utc::now(),
            seed: 1,
        });
        let mut names = Vec::new();
        let mut texts = String::new();
        for event in [
            started,
            JobEvent::Token(token(0, "H")),
            JobEvent::Token(token(1, "")),
            JobEvent::Token(token(2, "i")),
            JobEvent::End(summary(StopReason::MaxTokens)),
        ] {
            for (name, data) in c.events(&event) {
                let v: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(v["type"], name, "each event's data names it");
                if name == "content_block_delta" {
                    texts.push_str(v["delta"]["text"].as_str().unwrap());
                }
                if name == "message_delta" {
                    assert_eq!(v["delta"]["stop_reason"], "max_tokens");
                    assert_eq!(v["usage"]["output_tokens"], 2);
                }
                if name == "message_start" {
                    assert_eq!(v["message"]["usage"]["input_tokens"], 5);
                    assert_eq!(v["message"]["stop_reason"], Value::Null);
                }
                names.push(name);
            }
        }
        assert_eq!(texts, "Hi");
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
        let failed = c.events(&JobEvent::Error(crate::engine::JobError::timeout(1)));
        assert_eq!(failed[0].0, "error");
        let v: Value = serde_json::from_str(&failed[0].1).unwrap();
        assert_eq!(v["error"]["type"], "timeout_error");
    }
}
