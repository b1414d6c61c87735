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

pub mod anthropic;
pub mod control;
pub mod error;
pub mod events;
pub mod execute;
pub mod guard;
pub mod info;
pub mod openai;
pub mod openapi;
pub mod tokenize;
pub mod validation;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;

use crate::backend::DeviceInfo;
use crate::engine::{Engine, EngineHandle};
use crate::model::ModelInfo;
use crate::narrate;
use crate::telemetry::metrics::Metrics;
use crate::tokenizer::Tokenizer;

pub use validation::Limits;

/// Largest request body accepted, in bytes (413 above).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// An oversized body is read and discarded up to this many bytes before the
/// 413 goes out, so the client is not cut off mid-send and can read the
/// answer; beyond it the connection is closed.
pub const MAX_DRAINED_BYTES: u64 = 64 << 20;

/// Facts about the served model, fixed at start-up.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub worker_id: String,
    /// The model's file name (`--model` without its directories, issue #15):
    /// `/health.model` and `started.model`.
    pub model_ref: String,
    pub info: ModelInfo,
    pub device: DeviceInfo,
}

/// Triggers and awaits the worker's shutdown (from `/shutdown` or a signal).
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: Arc<watch::Sender<Option<&'static str>>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            tx: Arc::new(watch::channel(None).0),
        }
    }
}

impl Shutdown {
    /// Starts the shutdown; `reason` (`"request"`, `"SIGTERM"`, ...) is kept
    /// from the first call. Returns false when it had already started.
    pub fn trigger(&self, reason: &'static str) -> bool {
        self.tx.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        })
    }

    pub fn is_triggered(&self) -> bool {
        self.tx.borrow().is_some()
    }

    /// Resolves with the reason once shutdown has been triggered.
    pub async fn triggered(&self) -> &'static str {
        let mut rx = self.tx.subscribe();
        let reason = match rx.wait_for(|v| v.is_some()).await {
            Ok(v) => *v,
            Err(_) => None,
        };
        reason.unwrap_or("unknown")
    }
}

/// Everything a handler may use. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<AppInner>);

pub struct AppInner {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub model: ModelFacts,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: Shutdown,
    pub started: Instant,
}

impl AppState {
    pub fn new(inner: AppInner) -> Self {
        AppState(Arc::new(inner))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppInner;
    fn deref(&self) -> &AppInner {
        &self.0
    }
}

/// The worker's router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/", get(openapi::about))
        .route("/execute", post(execute::execute))
        .route("/cancel", post(control::cancel))
        .route("/shutdown", post(control::shutdown))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/openapi.json", get(openapi::openapi_json))
        .merge(openai::routes())
        .merge(anthropic::routes())
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::limit_body,
        ))
        .with_state(state)
}

async fn unknown_route(uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::with_status(
        axum::http::StatusCode::NOT_FOUND,
        crate::engine::JobError::invalid(format!("no route {}", uri.path())),
    )
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::with_status(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        crate::engine::JobError::invalid(format!("{} does not accept {method}", uri.path())),
    )
}

/// How a served life ended.
#[derive(Clone, Copy, Debug)]
pub struct ServeOutcome {
    /// What started the shutdown (`"request"`, `"SIGTERM"`, ...).
    pub reason: &'static str,
    /// Whether the running job outlived the grace period and was cancelled.
    pub running_job_cancelled: bool,
    /// From the shutdown trigger to the last connection closed.
    pub drain: Duration,
}

/// Serves `state` on `listener` until shutdown is triggered, then drains:
/// `/execute` is refused while the engine closes its queue, gives the running
/// job `grace`, cancels it, and stops; then the HTTP server stops, once every
/// open stream has sent its terminal event.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    engine: Engine,
    grace: Duration,
) -> std::io::Result<ServeOutcome> {
    serve_with(
        listener,
        state,
        engine,
        grace,
        &guard::HttpOptions::default(),
    )
    .await
}

/// [`serve`] with the HTTP protections of `http` (timeouts, connection
/// limit, API key) around every route.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: AppState,
    engine: Engine,
    grace: Duration,
    http: &guard::HttpOptions,
) -> std::io::Result<ServeOutcome> {
    let shutdown = state.shutdown.clone();
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let drain = tokio::spawn(async move {
        let reason = shutdown.triggered().await;
        let begun = Instant::now();
        narrate!(info, "shutdown", phase = "begin", reason, "shutting down");
        let cancelled = tokio::task::spawn_blocking(move || engine.shutdown(grace))
            .await
            .unwrap_or(true);
        let _ = stop_http.send(());
        (reason, begun, cancelled)
    });
    let router = guard::protect(app(state.clone()), http, state.engine.ledger().clone());
    guard::serve_connections(listener, router, http, async move {
        let _ = http_stopped.await;
    })
    .await;
    let served: std::io::Result<()> = Ok(());
    let (reason, begun, running_job_cancelled) =
        drain.await.unwrap_or(("unknown", Instant::now(), true));
    served.map(|()| ServeOutcome {
        reason,
        running_job_cancelled,
        drain: begun.elapsed(),
    })
}
