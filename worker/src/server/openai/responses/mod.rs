//! `POST /v1/responses` (issue 43), OpenAI's Responses API, stateless: the
//! input items are mapped onto `/execute`'s request ([`request`]; function
//! tools and call items in the chat route's terms, [`tools`]) and run
//! through the same validation, queue and engine as the chat route; the
//! answer is one `response` holding an assistant message and, with tools,
//! a `function_call` item per call read from the output, or the stream of
//! named events [`stream`] describes. Errors are OpenAI's.

pub mod reply;
pub mod request;
pub mod stream;
pub mod tools;
pub mod types;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use self::reply::Reply;
use self::request::Echo;
use self::stream::StreamState;
use self::types::{ResponseObject, ResponsesRequest};
use crate::server::openai::error::{OpenAiError, Refusals};
use crate::server::openai::handle::{open_one, Body};
use crate::server::openai::reply::collect;
use crate::server::openai::stream::sse_named;
use crate::server::openai::tools::format::ToolFormat;
use crate::server::state::AppState;

/// Creates a response.
#[utoipa::path(
    post,
    path = "/v1/responses",
    tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true`, the Responses API's named \
            SSE events (`response.created` ... `response.completed`; a call's arguments as \
            `response.function_call_arguments.delta`)", content(
            (ResponseObject = "application/json"),
            (String = "text/event-stream"),
        )),
        Refusals,
    )
)]
pub async fn responses(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body<ResponsesRequest>,
) -> Result<Response, OpenAiError> {
    let format = ToolFormat::of(&state.tokenizer);
    let mut echo = Echo::default();
    let map = |req, id: &str, served: &[&str]| {
        let (mapped, e) = request::map_responses(req, id, served, format)?;
        echo = e;
        Ok(mapped)
    };
    let (ctx, events) = open_one(&state, &headers, body, "resp", map).await?;
    let reply = Reply { ctx, echo };
    if reply.ctx.shape.stream {
        let mut stream = StreamState::new(&reply);
        return Ok(sse_named(events, move |e| stream.events(&reply, e)));
    }
    let collected = collect(events).await?;
    Ok(Json(reply.whole(&collected)).into_response())
}
