//! What every OpenAI handler shares: the body read and mapped onto
//! `/execute`'s request, the job admitted through `/execute`'s validation and
//! queue, and the answer, whole or streamed.

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine::{JobEvent, Outcome};
use crate::server::error::{ApiError, ApiJson};
use crate::server::execute;
use crate::server::openai::error::OpenAiError;
use crate::server::openai::models::{model_id, served_names, unix_seconds};
use crate::server::openai::reply::{self, Collected, ReplyCtx};
use crate::server::openai::request::Mapped;
use crate::server::openai::stream;
use crate::server::openai::tools::refused_as_tools;
use crate::server::openai::types::Usage;
use crate::server::state::AppState;

/// A handler's JSON body, or why it could not be read.
pub type Body<T> = Result<ApiJson<T>, ApiError>;

/// The opening every OpenAI handler shares: a fresh id (`PREFIX-<uuid>`),
/// the body read and mapped onto `/execute`'s request by `map` (given the id
/// and the served model names), a refusal counted and logged as `/execute`
/// counts it, then `/execute`'s validation and queue, a job for each choice.
/// Gives the reply's facts and each choice's events.
pub(super) async fn open<T>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body<T>,
    prefix: &str,
    map: impl FnOnce(T, &str, &[&str]) -> Result<Mapped, OpenAiError>,
) -> Result<(ReplyCtx, Vec<UnboundedReceiver<JobEvent>>), OpenAiError> {
    let id = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    let names = served_names(state);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mapped = body
        .map(|ApiJson(req)| req)
        .map_err(OpenAiError::from)
        .and_then(|req| map(req, &id, &names))
        .and_then(|m| fits_the_queue(state, m))
        .map_err(|e| refused(state, e))?;
    admit(state, headers, id, mapped).await
}

/// [`open`] for a route of one choice (no `n`).
pub(super) async fn open_one<T>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body<T>,
    prefix: &str,
    map: impl FnOnce(T, &str, &[&str]) -> Result<Mapped, OpenAiError>,
) -> Result<(ReplyCtx, UnboundedReceiver<JobEvent>), OpenAiError> {
    let (ctx, mut events) = open(state, headers, body, prefix, map).await?;
    let events = events.pop().expect("a route without n has one choice");
    Ok((ctx, events))
}

/// A request's choices are queued together or not at all: more than the
/// queue can ever hold (`--queue-depth` waiting and `--parallel` running)
/// would be refused as a full queue forever, so it is refused here.
fn fits_the_queue(state: &AppState, mapped: Mapped) -> Result<Mapped, OpenAiError> {
    let most = state.engine.queue_capacity() + state.engine.slots();
    let n = mapped.shape.choices;
    if n > most {
        return Err(OpenAiError::invalid(
            "n",
            format!(
                "n: this worker holds at most {most} jobs at once (--queue-depth plus --parallel); got {n}"
            ),
        ));
    }
    Ok(mapped)
}

/// The answer to an admitted request: SSE lines when the client asked for a
/// stream (each choice's from its own `lines(ctx)`, then `usage_line` where
/// the usage was asked for; see [`stream::sse_choices`]), else the whole
/// reply `whole` builds from every choice, collected.
pub(super) async fn answer<F, W>(
    ctx: ReplyCtx,
    events: Vec<UnboundedReceiver<JobEvent>>,
    lines: impl Fn(ReplyCtx) -> F,
    usage_line: fn(&ReplyCtx, Usage) -> String,
    whole: impl FnOnce(&ReplyCtx, &[Collected]) -> W,
) -> Result<Response, OpenAiError>
where
    F: FnMut(&JobEvent) -> Vec<String> + Send + 'static,
    W: serde::Serialize,
{
    if ctx.shape.stream {
        let per_choice = (0..events.len() as u32)
            .map(|choice| {
                lines(ReplyCtx {
                    choice,
                    ..ctx.clone()
                })
            })
            .collect();
        let tail = stream::usage_then_done(ctx, usage_line);
        return Ok(stream::sse_choices(events, per_choice, tail));
    }
    // Collected side by side; the first error is the answer, and the
    // other choices' streams are dropped, which cancels their jobs.
    let collected = futures::future::try_join_all(events.into_iter().map(reply::collect)).await?;
    Ok(Json(whole(&ctx, &collected)).into_response())
}

/// Counts and logs a request refused before validation, as `/execute` does.
fn refused(state: &AppState, e: OpenAiError) -> OpenAiError {
    let code = e.body.error.code.as_deref().unwrap_or("invalid_request");
    let code = code.to_ascii_uppercase();
    execute::log_refusal(state, Outcome::Invalid, &code, e.status.as_u16());
    e
}

/// Validates and queues a mapped request, a job for each choice; the
/// reply's facts and the jobs' events.
async fn admit(
    state: &AppState,
    headers: &HeaderMap,
    id: String,
    mapped: Mapped,
) -> Result<(ReplyCtx, Vec<UnboundedReceiver<JobEvent>>), OpenAiError> {
    let n = mapped.shape.choices;
    let with_tools = mapped.execute.tools.is_some();
    let (valid, events) =
        execute::admit_choices(state, Ok(mapped.execute), mapped.prompt_ids, headers, n)
            .await
            .map_err(|e| if with_tools { refused_as_tools(e) } else { e })?;
    let ctx = ReplyCtx {
        id,
        created: unix_seconds(std::time::Duration::ZERO),
        model: model_id(&state.model.model_ref),
        shape: mapped.shape,
        prompt_tokens: valid.prompt_tokens.len(),
        tokenizer: state.tokenizer.clone(),
        tools: mapped.tools,
        choice: 0,
    };
    Ok((ctx, events))
}
