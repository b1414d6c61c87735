//! OpenAI's streaming framing: each chunk is one `data:` line of JSON (no
//! `event:` names), and the stream ends with `data: [DONE]` after the job's
//! terminal event, also when that event is an error (sent as
//! `data: {"error": {...}}`, which the official clients raise).

use std::convert::Infallible;

use axum::response::sse::Event;
use axum::response::Response;
use futures::StreamExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::OpenAiError;
use crate::engine::job::JobEvent;
use crate::server::execute::sse_response;

/// The line that ends every stream.
pub const DONE: &str = "[DONE]";

/// The `data:` lines of a job's terminal error.
pub fn error_lines(error: &crate::engine::JobError) -> Vec<String> {
    vec![OpenAiError::from(error.clone()).to_json(), DONE.to_string()]
}

/// Streams a job's events as the `data:` lines `to_lines` makes of each.
/// Dropping the response (the client went away) drops `events`, which
/// cancels the job.
pub fn sse<F>(events: UnboundedReceiver<JobEvent>, mut to_lines: F) -> Response
where
    F: FnMut(&JobEvent) -> Vec<String> + Send + 'static,
{
    let stream = UnboundedReceiverStream::new(events).flat_map(move |event| {
        let lines = to_lines(&event)
            .into_iter()
            .map(|line| Ok::<Event, Infallible>(Event::default().data(line)));
        futures::stream::iter(lines.collect::<Vec<_>>())
    });
    sse_response(stream)
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
