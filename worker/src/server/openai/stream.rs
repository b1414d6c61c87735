//! OpenAI's streaming framing: each chunk is one `data:` line of JSON (no
//! `event:` names), and the stream ends with `data: [DONE]` after the last
//! choice's terminal event, also when that event is an error (sent as
//! `data: {"error": {...}}`, which the official clients raise).

use std::convert::Infallible;

use axum::response::sse::Event;
use axum::response::Response;
use futures::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::OpenAiError;
use super::reply::ReplyCtx;
use super::types::Usage;
use crate::engine::generate::GenerationSummary;
use crate::engine::job::JobEvent;
use crate::server::execute::sse_response;

/// The line that ends every stream.
pub const DONE: &str = "[DONE]";

/// The `data:` lines of a job's terminal error.
pub fn error_lines(error: &crate::engine::JobError) -> Vec<String> {
    vec![OpenAiError::from(error.clone()).to_json(), DONE.to_string()]
}

/// Streams the events of a request's choices (a job each) as `data:` lines,
/// as they come, framed by [`Framing`]. Dropping the response (the client
/// went away), or the stream's end at an error, drops every choice's
/// events, which cancels the jobs still running.
pub fn sse_choices<F, T>(
    events: Vec<UnboundedReceiver<JobEvent>>,
    to_lines: Vec<F>,
    tail: T,
) -> Response
where
    F: FnMut(&JobEvent) -> Vec<String> + Send + 'static,
    T: FnOnce(&[GenerationSummary]) -> Vec<String> + Send + 'static,
{
    let tagged = futures::stream::select_all(
        events
            .into_iter()
            .enumerate()
            .map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |e| (i, e))),
    );
    let start = (tagged, Framing::new(to_lines, tail));
    let lines = futures::stream::unfold(Some(start), |state| async move {
        let (mut tagged, mut framing) = state?;
        let (i, event) = tagged.next().await?;
        let (lines, over) = framing.lines(i, &event);
        Some((lines, (!over).then_some((tagged, framing))))
    });
    let events = lines.flat_map(|lines| {
        futures::stream::iter(
            lines
                .into_iter()
                .map(|line| Ok::<Event, Infallible>(Event::default().data(line))),
        )
    });
    sse_response(events)
}

/// How a request's choices become one stream: each choice's events through
/// its own `to_lines` (its role, tokens and finish reason; never an error or
/// `[DONE]`); once every choice has ended, the lines `tail` makes of their
/// summaries (the usage where asked for, and `[DONE]`: [`usage_then_done`]);
/// a choice's error ends the stream with it ([`error_lines`]).
pub struct Framing<F, T> {
    to_lines: Vec<F>,
    tail: Option<T>,
    ended: Vec<GenerationSummary>,
}

impl<F, T> Framing<F, T>
where
    F: FnMut(&JobEvent) -> Vec<String>,
    T: FnOnce(&[GenerationSummary]) -> Vec<String>,
{
    pub fn new(to_lines: Vec<F>, tail: T) -> Self {
        Framing {
            ended: Vec::with_capacity(to_lines.len()),
            to_lines,
            tail: Some(tail),
        }
    }

    /// Choice `i`'s event as lines, and whether the stream is over.
    pub fn lines(&mut self, i: usize, event: &JobEvent) -> (Vec<String>, bool) {
        let mut lines = match event {
            JobEvent::Error(e) => return (error_lines(e), true),
            _ => (self.to_lines[i])(event),
        };
        let JobEvent::End(summary) = event else {
            return (lines, false);
        };
        self.ended.push(summary.clone());
        if self.ended.len() < self.to_lines.len() {
            return (lines, false);
        }
        if let Some(tail) = self.tail.take() {
            lines.extend(tail(&self.ended));
        }
        (lines, true)
    }
}

/// The tail of a chat or completions stream: the usage of every choice
/// (`ReplyCtx::usage_of`) as the chunk `usage_line` makes, where the client
/// asked for it (`stream_options.include_usage`), then `[DONE]`.
pub fn usage_then_done(
    ctx: ReplyCtx,
    usage_line: fn(&ReplyCtx, Usage) -> String,
) -> impl FnOnce(&[GenerationSummary]) -> Vec<String> + Send + 'static {
    move |summaries| {
        let usage = ctx
            .shape
            .include_usage
            .then(|| usage_line(&ctx, ctx.usage_of(summaries)));
        usage.into_iter().chain([DONE.to_string()]).collect()
    }
}

/// Streams a job's events as named SSE events (`event:` then `data:`), the
/// `(name, data)` pairs `to_events` makes of each: the framing of the
/// Responses API and of Anthropic's Messages. Dropping the response drops
/// `events`, which cancels the job.
pub fn sse_named<F>(events: UnboundedReceiver<JobEvent>, mut to_events: F) -> Response
where
    F: FnMut(&JobEvent) -> Vec<(&'static str, String)> + Send + 'static,
{
    let stream = UnboundedReceiverStream::new(events).flat_map(move |event| {
        let named = to_events(&event)
            .into_iter()
            .map(|(name, data)| Ok::<Event, Infallible>(Event::default().event(name).data(data)));
        futures::stream::iter(named.collect::<Vec<_>>())
    });
    sse_response(stream)
}
