//! The Anthropic Messages front door (issue 43), beside `/execute` and the
//! OpenAI routes:
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /v1/messages` | [`types::MessagesRequest`] | one [`types::Message`], or Anthropic's SSE events |
//!
//! A request is mapped onto `/execute`'s ([`request`]) and goes through the
//! same validation, queue, engine, limits, metrics and cancel-on-disconnect
//! (`server::execute::admit`); only the answer's shape differs ([`reply`]).
//! Errors are Anthropic's `{"type": "error", "error": {...}}` with
//! `/execute`'s statuses ([`error`]). The official client's `x-api-key`
//! header is accepted where `--api-key` is set (`server::guard`). Text and
//! tool use (client tools, [`tools`]: the chat route's tools in Anthropic's
//! shapes) are served, streamed as [`stream`] says; server tools, images
//! and extended thinking are refused by name.

pub mod error;
pub mod reply;
pub mod request;
pub mod stream;
pub mod tools;
pub mod types;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use self::error::{AnthropicError, Refusals};
use self::reply::MessageCtx;
use self::stream::MessageStream;
use self::types::{Message, MessagesRequest};
use super::error::{ApiError, ApiJson};
use super::openai::models::{model_id, served_names};
use super::openai::reply::collect;
use super::openai::stream::sse_named;
use super::openai::tools::format::ToolFormat;
use super::openai::tools::refused_as_tools;
use super::{execute, AppState};
use crate::engine::Outcome;

/// The Anthropic routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/messages", post(messages))
}

/// Creates a message.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "The answer; with `stream: true`, Anthropic's SSE events \
            (`message_start` ... `message_stop`; `tool_use` blocks' input as `input_json_delta`s)", content(
            (Message = "application/json"),
            (String = "text/event-stream"),
        )),
        Refusals,
    )
)]
pub async fn messages(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ApiJson<MessagesRequest>, ApiError>,
) -> Result<Response, AnthropicError> {
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let names = served_names(&state);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mapped = body
        .map(|ApiJson(req)| req)
        .map_err(AnthropicError::from)
        .and_then(|req| request::map_messages(req, &id, &names, ToolFormat::of(&state.tokenizer)))
        .map_err(|e| refused(&state, e))?;
    let with_tools = mapped.execute.tools.is_some();
    let (valid, events) = execute::admit(&state, Ok(mapped.execute), None, &headers)
        .await
        .map_err(|e| if with_tools { refused_as_tools(e) } else { e })?;
    let ctx = MessageCtx {
        id,
        model: model_id(&state.model.model_ref),
        input_tokens: valid.prompt_tokens.len(),
        tokenizer: state.tokenizer.clone(),
        tools: mapped.tools,
    };
    if mapped.stream {
        let mut stream = MessageStream::new(ctx);
        return Ok(sse_named(events, move |event| stream.events(event)));
    }
    let collected = collect(events).await?;
    Ok(Json(ctx.whole(&collected)).into_response())
}

/// Counts and logs a request refused before validation, as `/execute` does.
fn refused(state: &AppState, e: AnthropicError) -> AnthropicError {
    execute::log_refusal(state, Outcome::Invalid, &e.log_code(), e.status.as_u16());
    e
}
