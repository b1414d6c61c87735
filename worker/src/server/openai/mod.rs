//! The OpenAI-compatible front door (issue 16), beside `/execute`:
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /v1/chat/completions` | [`types::ChatCompletionRequest`] | `chat.completion`, or SSE chunks then `[DONE]` |
//! | `POST /v1/completions` | [`types::CompletionRequest`] | `text_completion`, or SSE chunks then `data: [DONE]` |
//! | `POST /v1/responses` | [`responses::types::ResponsesRequest`] | `response`, or its named SSE events (stateless) |
//! | `GET /v1/models` | | the served model |
//!
//! A request is mapped onto `/execute`'s ([`request`]) and goes through the
//! same validation, queue, engine, limits, metrics and cancel-on-disconnect
//! (`server::execute::admit`); only the answer's shape differs. Errors are
//! OpenAI's `{"error": {...}}` with `/execute`'s statuses ([`error`]).
//! What every handler shares (reading the body, admitting the job, the
//! answer whole or streamed) is in `handle.rs`, the routes in `routes.rs`;
//! tool calls (definitions, formats, parsing, grammars) in `tools/`; an
//! answer's reasoning apart from its content in `reasoning.rs`.

pub mod chat;
pub mod completions;
pub mod error;
mod handle;
pub mod models;
pub mod reasoning;
pub mod reply;
pub mod request;
pub mod responses;
mod routes;
pub mod stream;
pub mod tools;
pub mod types;

pub use handle::Body;
pub use routes::routes;
