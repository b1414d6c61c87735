//! `POST /v1/completions`: a raw prompt (text or token ids) through
//! `/execute`'s validation, queue and engine, answered as one
//! `text_completion` or a stream of them, with the legacy `logprobs` shape.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::error::{OpenAiError, Refusals};
use super::handle::{answer, open, Body};
use super::reply::{finish_reason, Collected, ReplyCtx, SYSTEM_FINGERPRINT};
use super::request;
use super::types::{Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Usage};
use crate::engine::job::{JobEvent, TokenOut};
use crate::server::AppState;

/// Runs a text completion.
#[utoipa::path(
    post,
    path = "/v1/completions",
    tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true`, `text_completion` chunks as SSE \
            `data:` lines ending with `data: [DONE]`", content(
            (Completion = "application/json"),
            (String = "text/event-stream"),
        )),
        Refusals,
    )
)]
pub async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<CompletionRequest>,
) -> Result<Response, OpenAiError> {
    let tokenizer = state.tokenizer.clone();
    let map = |req, id: &str, names: &[&str]| {
        request::map_completion(req, id, names, |ids: &[u32]| tokenizer.decode(ids).ok())
    };
    let (ctx, events) = open(&state, &headers, body, "cmpl", map).await?;
    let lines = |ctx| {
        let mut stream = StreamState { ctx, offset: 0 };
        move |event: &JobEvent| stream.lines(event)
    };
    answer(ctx, events, lines, usage_line, completion).await
}

/// Appends one token to the legacy `logprobs` lists; `offset` is the
/// character offset of the token's text in the completion.
fn push_logprobs(ctx: &ReplyCtx, lp: &mut CompletionLogprobs, token: &TokenOut, offset: usize) {
    let entry = ctx.logprob_entry(token);
    lp.tokens.push(entry.token);
    lp.token_logprobs.push(entry.logprob);
    let top: BTreeMap<String, f32> = entry
        .top_logprobs
        .into_iter()
        .map(|t| (t.token, t.logprob))
        .collect();
    lp.top_logprobs.push(top);
    lp.text_offset.push(offset);
}

fn text_completion(ctx: &ReplyCtx, choices: Vec<CompletionChoice>) -> Completion {
    Completion {
        id: ctx.id.clone(),
        object: "text_completion".into(),
        created: ctx.created,
        model: ctx.model.clone(),
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices,
        usage: None,
    }
}

/// The whole answer of a non-streaming request: a choice for each job.
pub fn completion(ctx: &ReplyCtx, choices: &[Collected]) -> Completion {
    let summaries = Collected::summaries(choices);
    let choices = choices
        .iter()
        .zip(&summaries)
        .enumerate()
        .map(|(i, (c, summary))| CompletionChoice {
            index: i as u32,
            text: c.text(),
            logprobs: ctx.shape.logprobs.then(|| {
                let mut lp = CompletionLogprobs::default();
                let mut offset = 0;
                for t in &c.tokens {
                    push_logprobs(ctx, &mut lp, t, offset);
                    offset += t.text.chars().count();
                }
                lp
            }),
            finish_reason: Some(finish_reason(summary).into()),
        })
        .collect();
    Completion {
        usage: Some(Some(ctx.usage_of(&summaries))),
        ..text_completion(ctx, choices)
    }
}

/// The chunk of the request's usage, after every choice's last chunk (with
/// `stream_options.include_usage`): no choices.
pub fn usage_line(ctx: &ReplyCtx, usage: Usage) -> String {
    let c = Completion {
        usage: Some(Some(usage)),
        ..text_completion(ctx, Vec::new())
    };
    serde_json::to_string(&c).expect("chunks serialize")
}

/// A stream's reply facts and the characters sent so far.
pub struct StreamState {
    pub ctx: ReplyCtx,
    pub offset: usize,
}

impl StreamState {
    fn chunk(&self, choices: Vec<CompletionChoice>, tokens: usize) -> Completion {
        Completion {
            usage: self.ctx.chunk_usage(tokens),
            ..text_completion(&self.ctx, choices)
        }
    }

    /// The `data:` lines one job event becomes: one chunk per token that
    /// releases text or carries log-probabilities, then the finish reason
    /// (the usage, `[DONE]` and errors are the stream's: see
    /// `stream::sse_choices`).
    pub fn lines(&mut self, event: &JobEvent) -> Vec<String> {
        let json = |c: &Completion| serde_json::to_string(c).expect("chunks serialize");
        match event {
            JobEvent::Started(_) => Vec::new(),
            JobEvent::Token(t) if t.text.is_empty() && !self.ctx.shape.logprobs => Vec::new(),
            JobEvent::Token(t) => {
                let logprobs = self.ctx.shape.logprobs.then(|| {
                    let mut lp = CompletionLogprobs::default();
                    push_logprobs(&self.ctx, &mut lp, t, self.offset);
                    lp
                });
                self.offset += t.text.chars().count();
                let choice = CompletionChoice {
                    index: self.ctx.choice,
                    text: t.text.clone(),
                    logprobs,
                    finish_reason: None,
                };
                vec![json(&self.chunk(vec![choice], t.index + 1))]
            }
            JobEvent::End(summary) => {
                let last = CompletionChoice {
                    index: self.ctx.choice,
                    text: String::new(),
                    logprobs: None,
                    finish_reason: Some(finish_reason(summary).into()),
                };
                vec![json(&self.chunk(vec![last], summary.tokens_out))]
            }
            JobEvent::Error(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::reply::tests::{ctx, token};
    use super::super::stream::{usage_then_done, Framing};
    use super::*;
    use crate::engine::generate::{GenerationSummary, StopReason};
    use serde_json::{json, Value};

    fn summary() -> GenerationSummary {
        GenerationSummary {
            tokens_in: 5,
            tokens_cached: 0,
            tokens_out: 2,
            first_token_ms: 1,
            decode_time_ms: 2,
            stop_reason: StopReason::MaxTokens,
        }
    }

    #[test]
    fn a_whole_completion_has_text_usage_and_legacy_logprobs() {
        let c = ctx(true, 1, false);
        let collected = Collected {
            tokens: vec![
                token(0, b'o', &[(b'o', -0.5), (b'a', -1.0)]),
                token(1, b'k', &[(b'k', -0.125)]),
            ],
            summary: Some(summary()),
        };
        let v = serde_json::to_value(completion(&c, std::slice::from_ref(&collected))).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "ok");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 0}})
        );
        let lp = &v["choices"][0]["logprobs"];
        assert_eq!(lp["tokens"], json!(["o", "k"]));
        assert_eq!(lp["token_logprobs"], json!([-0.5, -0.125]));
        assert_eq!(lp["top_logprobs"], json!([{"o": -0.5}, {"k": -0.125}]));
        assert_eq!(lp["text_offset"], json!([0, 1]));
    }

    #[test]
    fn a_stream_is_tokens_finish_usage_done() {
        let c = ctx(false, 0, true);
        let mut s = StreamState {
            ctx: c.clone(),
            offset: 0,
        };
        let to_lines = move |e: &JobEvent| s.lines(e);
        let mut framing = Framing::new(vec![to_lines], usage_then_done(c, usage_line));
        let mut out: Vec<Value> = Vec::new();
        for ev in [
            JobEvent::Token(token(0, b'a', &[])),
            JobEvent::End(summary()),
        ] {
            for line in framing.lines(0, &ev).0 {
                out.push(serde_json::from_str(&line).unwrap_or(Value::String(line)));
            }
        }
        assert_eq!(out.len(), 4);
        assert_eq!(out[0]["object"], "text_completion");
        assert_eq!(out[0]["choices"][0]["text"], "a");
        assert_eq!(out[0]["usage"], Value::Null);
        assert_eq!(out[0]["choices"][0]["finish_reason"], Value::Null);
        assert_eq!(out[1]["choices"][0]["finish_reason"], "length");
        assert_eq!(out[2]["usage"]["completion_tokens"], 2);
        assert_eq!(out[2]["choices"], json!([]));
        assert_eq!(out[3], "[DONE]");
    }
}
