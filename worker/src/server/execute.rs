//! `POST /execute` (M0-W-1300): validate, accept, queue, stream.
//!
//! A valid request is accepted by sending `started` into its stream and
//! handing the job to the engine queue; refusals answer with JSON and no
//! stream (400, or 503 with `Retry-After`). The SSE answer has one
//! `event: <type>` line and one JSON `data:` line per event (M0-W-1310), and
//! ends after the job's terminal event. When the client goes away, the stream
//! is dropped, and the engine notices at its next step and ends the job
//! (M0-W-1611).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::{ApiError, ApiJson};
use super::validation::{validate, ExecuteRequest};
use super::AppState;
use crate::engine::error::JobError;
use crate::engine::job::{CancelFlag, Job, JobEvent, JobSink, Outcome, PromptFacts, StartedEvent};
use crate::engine::SubmitError;
use crate::narrate;

/// Interval of SSE keep-alive comments while a job waits or runs.
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Longest `X-Deadline` value that is logged.
const MAX_DEADLINE_HEADER: usize = 64;

pub async fn execute(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ApiJson<ExecuteRequest>, ApiError>,
) -> Result<Response, ApiError> {
    // Refusals are logged by code and status only: a JSON error message may
    // quote a value from the body (M0-W-1902).
    let refuse = |outcome: Outcome, err: ApiError| {
        state.metrics.request_finished(outcome);
        narrate!(
            info,
            "execute_rejected",
            outcome = outcome.as_str(),
            code = err.error.code.as_str(),
            status = err.status.as_u16(),
        );
        err
    };
    if state.shutdown.is_triggered() {
        return Err(refuse(Outcome::Rejected, JobError::shutting_down().into()));
    }
    let ApiJson(req) = body.map_err(|e| refuse(Outcome::Invalid, e))?;
    // Tokenizing a long prompt takes milliseconds: keep it off the async threads.
    let (tokenizer, limits) = (state.tokenizer.clone(), state.limits);
    let checked = tokio::task::spawn_blocking(move || validate(req, &limits, &tokenizer, rand::random::<u64>))
        .await
        .map_err(|_| refuse(Outcome::Error, JobError::internal("request validation failed").into()))?;
    let valid = checked.map_err(|e| refuse(Outcome::Invalid, JobError::invalid(e.to_string()).into()))?;

    let deadline = headers
        .get("x-deadline")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(MAX_DEADLINE_HEADER).collect::<String>());
    let (sink, events) = JobSink::channel(state.metrics.clone());
    let started = StartedEvent {
        job_id: valid.job_id.clone(),
        model: state.model.model_ref.clone(),
        started_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        seed: valid.sampling.seed,
    };
    sink.send(JobEvent::Started(started));
    let job = Job {
        id: valid.job_id.clone(),
        request: valid.generation_request(),
        accepted_at: Instant::now(),
        prompt: PromptFacts { sha256: valid.prompt_sha256.clone(), chars: valid.prompt_chars, deadline },
        cancel: Arc::new(CancelFlag::default()),
        sink,
    };
    if let Err(e) = state.engine.submit(job) {
        let outcome = match e {
            SubmitError::DuplicateId(_) => Outcome::Invalid,
            _ => Outcome::Rejected,
        };
        return Err(refuse(outcome, e.into_error().into()));
    }
    Ok(sse_response(events))
}

/// Frames a job's events as SSE.
fn sse_response(events: tokio::sync::mpsc::UnboundedReceiver<JobEvent>) -> Response {
    let stream = UnboundedReceiverStream::new(events)
        .map(|ev| Ok::<Event, Infallible>(Event::default().event(ev.name()).data(ev.data())));
    let mut response = Sse::new(stream).keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE)).into_response();
    let h = response.headers_mut();
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
