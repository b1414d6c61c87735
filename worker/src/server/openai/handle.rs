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
use crate::server::state::AppState;

/// A handler's JSON body, or why it could not be read.
pub type Body<T> = Result<ApiJson<T>, ApiError>;

/// The opening every OpenAI handler shares: a fresh id (`PREFIX-<uuid>`),
/// the body read and mapped onto `/execute`'s request by `map` (given the id
/// and the served model names), a refusal counted and logged as `/execute`
/// counts it, then `/execute`'s validation and queue. Gives the reply's facts
/// and the job's events.
pub(super) async fn open<T>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body<T>,
    prefix: &str,
    map: impl FnOnce(T, &str, &[&str]) -> Result<Mapped, OpenAiError>,
) -> Result<(ReplyCtx, UnboundedReceiver<JobEvent>), OpenAiError> {
    let id = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    let names = served_names(state);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mapped = body
        .map(|ApiJson(req)| req)
        .map_err(OpenAiError::from)
        .and_then(|req| map(req, &id, &names))
        .map_err(|e| refused(state, e))?;
    admit(state, headers, id, mapped).await
}

/// The answer to an admitted request: SSE lines from the closure `lines(ctx)`
/// gives when the client asked for a stream, else the whole reply `whole` builds.
pub(super) async fn answer<F, W>(
    ctx: ReplyCtx,
    events: UnboundedReceiver<JobEvent>,
    lines: impl FnOnce(ReplyCtx) -> F,
    whole: impl FnOnce(&ReplyCtx, &Collected) -> W,
) -> Result<Response, OpenAiError>
where
    F: FnMut(&JobEvent) -> Vec<String> + Send + 'static,
    W: serde::Serialize,
{
    if ctx.shape.stream {
        return Ok(stream::sse(events, lines(ctx)));
    }
    let collected = reply::collect(events).await?;
    Ok(Json(whole(&ctx, &collected)).into_response())
}

/// Counts and logs a request refused before validation, as `/execute` does.
fn refused(state: &AppState, e: OpenAiError) -> OpenAiError {
    let code = e.body.error.code.as_deref().unwrap_or("invalid_request");
    let code = code.to_ascii_uppercase();
    execute::log_refusal(state, Outcome::Invalid, &code, e.status.as_u16());
    e
}

/// Validates and queues a mapped request; the reply's facts and the job's events.
async fn admit(
    state: &AppState,
    headers: &HeaderMap,
    id: String,
    mapped: Mapped,
) -> Result<(ReplyCtx, UnboundedReceiver<JobEvent>), OpenAiError> {
    let (valid, events) =
        execute::admit(state, Ok(mapped.execute), mapped.prompt_ids, headers).await?;
    let ctx = ReplyCtx {
        id,
        created: unix_seconds(std::time::Duration::ZERO),
        model: model_id(&state.model.model_ref),
        shape: mapped.shape,
        prompt_tokens: valid.prompt_tokens.len(),
        tokenizer: state.tokenizer.clone(),
        tools: mapped.tools,
    };
    Ok((ctx, events))
}
