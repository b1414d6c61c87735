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
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::{ApiError, ApiJson};
use super::events::ErrorBody;
use super::events::{event_data, event_name};
use super::validation::{validate_with_ids, ExecuteRequest, ValidExecuteRequest, ValidationErrors};
use super::AppState;
use crate::engine::error::JobError;
use crate::engine::job::{CancelFlag, Job, JobEvent, JobSink, JobStarted, PromptFacts};
use crate::engine::Outcome;
use crate::narrate;

/// Interval of SSE keep-alive comments while a job waits or runs.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Longest `X-Deadline` value that is logged.
const MAX_DEADLINE_HEADER: usize = 64;

/// Runs one job and streams its events.
#[utoipa::path(
    post,
    path = "/execute",
    tag = "worker",
    request_body = ExecuteRequest,
    // Visible ASCII: a control character makes the request malformed HTTP,
    // which the server's HTTP parser refuses (a bare 400) before any handler.
    params(("X-Deadline" = Option<String>, Header, description = "Logged, not enforced",
        pattern = "^[\\x20-\\x7E]*$")),
    responses(
        (status = 200, description = "SSE: `started` (StartedEvent), `token`* (TokenEvent), then `end` \
            (EndEvent) or `error` (ErrorBody)", content_type = "text/event-stream", body = String),
        (status = 400, description = "A field is invalid; `code` is `INVALID_REQUEST`", body = ErrorBody),
        (status = 413, description = "The body is over 1 MiB", body = ErrorBody),
        (status = 503, description = "`QUEUE_FULL` or `SHUTTING_DOWN`, with Retry-After", body = ErrorBody),
    )
)]
///
/// The request path, in order: validate → queue → (the engine thread
/// generates, sending events into the job's stream) → stream.
pub async fn execute(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ApiJson<ExecuteRequest>, ApiError>,
) -> Result<Response, ApiError> {
    let (_, events) = admit(&state, body.map(|ApiJson(req)| req), None, &headers).await?;
    Ok(stream(events))
}

/// What every front door shares (`/execute`, the OpenAI routes): validate
/// `body` (with `prompt_ids` as the prompt's tokens when the client sent ids),
/// accept and queue. Refusals are counted and logged here.
pub(super) async fn admit(
    state: &AppState,
    body: Result<ExecuteRequest, ApiError>,
    prompt_ids: Option<Vec<u32>>,
    headers: &HeaderMap,
) -> Result<(ValidExecuteRequest, UnboundedReceiver<JobEvent>), ApiError> {
    let (valid, mut events) = admit_choices(state, body, prompt_ids, headers, 1).await?;
    let events = events.pop().expect("one choice, one stream");
    Ok((valid, events))
}

/// [`admit`] for `n` choices of one request (OpenAI's `n`): validated once,
/// then a job for each choice ([`ValidExecuteRequest::choice`]), queued
/// together, all or none; their streams in the choices' order.
pub(super) async fn admit_choices(
    state: &AppState,
    body: Result<ExecuteRequest, ApiError>,
    prompt_ids: Option<Vec<u32>>,
    headers: &HeaderMap,
    n: usize,
) -> Result<(ValidExecuteRequest, Vec<UnboundedReceiver<JobEvent>>), ApiError> {
    let valid = validate_request(state, body, prompt_ids).await?;
    let (jobs, events): (Vec<Job>, Vec<_>) = (0..n)
        .map(|i| accept(state, &valid.choice(i), headers))
        .unzip();
    state
        .engine
        .submit_all(jobs)
        .map_err(|e| refuse(state, e.outcome(), e.into_error().into()))?;
    Ok((valid, events))
}

/// Counts and logs a refused request, with the reason in the worker's own
/// words ([`own_words`]).
fn refuse(state: &AppState, outcome: Outcome, err: ApiError) -> ApiError {
    let why = Refusal {
        field: None,
        reason: Some(own_words(&err.error.message).to_string()),
    };
    log_refusal_why(state, outcome, &err, why);
    err
}

