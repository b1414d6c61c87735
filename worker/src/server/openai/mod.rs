//! The OpenAI-compatible front door (issue 16), beside `/execute`:
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /v1/chat/completions` | [`types::ChatCompletionRequest`] | `chat.completion`, or SSE chunks then `[DONE]` |
//! | `POST /v1/completions` | [`types::CompletionRequest`] | `text_completion`, or SSE chunks then `data: [DONE]` |
//! | `GET /v1/models` | | the served model |
//!
//! A request is mapped onto `/execute`'s ([`request`]) and goes through the
//! same validation, queue, engine, limits, metrics and cancel-on-disconnect
//! (`server::execute::admit`); only the answer's shape differs. Errors are
//! OpenAI's `{"error": {...}}` with `/execute`'s statuses ([`error`]).

pub mod chat;
pub mod completions;
pub mod error;
pub mod models;
pub mod reply;
pub mod request;
pub mod stream;
pub mod types;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::sync::mpsc::UnboundedReceiver;

use self::error::OpenAiError;
use self::models::{model_id, served_names, unix_seconds};
use self::reply::{Collected, ReplyCtx};
use self::request::Mapped;
use super::error::{ApiError, ApiJson};
use super::{execute, AppState};
use crate::engine::{JobEvent, Outcome};

/// A handler's JSON body, or why it could not be read.
pub type Body<T> = Result<ApiJson<T>, ApiError>;

/// The OpenAI routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models::list_models))
}

/// The opening every OpenAI handler shares: a fresh id (`PREFIX-<uuid>`),
/// the body read and mapped onto `/execute`'s request by `map` (given the id
/// and the served model names), a refusal counted and logged as `/execute`
/// counts it, then `/execute`'s validation and queue. Gives the reply's facts
/// and the job's events.
async fn open<T>(
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
async fn answer<F, W>(
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
    };
    Ok((ctx, events))
}
