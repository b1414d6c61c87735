//! `POST /v1/chat/completions`: the request is mapped onto `/execute`'s (the
//! messages rendered by the model's chat template), runs through the same
//! validation, queue and engine, and is answered as one `chat.completion` or
//! a stream of `chat.completion.chunk`s; with tools, calls are read from the
//! output in the model's format (`tools/`) and answered as `tool_calls`.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::error::{OpenAiError, Refusals};
use super::handle::{answer, open, Body};
use super::reply::{finish_reason, Collected, ReplyCtx, SYSTEM_FINGERPRINT};
use super::request;

use super::tools::format::ToolFormat;
use super::tools::parse::{ParsedCall, Released};
use super::tools::release::Release;
use super::tools::types::{FunctionDelta, FunctionOut, ToolCallDelta, ToolCallOut};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
    ChatCompletionRequest, ChatDelta, ChatLogprobs, Usage,
};
use crate::engine::generate::GenerationSummary;
use crate::engine::job::JobEvent;
use crate::server::AppState;

/// Runs a chat completion.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The reply; with `stream: true`, `chat.completion.chunk`s as SSE \
            `data:` lines ending with `data: [DONE]`", content(
            (ChatCompletion = "application/json"),
            (String = "text/event-stream"),
        )),
        Refusals,
    )
)]
pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<ChatCompletionRequest>,
) -> Result<Response, OpenAiError> {
    let format = ToolFormat::of(&state.tokenizer);
    let map = move |req, id: &str, served: &[&str]| request::map_chat(req, id, served, format);
    let (ctx, events) = open(&state, &headers, body, "chatcmpl", map).await?;
    let lines = |ctx: ReplyCtx| {
        let mut stream = ChatStream::new(ctx);
        move |event: &JobEvent| stream.lines(event)
    };
    answer(ctx, events, lines, usage_line, completion).await
}

/// A reply's content, calls and reasoning, read as its stream reads them
/// (`Release`); content is null when the reply is calls and white space only.
fn content_and_calls(ctx: &ReplyCtx, c: &Collected) -> (Option<String>, Vec<ParsedCall>, String) {
    let out = Release::whole(ctx.tokenizer.clone(), ctx.tools.clone(), &c.tokens);
    let only_calls = !out.calls.is_empty() && out.content.trim().is_empty();
    (
        (!only_calls).then_some(out.content),
        out.calls,
        out.reasoning,
    )
}

/// The whole answer of a non-streaming request: a choice for each job.
pub fn completion(ctx: &ReplyCtx, choices: &[Collected]) -> ChatCompletion {
    let summaries = Collected::summaries(choices);
    ChatCompletion {
        id: ctx.id.clone(),
        object: "chat.completion".into(),
        created: ctx.created,
        model: ctx.model.clone(),
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices: choices
            .iter()
            .zip(&summaries)
            .enumerate()
            .map(|(i, (c, summary))| chat_choice(ctx, i as u32, c, summary))
            .collect(),
        usage: ctx.usage_of(&summaries),
    }
}

/// Choice `index` of a whole answer: its message (content, calls,
/// reasoning), log-probabilities and finish reason.
fn chat_choice(
    ctx: &ReplyCtx,
    index: u32,
    c: &Collected,
    summary: &GenerationSummary,
) -> ChatChoice {
    let logprobs = ctx.shape.logprobs.then(|| ChatLogprobs {
        content: c.tokens.iter().map(|t| ctx.logprob_entry(t)).collect(),
    });
    let (content, calls, reasoning) = content_and_calls(ctx, c);
    let finish = if calls.is_empty() {
        finish_reason(summary)
    } else {
        "tool_calls"
    };
    let tool_calls = (!calls.is_empty()).then(|| calls.into_iter().map(call_out).collect());
    ChatChoice {
        index,
        message: AssistantMessage {
            role: "assistant".into(),
            content,
            tool_calls,
            reasoning_content: Some(reasoning).filter(|r| !r.is_empty()),
        },
        logprobs,
        finish_reason: finish.into(),
    }
}

