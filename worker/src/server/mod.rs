//! The HTTP/SSE API (M0-W-1300..1350, EXT-006).
//!
//! | route | body | answer |
//! |---|---|---|
//! | `GET /` | | `{name, version, model, routes}` ([`info::About`]) |
//! | `POST /execute` | [`validation::ExecuteRequest`] | `200 text/event-stream`: `started`, `token`*, then `end` or `error` |
//! | `POST /cancel` | `{job_id}` | `202 {job_id, state}` (also for unknown or finished ids) |
//! | `POST /shutdown` | empty or `{}` | `202 {status: "shutting_down"}` |
//! | `GET /health` | | cached state, see [`info`] |
//! | `GET /metrics` | | OpenMetrics text |
//! | `POST /tokenize` | `{content, add_special=true, parse_special=true}` | `{tokens}` |
//! | `POST /detokenize` | `{tokens}` | `{content}` |
//! | `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models` | OpenAI's | see [`openai`] |
//! | `POST /v1/messages` | Anthropic's | see [`anthropic`] |
//! | `GET /openapi.json` | | the OpenAPI document of all of these ([`openapi`]) |
//!
//! Errors are `{code, message, retriable}` with the status of the code (see
//! [`error`]). No route has a timeout layer: SSE streams live as long as
//! their job.
//!
//! The routes are wired in `router.rs`; what every handler may use
//! ([`AppState`]) is in `state.rs`, serving and the shutdown drain in
//! `lifecycle.rs`, the body size limits in `body_limits.rs`.

pub mod anthropic;
mod body_limits;
pub mod control;
pub mod error;
pub mod events;
pub mod execute;
pub mod guard;
pub mod info;
mod lifecycle;
pub mod openai;
pub mod openapi;
mod router;
mod state;
pub mod tokenize;
pub mod validation;

#[cfg(test)]
mod tests;

pub use body_limits::{MAX_BODY_BYTES, MAX_DRAINED_BYTES};
pub use lifecycle::{serve, serve_with, ServeOutcome};
pub use router::app;
pub use state::{AppInner, AppState, Constraints, ModelFacts, Shutdown};
pub use validation::{Caps, Door, Limits};