/// Counts and logs a request that broke field rules: every field and its
/// reason.
fn refuse_invalid(state: &AppState, errors: ValidationErrors) -> ApiError {
    let why = Refusal {
        field: Some(errors.fields().join(",")),
        reason: Some(
            errors
                .0
                .iter()
                .map(|e| format!("{}: {}", e.field, own_words(&e.message)))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let err: ApiError = JobError::invalid(errors.to_string()).into();
    log_refusal_why(state, Outcome::Invalid, &err, why);
    err
}

/// A message up to its first `: `. Refusals are logged in the worker's own
/// words only: what follows that separator may quote the request (serde's
/// and the chat template's errors do), and the log never holds prompt text
/// (M0-W-1902).
fn own_words(message: &str) -> &str {
    message.split_once(": ").map_or(message, |(ours, _)| ours)
}

/// What the log says of a refusal besides its code.
struct Refusal {
    field: Option<String>,
    reason: Option<String>,
}

/// Counts and logs a refusal by its code and status (the OpenAI routes
/// refuse some requests before they reach [`admit`]).
pub(super) fn log_refusal(state: &AppState, outcome: Outcome, code: &str, status: u16) {
    let why = Refusal {
        field: None,
        reason: None,
    };
    log_refusal_with(state, outcome, code, status, why);
}

fn log_refusal_why(state: &AppState, outcome: Outcome, err: &ApiError, why: Refusal) {
    let code = err.error.code.as_str();
    log_refusal_with(state, outcome, code, err.status.as_u16(), why);
}

fn log_refusal_with(state: &AppState, outcome: Outcome, code: &str, status: u16, why: Refusal) {
    state.engine.ledger().refused(outcome);
    narrate!(
        info,
        "execute_rejected",
        outcome = outcome.as_str(),
        code = code,
        status = status,
        field = why.field.as_deref(),
        reason = why.reason.as_deref(),
    );
}

/// Step 1: refuse while shutting down, then parse and validate the body.
async fn validate_request(
    state: &AppState,
    body: Result<ExecuteRequest, ApiError>,
    prompt_ids: Option<Vec<u32>>,
) -> Result<ValidExecuteRequest, ApiError> {
    if state.shutdown.is_triggered() {
        return Err(refuse(
            state,
            Outcome::Rejected,
            JobError::shutting_down().into(),
        ));
    }
    let req = body.map_err(|e| refuse(state, Outcome::Invalid, e))?;
    // Tokenizing a long prompt takes milliseconds: keep it off the async threads.
    // So does compiling a constraint seen for the first time.
    let (tokenizer, limits) = (state.tokenizer.clone(), state.limits);
    let constraints = state.constraints.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let mut valid =
            validate_with_ids(req, prompt_ids, &limits, &tokenizer, rand::random::<u64>)?;
        valid.compile_constraint(&constraints)?;
        Ok::<_, ValidationErrors>(valid)
    })
    .await
    .map_err(|_| {
        refuse(
            state,
            Outcome::Error,
            JobError::internal("request validation failed").into(),
        )
    })?;
    checked.map_err(|e| refuse_invalid(state, e))
}

/// Step 2: accept the job: its stream opens with `started`; the caller hands
/// it to the engine's queue, where a full queue or a duplicate id refuses it.
fn accept(
    state: &AppState,
    valid: &ValidExecuteRequest,
    headers: &HeaderMap,
) -> (Job, UnboundedReceiver<JobEvent>) {
    let deadline = headers
        .get("x-deadline")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().take(MAX_DEADLINE_HEADER).collect::<String>());
    let request = valid.generation_request();
    let (sink, events) = JobSink::channel(
        &valid.job_id,
        request.prompt_tokens.len(),
        state.engine.ledger().clone(),
    );
    sink.send(JobEvent::Started(JobStarted {
        job_id: valid.job_id.clone(),
        model: state.model.model_ref.clone(),
        started_at: chrono::Utc::now(),
        seed: valid.sampling.seed,
    }));
    let job = Job {
        id: valid.job_id.clone(),
        request,
        accepted_at: Instant::now(),
        prompt: PromptFacts {
            sha256: valid.prompt_sha256.clone(),
            chars: valid.prompt_chars,
            deadline,
        },
        cancel: Arc::new(CancelFlag::default()),
        sink,
    };
    (job, events)
}

/// Step 3: frame the job's events as SSE until its terminal event.
fn stream(events: UnboundedReceiver<JobEvent>) -> Response {
    let stream = UnboundedReceiverStream::new(events).map(|ev| {
        Ok::<Event, Infallible>(
            Event::default()
                .event(event_name(&ev))
                .data(event_data(&ev)),
        )
    });
    sse_response(stream)
}

/// An SSE response of `stream` as both front doors send it: keep-alive
/// comments, and headers that stop proxies from buffering or caching it.
pub fn sse_response<S>(stream: S) -> Response
where
    S: futures::Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE))
        .into_response();
    let h = response.headers_mut();
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