fn call_out(call: ParsedCall) -> ToolCallOut {
    ToolCallOut {
        id: call.id,
        kind: "function".into(),
        function: FunctionOut {
            name: call.name,
            arguments: call.arguments,
        },
    }
}

fn chunk(ctx: &ReplyCtx, choices: Vec<ChatChunkChoice>, tokens: usize) -> ChatCompletionChunk {
    ChatCompletionChunk {
        id: ctx.id.clone(),
        object: "chat.completion.chunk".into(),
        created: ctx.created,
        model: ctx.model.clone(),
        system_fingerprint: SYSTEM_FINGERPRINT.into(),
        choices,
        usage: ctx.chunk_usage(tokens),
    }
}

/// A chunk's one choice: the context's.
fn choice(
    ctx: &ReplyCtx,
    delta: ChatDelta,
    logprobs: Option<ChatLogprobs>,
    finish: Option<&str>,
) -> ChatChunkChoice {
    ChatChunkChoice {
        index: ctx.choice,
        delta,
        logprobs,
        finish_reason: finish.map(str::to_string),
    }
}

fn json(c: &ChatCompletionChunk) -> String {
    serde_json::to_string(c).expect("chunks serialize")
}

/// The first chunk of a choice: its role.
fn role_line(ctx: &ReplyCtx) -> String {
    let delta = ChatDelta {
        role: Some("assistant".into()),
        content: Some(String::new()),
        ..ChatDelta::default()
    };
    json(&chunk(ctx, vec![choice(ctx, delta, None, None)], 0))
}

/// A choice's last chunk: its `finish_reason`.
fn end_line(ctx: &ReplyCtx, summary: &GenerationSummary, finish: &str) -> String {
    let last = choice(ctx, ChatDelta::default(), None, Some(finish));
    json(&chunk(ctx, vec![last], summary.tokens_out))
}

/// The chunk of the request's usage, after every choice's last chunk (with
/// `stream_options.include_usage`): no choices.
pub fn usage_line(ctx: &ReplyCtx, usage: Usage) -> String {
    let mut c = chunk(ctx, Vec::new(), usage.completion_tokens);
    c.usage = Some(Some(usage));
    json(&c)
}

/// A chat stream's `data:` lines, one job event at a time: the role
/// first; then what each token releases (`Release`): its reasoning as
/// `reasoning_content` and its content, in one chunk with the token's
/// log-probabilities (a chunk of log-probabilities alone for a token that
/// releases nothing); with tools, content as it becomes known not to be a
/// call, and each call as its first delta (`id`, `type`, `function.name`,
/// empty `function.arguments`) then its arguments; last the finish reason,
/// `tool_calls` when there were calls. The usage, `[DONE]` and errors are
/// the stream's (`stream::sse_choices`).
pub struct ChatStream {
    ctx: ReplyCtx,
    release: Release,
    calls: u32,
}

impl ChatStream {
    pub fn new(ctx: ReplyCtx) -> Self {
        let release = Release::new(ctx.tokenizer.clone(), ctx.tools.clone());
        ChatStream {
            ctx,
            release,
            calls: 0,
        }
    }

    pub fn lines(&mut self, event: &JobEvent) -> Vec<String> {
        match event {
            JobEvent::Started(_) => vec![role_line(&self.ctx)],
            JobEvent::Token(t) => {
                let released = self.release.token(t);
                let logprobs = self.ctx.shape.logprobs.then(|| ChatLogprobs {
                    content: vec![self.ctx.logprob_entry(t)],
                });
                self.released_lines(released, logprobs, t.index + 1)
            }
            JobEvent::End(summary) => {
                let released = self.release.finish();
                let mut lines = self.released_lines(released, None, summary.tokens_out);
                let finish = if self.calls > 0 {
                    "tool_calls"
                } else {
                    finish_reason(summary)
                };
                lines.push(end_line(&self.ctx, summary, finish));
                lines
            }
            JobEvent::Error(_) => Vec::new(),
        }
    }

