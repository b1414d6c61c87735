//! Protections around the whole router, so that routes added later are
//! covered without touching their handlers (issue #15):
//!
//! - connections: our own accept loop with a connection limit, hyper's
//!   header read timeout (which also bounds how long an idle keep-alive
//!   connection may wait for its next request), and a shutdown drain that no
//!   client can hold up;
//! - request bodies: one deadline for the whole body (a trickle of bytes does
//!   not reset it, unlike a per-frame timeout), and the size limit
//!   ([`limit_body`]: 413, in OpenAI's shape on the `/v1/` routes);
//! - access: `--api-key` (or `WORKER_API_KEY`) required as
//!   `Authorization: Bearer` on every route but `/health`, compared in
//!   constant time; a `POST` with a body must be `application/json`, and no
//!   `POST` may come from another site (an `Origin` that is not this
//!   worker's own).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use super::anthropic::error::AnthropicError;
use super::error::ApiError;
use super::openai::error::OpenAiError;
use crate::engine::{JobError, Ledger, Outcome};
use crate::narrate;

/// Default of `--header-timeout-sec`.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--body-timeout-sec`.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `--max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// After the engine has stopped, open connections get this long to finish
/// (streams send their terminal event at once); then they are dropped.
pub const CONNECTION_DRAIN: Duration = Duration::from_millis(500);

/// The HTTP protections, from the serve flags.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Longest wait for a request's headers, from the moment the connection
    /// (or, on keep-alive, the previous response) is ready for them.
    pub header_timeout: Duration,
    /// Longest time to receive a whole request body.
    pub body_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// The bearer token every route but `/health` requires; `None`: open.
    pub api_key: Option<String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            api_key: None,
        }
    }
}

/// Wraps every route of `router` in the access checks and the body deadline.
/// A refused `/execute` counts as `invalid` in the engine's `ledger`, as the
/// body limit's do.
pub fn protect(router: Router, opts: &HttpOptions, ledger: Ledger) -> Router {
    let key = opts.api_key.clone().map(Arc::<str>::from);
    let body_timeout = opts.body_timeout;
    router
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| body_deadline(body_timeout, req, next),
        ))
        .layer(axum::middleware::from_fn(same_site_json))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| require_key(key.clone(), req, next),
        ))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| count_refusals(ledger.clone(), req, next),
        ))
}

/// Marks an answer given by a check here rather than by the route.
#[derive(Clone, Copy)]
struct Refused;

/// Counts an `/execute` that a check here refused as `invalid`.
async fn count_refusals(ledger: Ledger, req: Request, next: Next) -> Response {
    let execute = req.uri().path() == "/execute";
    let resp = next.run(req).await;
    if execute && resp.extensions().get::<Refused>().is_some() {
        ledger.refused(Outcome::Invalid);
    }
    resp
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    let mut resp = ApiError::with_status(status, JobError::invalid(message)).into_response();
    resp.extensions_mut().insert(Refused);
    resp
}

/// `/health` stays open for probes; everything else needs the key.
async fn require_key(key: Option<Arc<str>>, req: Request, next: Next) -> Response {
    let Some(key) = key else {
        return next.run(req).await;
    };
    if req.uri().path() == "/health" || key_matches(req.headers(), &key) {
        return next.run(req).await;
    }
    let mut resp = refuse(
        StatusCode::UNAUTHORIZED,
        "a missing or wrong API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
    );
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

/// Whether the request carries `key`: as `Authorization: Bearer <key>`
/// (OpenAI's clients, curl) or as `x-api-key: <key>` (Anthropic's client).
fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    let x_api_key = headers
        .get("x-api-key")
        .is_some_and(|v| bool::from(v.as_bytes().ct_eq(key.as_bytes())));
    x_api_key || bearer_matches(headers, key)
}

/// Whether `Authorization: Bearer <token>` holds `key`, compared in constant
/// time (for equal lengths; the length itself is not secret enough to hide).
pub fn bearer_matches(headers: &HeaderMap, key: &str) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let Some(token) = value
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case(b"bearer "))
        .map(|_| &value[7..])
    else {
        return false;
    };
    token.ct_eq(key.as_bytes()).into()
}

/// A `POST` must declare JSON and come from this worker's own origin, so a
/// web page the operator visits cannot stop the worker or start jobs with a
/// cross-site form post (which can only send form or text content types).
async fn same_site_json(req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        if !is_own_origin(origin, req.headers().get(header::HOST)) {
            return refuse(
                StatusCode::FORBIDDEN,
                "a cross-site request: the Origin is not this worker",
            );
        }
    }
    let headers = req.headers();
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    // M0-W-1340 takes an empty `/shutdown` body: with no body and no content
    // type there is nothing to misread, and a browser form always sends a type.
    let bodiless = !headers.contains_key(header::CONTENT_TYPE)
        && !headers.contains_key(header::TRANSFER_ENCODING)
        && headers
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0");
    if !json && !bodiless {
        // 400 as the API has always answered a body that is not JSON.
        return refuse(
            StatusCode::BAD_REQUEST,
            "a POST needs Content-Type: application/json",
        );
    }
    next.run(req).await
}

