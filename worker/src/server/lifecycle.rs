//! A served life: the router on its listener behind the HTTP protections
//! until shutdown is triggered, then the drain.

use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::narrate;
use crate::server::guard;
use crate::server::router::app;
use crate::server::state::AppState;

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