    fn released_lines(
        &mut self,
        released: Released,
        logprobs: Option<ChatLogprobs>,
        tokens: usize,
    ) -> Vec<String> {
        let ctx = &self.ctx;
        let mut lines = Vec::new();
        let content = Some(released.content).filter(|c| !c.is_empty());
        let reasoning = Some(released.reasoning).filter(|r| !r.is_empty());
        if content.is_some() || reasoning.is_some() || logprobs.is_some() {
            let delta = ChatDelta {
                content,
                reasoning_content: reasoning,
                ..ChatDelta::default()
            };
            lines.push(json(&chunk(
                ctx,
                vec![choice(ctx, delta, logprobs, None)],
                tokens,
            )));
        }
        for call in released.calls {
            let index = self.calls;
            self.calls += 1;
            let head = ToolCallDelta {
                index,
                id: Some(call.id),
                kind: Some("function".into()),
                function: FunctionDelta {
                    name: Some(call.name),
                    arguments: Some(String::new()),
                },
            };
            let args = ToolCallDelta {
                index,
                id: None,
                kind: None,
                function: FunctionDelta {
                    name: None,
                    arguments: Some(call.arguments),
                },
            };
            for piece in [head, args] {
                let delta = ChatDelta {
                    tool_calls: Some(vec![piece]),
                    ..ChatDelta::default()
                };
                lines.push(json(&chunk(
                    ctx,
                    vec![choice(ctx, delta, None, None)],
                    tokens,
                )));
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::super::reply::tests::{ctx, started, token};
    use super::super::stream::{usage_then_done, Framing};
    use super::*;
    use crate::engine::generate::{GenerationSummary, StopReason};
    use crate::engine::JobError;
    use serde_json::{json, Value};

    fn summary(reason: StopReason) -> GenerationSummary {
        GenerationSummary {
            tokens_in: 5,
            tokens_cached: 0,
            tokens_out: 2,
            first_token_ms: 1,
            decode_time_ms: 2,
            stop_reason: reason,
        }
    }

    fn parse(lines: Vec<String>) -> Vec<Value> {
        lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or(Value::String(l.clone())))
            .collect()
    }

    /// The `delta` of each chunk that `tokens`, streamed, become.
    fn deltas(c: &ReplyCtx, tokens: Vec<crate::engine::job::TokenOut>) -> Vec<Value> {
        let mut stream = ChatStream::new(c.clone());
        tokens
            .into_iter()
            .flat_map(|t| parse(stream.lines(&JobEvent::Token(t))))
            .map(|v| v["choices"][0]["delta"].clone())
            .collect()
    }

    /// The chunks of one token, the first of a choice's stream.
    fn token_lines(c: &ReplyCtx, t: crate::engine::job::TokenOut) -> Vec<Value> {
        parse(ChatStream::new(c.clone()).lines(&JobEvent::Token(t)))
    }

    /// A one-choice stream of `events`, framed as the route frames it
    /// (`stream::sse_choices`).
    fn streamed(c: &ReplyCtx, events: &[JobEvent]) -> Vec<Value> {
        let mut chat = ChatStream::new(c.clone());
        let to_lines = move |e: &JobEvent| chat.lines(e);
        let mut framing = Framing::new(vec![to_lines], usage_then_done(c.clone(), usage_line));
        events
            .iter()
            .flat_map(|e| parse(framing.lines(0, e).0))
            .collect()
    }

    /// gpt-oss: the analysis channel is `reasoning_content`, the final one
    /// `content`, the structure tokens neither (whole answer and stream).
    #[test]
    fn harmony_channels_split_reasoning_from_content() {
        let mut c = ctx(false, 0, false);
        c.tokenizer = crate::engine::testing::harmony_byte_tokenizer();
        let tok = |i: usize, text: &str, channel: Option<&str>| crate::engine::job::TokenOut {
            index: i,
            id: 1,
            text: text.into(),
            logprobs: None,
            channel: channel.map(Into::into),
        };
        let tokens = vec![
            tok(0, "analysis", None),
            tok(1, "Hm", Some("analysis")),
            tok(2, "assistant", None),
            tok(3, "Yes", Some("final")),
        ];
        let collected = Collected {
            tokens: tokens.clone(),
            summary: Some(summary(StopReason::Eos)),
        };
        let m = &completion(&c, std::slice::from_ref(&collected)).choices[0].message;
        assert_eq!(m.content.as_deref(), Some("Yes"));
        assert_eq!(m.reasoning_content.as_deref(), Some("Hm"));
        assert_eq!(
            deltas(&c, tokens),
            [
                json!({"reasoning_content": "Hm"}),
                json!({"content": "Yes"})
            ]
        );
        // Another model's text is all content.
        let plain = completion(&ctx(false, 0, false), std::slice::from_ref(&collected));
        assert_eq!(
            plain.choices[0].message.content.as_deref(),
            Some("analysisHmassistantYes")
        );
        assert_eq!(plain.choices[0].message.reasoning_content, None);
    }

    /// Qwen3: a think block's text is `reasoning_content` (without the
    /// white space at its ends), the markers neither, the rest `content`
    /// (without the white space after the block); the whole answer and the
    /// stream agree. With tools, a call written in the reasoning is not one.
    #[test]
    fn think_blocks_split_reasoning_from_content() {
        use crate::engine::testing::think_token as tok;
        use crate::engine::testing::{think_byte_tokenizer, THINK_CLOSE_ID, THINK_OPEN_ID};
        let answer = |last: &str| {
            vec![
                tok(0, THINK_OPEN_ID, "<think>", false),
                tok(1, 1, "\nCall <tool_call> now?", true),
                tok(2, 1, "\n", true),
                tok(3, THINK_CLOSE_ID, "</think>", false),
                tok(4, 1, "\n\n", false),
                tok(5, 1, last, false),
            ]
        };
        let mut c = ctx(false, 0, false);
        c.tokenizer = think_byte_tokenizer();
        let collected = Collected {
            tokens: answer("Yes"),
            summary: Some(summary(StopReason::Eos)),
        };
        let m = &completion(&c, std::slice::from_ref(&collected)).choices[0].message;
        assert_eq!(m.content.as_deref(), Some("Yes"));
        assert_eq!(
            m.reasoning_content.as_deref(),
            Some("Call <tool_call> now?")
        );
        assert_eq!(
            deltas(&c, answer("Yes")),
            [
                json!({"reasoning_content": "Call <tool_call> now?"}),
                json!({"content": "Yes"})
            ]
        );

        let mut c = tool_ctx(ToolFormat::Hermes);
        c.tokenizer = think_byte_tokenizer();
        let call = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let collected = Collected {
            tokens: answer(call),
            summary: Some(summary(StopReason::Eos)),
        };
        let choice = &completion(&c, std::slice::from_ref(&collected)).choices[0];
        assert_eq!(choice.finish_reason, "tool_calls");
        let m = &choice.message;
        assert_eq!(
            (m.content.as_deref(), m.tool_calls.as_ref().map(Vec::len)),
            (None, Some(1))
        );
        assert_eq!(
            m.reasoning_content.as_deref(),
            Some("Call <tool_call> now?")
        );
    }

    #[test]
    fn a_stream_is_role_tokens_finish_usage_done() {
        let c = ctx(false, 0, true);
        let out = streamed(
            &c,
            &[
                started(),
                JobEvent::Token(token(0, b'H', &[])),
                JobEvent::Token(token(1, b'i', &[])),
                JobEvent::End(summary(StopReason::MaxTokens)),
            ],
        );
        assert_eq!(out.len(), 6);
        let head = json!({"id": "x-1", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "smol", "system_fingerprint": SYSTEM_FINGERPRINT, "usage": null,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": null, "finish_reason": null}]});
        assert_eq!(out[0], head);
        assert_eq!(out[1]["choices"][0]["delta"], json!({"content": "H"}));
        assert_eq!(out[3]["choices"][0]["delta"], json!({}));
        assert_eq!(out[3]["choices"][0]["finish_reason"], "length");
        assert_eq!(out[4]["choices"], json!([]));
        let usage = json!({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 0}});
        assert_eq!(out[4]["usage"], usage);
        assert_eq!(out[5], "[DONE]");
    }

    /// Two choices: each chunk has its choice's index; one usage chunk
    /// (both choices' tokens) and one `[DONE]` after the last end; an error
    /// in either ends the stream at once.
    #[test]
    fn two_choices_share_one_usage_and_done() {
        let c = ctx(false, 0, true);
        let lines_of = |choice| {
            let mut s = ChatStream::new(ReplyCtx {
                choice,
                ..c.clone()
            });
            move |e: &JobEvent| s.lines(e)
        };
        let tail = || usage_then_done(c.clone(), usage_line);
        let mut f = Framing::new(vec![lines_of(0), lines_of(1)], tail());
        let (lines, over) = f.lines(1, &JobEvent::Token(token(0, b'b', &[])));
        assert!(!over);
        assert_eq!(parse(lines)[0]["choices"][0]["index"], 1);
        let (lines, over) = f.lines(0, &JobEvent::End(summary(StopReason::Eos)));
        assert!(!over);
        assert_eq!(parse(lines)[0]["choices"][0]["index"], 0);
        let (lines, over) = f.lines(1, &JobEvent::End(summary(StopReason::MaxTokens)));
        assert!(over);
        let out = parse(lines);
        assert_eq!(out.len(), 3);
        assert_eq!(out[0]["choices"][0]["finish_reason"], "length");
        assert_eq!(out[1]["usage"]["completion_tokens"], 4);
        assert_eq!(out[2], "[DONE]");

        let mut f = Framing::new(vec![lines_of(0), lines_of(1)], tail());
        let (lines, over) = f.lines(0, &JobEvent::Error(JobError::timeout(3)));
        assert!(over);
        let out = parse(lines);
        assert_eq!(out[0]["error"]["code"], "inference_timeout");
        assert_eq!(out[1], "[DONE]");
    }

    #[test]
    fn without_include_usage_chunks_have_no_usage_key() {
        let c = ctx(true, 2, false);
        let lines = token_lines(&c, token(0, b'a', &[(b'a', -0.2), (b'b', -1.9)]));
        assert!(lines[0].get("usage").is_none());
        let lp = &lines[0]["choices"][0]["logprobs"]["content"][0];
        assert_eq!(lp["token"], "a");
        assert_eq!(lp["bytes"], json!([97]));
        assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2);
        let end = streamed(&c, &[JobEvent::End(summary(StopReason::Eos))]);
        assert_eq!(end.len(), 2);
        assert_eq!(end[0]["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn continuous_usage_counts_the_tokens_so_far() {
        let mut c = ctx(false, 0, true);
        c.shape.continuous_usage = true;
        let lines = token_lines(&c, token(1, b'a', &[]));
        assert_eq!(lines[0]["usage"]["prompt_tokens"], 5);
        assert_eq!(lines[0]["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn an_error_mid_stream_is_an_error_object_then_done() {
        let c = ctx(false, 0, false);
        let lines = streamed(&c, &[JobEvent::Error(JobError::timeout(3))]);
        assert_eq!(lines[0]["error"]["code"], "inference_timeout");
        assert_eq!(lines[0]["error"]["type"], "server_error");
        assert_eq!(lines[1], "[DONE]");
    }

    #[test]
    fn a_whole_completion_has_message_usage_and_logprobs() {
        let c = ctx(true, 0, false);
        let collected = Collected {
            tokens: vec![
                token(0, b'o', &[(b'o', -0.5)]),
                token(1, b'k', &[(b'x', -0.1)]),
            ],
            summary: Some(summary(StopReason::StopSequence("\n".into()))),
        };
        let v = serde_json::to_value(completion(&c, std::slice::from_ref(&collected))).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(
            v["choices"][0]["message"],
            json!({"role": "assistant", "content": "ok"})
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["usage"]["total_tokens"], 7);
        let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content[0]["logprob"], -0.5);
        assert_eq!(content[1]["logprob"], -9999.0);
        assert_eq!(content[0]["top_logprobs"], json!([]));
    }

    fn tool_ctx(format: ToolFormat) -> ReplyCtx {
        let mut c = ctx(false, 0, false);
        c.tools = Some(crate::server::openai::tools::parse::ToolReply {
            format,
            parallel: true,
            names: vec!["now".into()],
        });
        c
    }

    fn text_token(i: usize, text: &str) -> crate::engine::job::TokenOut {
        crate::engine::job::TokenOut {
            index: i,
            id: 1,
            text: text.into(),
            logprobs: None,
            channel: None,
        }
    }

    /// A stream whose call markers are cut across tokens: the content
    /// deltas are the text alone, the call comes as its two deltas, the
    /// finish reason is `tool_calls`; the whole answer agrees.
    #[test]
    fn streamed_calls_hold_back_split_markers() {
        let c = tool_ctx(ToolFormat::Hermes);
        let pieces = [
            "Checking",
            ".\n<tool",
            "_call>\n{\"name\": \"now\", ",
            "\"arguments\": {}}\n</tool_",
            "call>",
        ];
        let tokens: Vec<_> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| text_token(i, p))
            .collect();
        let events: Vec<JobEvent> = [started()]
            .into_iter()
            .chain(tokens.iter().cloned().map(JobEvent::Token))
            .chain([JobEvent::End(summary(StopReason::Eos))])
            .collect();
        let out = streamed(&c, &events);
        let deltas: Vec<&Value> = out
            .iter()
            .filter_map(|l| l.get("choices")?.get(0))
            .map(|c| &c["delta"])
            .collect();
        let content: String = deltas
            .iter()
            .filter_map(|d| d["content"].as_str())
            .collect();
        assert_eq!(content, "Checking.");
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d.get("tool_calls")).collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0][0]["function"],
            json!({"name": "now", "arguments": ""})
        );
        assert_eq!(calls[1][0]["function"], json!({"arguments": "{}"}));
        assert_eq!(
            out[out.len() - 2]["choices"][0]["finish_reason"],
            "tool_calls"
        );
        assert_eq!(out.last().unwrap(), "[DONE]");

        let collected = Collected {
            tokens,
            summary: Some(summary(StopReason::Eos)),
        };
        let whole = completion(&c, std::slice::from_ref(&collected));
        let m = &whole.choices[0].message;
        assert_eq!(m.content.as_deref(), Some("Checking."));
        let call = &m.tool_calls.as_ref().unwrap()[0];
        assert_eq!(
            (
                call.function.name.as_str(),
                call.function.arguments.as_str()
            ),
            ("now", "{}")
        );
        assert_eq!(whole.choices[0].finish_reason, "tool_calls");
    }

    /// Without a call, text that looked like one's start goes out as
    /// content by the end, and the finish reason is the job's.
    #[test]
    fn a_false_start_is_content_by_the_end() {
        let c = tool_ctx(ToolFormat::Hermes);
        let events: Vec<JobEvent> = ["1 ", "<", "tool"]
            .iter()
            .enumerate()
            .map(|(i, p)| JobEvent::Token(text_token(i, p)))
            .chain([JobEvent::End(summary(StopReason::MaxTokens))])
            .collect();
        let out = streamed(&c, &events);
        let content: String = out
            .iter()
            .filter_map(|l| l["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "1 <tool");
        assert_eq!(out[out.len() - 2]["choices"][0]["finish_reason"], "length");
    }
}