/// `Origin: http://HOST[:PORT]` naming the `Host` the request was sent to.
/// `null` (sandboxed pages, file://) is never our own.
pub fn is_own_origin(origin: &HeaderValue, host: Option<&HeaderValue>) -> bool {
    let (Ok(origin), Some(Ok(host))) = (origin.to_str(), host.map(|h| h.to_str())) else {
        return false;
    };
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    rest.is_some_and(|o| o.eq_ignore_ascii_case(host))
}

/// Why a request body ended early.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimeout(pub Duration);

/// Gives the whole request body one deadline; past it the body yields a
/// [`BodyTimeout`] error, which the body limit answers with 408.
async fn body_deadline(timeout: Duration, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let deadline = tokio::time::sleep(timeout);
    let stream = futures::stream::unfold(
        (body.into_data_stream(), Box::pin(deadline), false),
        move |(mut stream, mut deadline, done)| async move {
            if done {
                return None;
            }
            tokio::select! {
                item = stream.next() => item.map(|i| (i, (stream, deadline, false))),
                () = &mut deadline => {
                    let err = axum::Error::new(BodyTimeout(timeout));
                    Some((Err(err), (stream, deadline, true)))
                }
            }
        },
    );
    next.run(Request::from_parts(parts, Body::from_stream(stream)))
        .await
}

/// 408 when the body missed its deadline ([`BodyTimeout`]),
/// 413 when it was already over `most` bytes (`oversized`), else 400
/// (malformed framing, such as a bad chunk size).
fn body_error(e: axum::Error, oversized: bool, most: usize) -> Response {
    let source = e.into_inner();
    // The timeout may come wrapped in layers of body errors.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(c) = cause {
        if let Some(t) = c.downcast_ref::<BodyTimeout>() {
            let error = JobError::invalid(t.to_string());
            return ApiError::with_status(StatusCode::REQUEST_TIMEOUT, error).into_response();
        }
        cause = c.source();
    }
    if oversized {
        return ApiError::too_large(most).into_response();
    }
    ApiError::invalid(format!("the request body could not be read: {source}")).into_response()
}

/// The connection closes after this answer: what is left of the request
/// body is not read.
fn closing(mut resp: Response) -> Response {
    resp.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    resp
}

/// Reads the whole body before the handler runs, refusing bodies over the
/// limits' [`body_bytes`](super::Limits::body_bytes) with 413. An oversized body is
/// still read (and dropped), up to [`MAX_DRAINED_BYTES`](super::MAX_DRAINED_BYTES),
/// so the client finishes sending and sees the answer instead of a reset.
/// A refused `/execute` counts as `invalid` in `worker_requests_total`.
pub async fn limit_body(
    State(state): State<super::AppState>,
    req: Request,
    next: Next,
) -> Response {
    let most = state.limits.body_bytes();
    let limit = most as u64;
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut oversized = declared.is_some_and(|n| n > limit);
    // Far too large to drain: answer at once and close the connection.
    if declared.is_some_and(|n| n > super::body_limits::MAX_DRAINED_BYTES) {
        return closing(ApiError::too_large(most).into_response());
    }
    let mut kept = Vec::with_capacity(declared.filter(|_| !oversized).unwrap_or(0) as usize);
    let mut seen = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return closing(body_error(e, oversized, most)),
        };
        seen += chunk.len() as u64;
        oversized |= seen > limit;
        if oversized {
            if seen > super::body_limits::MAX_DRAINED_BYTES {
                break;
            }
        } else {
            kept.extend_from_slice(&chunk);
        }
    }
    if oversized {
        let path = parts.uri.path();
        let openai = path.starts_with("/v1/");
        if path == "/execute" || openai {
            state.engine.ledger().refused(Outcome::Invalid);
        }
        if path == "/v1/messages" {
            return AnthropicError::from(ApiError::too_large(most)).into_response();
        }
        if openai {
            return OpenAiError::from(ApiError::too_large(most)).into_response();
        }
        return ApiError::too_large(most).into_response();
    }
    next.run(Request::from_parts(parts, Body::from(kept))).await
}

/// Serves `router` on `listener` until `stop` resolves, then drains: idle
/// connections close at once, busy ones get [`CONNECTION_DRAIN`], and any
/// still open after it (a client trickling a request) are dropped.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    opts: &HttpOptions,
    stop: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(opts.header_timeout)
        .keep_alive(true);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    narrate!(warn, "accept_failed", message = %e.to_string());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper::service::service_fn({
            let router = router.clone();
            move |req: hyper::Request<hyper::body::Incoming>| {
                let router = router.clone();
                async move {
                    let resp = router.oneshot(req.map(Body::new)).await;
                    Ok::<_, Infallible>(resp.unwrap_or_else(|e| match e {}))
                }
            }
        });
        let conn = http.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tasks.spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
        // Reap finished connections so the set does not grow.
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = tokio::time::timeout(CONNECTION_DRAIN, graceful.shutdown()).await;
    tasks.shutdown().await;
}
