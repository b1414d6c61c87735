//! The one mapping from errors to HTTP answers: every non-stream error is a
//! JSON body `{code, message, retriable}` (the same JSON as the SSE `error`
//! event) with the code's status, and `Retry-After` on 503s.
//!
//! Body problems are answered as `INVALID_REQUEST` (EXT-004):
//! malformed JSON, invalid UTF-8, wrong JSON types, unknown fields and a
//! `Content-Type` other than `application/json` → 400 (EXT-004 names 400
//! and 413 only); a body over
//! [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES) → 413.

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::events::ErrorBody;
use crate::engine::error::{ErrorCode, JobError};

/// Seconds a client should wait before retrying a full queue.
pub const RETRY_AFTER_QUEUE_FULL_S: u64 = 1;
/// Seconds a client should wait before retrying a worker that is shutting down.
pub const RETRY_AFTER_SHUTTING_DOWN_S: u64 = 5;

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: JobError,
}

impl ApiError {
    pub fn with_status(status: StatusCode, error: JobError) -> Self {
        ApiError { status, error }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        JobError::invalid(message).into()
    }

    /// Maps axum's JSON body rejections onto `INVALID_REQUEST` answers.
    pub fn from_json_rejection(rejection: JsonRejection) -> Self {
        let (status, message) = match &rejection {
            JsonRejection::MissingJsonContentType(_) => (
                StatusCode::BAD_REQUEST,
                "the body must be JSON with Content-Type: application/json".to_string(),
            ),
            JsonRejection::JsonSyntaxError(_) => (
                StatusCode::BAD_REQUEST,
                format!("malformed JSON body: {}", rejection.body_text()),
            ),
            JsonRejection::JsonDataError(_) => (
                StatusCode::BAD_REQUEST,
                format!("invalid request body: {}", rejection.body_text()),
            ),
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => return too_large(),
            other => (
                StatusCode::BAD_REQUEST,
                format!("unreadable request body: {}", other.body_text()),
            ),
        };
        ApiError::with_status(status, JobError::invalid(message))
    }
}

/// HTTP status of an error answered outside a stream. `CANCELLED` uses the
/// non-standard 499 ("client closed request").
pub fn http_status(code: ErrorCode) -> StatusCode {
    let status = match code {
        ErrorCode::InvalidRequest => 400,
        ErrorCode::ModelLoadFailed => 500,
        ErrorCode::InsufficientVram => 503,
        ErrorCode::VramOom => 500,
        ErrorCode::CudaError => 500,
        ErrorCode::InferenceTimeout => 504,
        ErrorCode::Cancelled => 499,
        ErrorCode::Internal => 500,
        ErrorCode::QueueFull => 503,
        ErrorCode::ShuttingDown => 503,
    };
    StatusCode::from_u16(status).expect("every status above is in 100..=999")
}

impl From<JobError> for ApiError {
    fn from(error: JobError) -> Self {
        ApiError {
            status: http_status(error.code),
            error,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry_after = match self.error.code {
            ErrorCode::QueueFull => Some(RETRY_AFTER_QUEUE_FULL_S),
            ErrorCode::ShuttingDown => Some(RETRY_AFTER_SHUTTING_DOWN_S),
            _ => None,
        };
        let mut response = (self.status, Json(ErrorBody::from(&self.error))).into_response();
        if let Some(s) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

/// 408 when the body missed its deadline ([`super::guard::BodyTimeout`]),
/// 413 when it was already too large, else 400 (malformed framing, such as
/// a bad chunk size).
fn body_error(e: axum::Error, oversized: bool) -> Response {
    let source = e.into_inner();
    // The timeout may come wrapped in layers of body errors.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(c) = cause {
        if let Some(t) = c.downcast_ref::<super::guard::BodyTimeout>() {
            let error = JobError::invalid(t.to_string());
            return ApiError::with_status(StatusCode::REQUEST_TIMEOUT, error).into_response();
        }
        cause = c.source();
    }
    if oversized {
        return too_large().into_response();
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

fn too_large() -> ApiError {
    ApiError::with_status(
        StatusCode::PAYLOAD_TOO_LARGE,
        JobError::invalid(format!(
            "the request body is larger than {} bytes",
            super::MAX_BODY_BYTES
        )),
    )
}

/// Reads the whole body before the handler runs, refusing bodies over
/// [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES) with 413. An oversized body is
/// still read (and dropped), up to [`MAX_DRAINED_BYTES`](super::MAX_DRAINED_BYTES),
/// so the client finishes sending and sees the answer instead of a reset.
/// A refused `/execute` counts as `invalid` in `worker_requests_total`.
pub async fn limit_body(
    State(state): State<super::AppState>,
    req: Request,
    next: Next,
) -> Response {
    let limit = super::MAX_BODY_BYTES as u64;
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut oversized = declared.is_some_and(|n| n > limit);
    // Far too large to drain: answer at once and close the connection.
    if declared.is_some_and(|n| n > super::MAX_DRAINED_BYTES) {
        return closing(too_large().into_response());
    }
    let mut kept = Vec::with_capacity(declared.filter(|_| !oversized).unwrap_or(0) as usize);
    let mut seen = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => return closing(body_error(e, oversized)),
        };
        seen += chunk.len() as u64;
        oversized |= seen > limit;
        if oversized {
            if seen > super::MAX_DRAINED_BYTES {
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
            state
                .metrics
                .request_finished(crate::engine::Outcome::Invalid);
        }
        if openai {
            return super::openai::error::OpenAiError::from(too_large()).into_response();
        }
        return too_large().into_response();
    }
    next.run(Request::from_parts(parts, Body::from(kept))).await
}

/// `Json<T>` whose rejections are [`ApiError`]s.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(ApiError::from_json_rejection(rejection)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole stable table: each code's string, HTTP status and retriable flag.
    #[test]
    fn codes_strings_statuses_and_retriable_are_pinned() {
        let table = [
            (ErrorCode::InvalidRequest, "INVALID_REQUEST", 400, false),
            (ErrorCode::ModelLoadFailed, "MODEL_LOAD_FAILED", 500, false),
            (ErrorCode::InsufficientVram, "INSUFFICIENT_VRAM", 503, false),
            (ErrorCode::VramOom, "VRAM_OOM", 500, false),
            (ErrorCode::CudaError, "CUDA_ERROR", 500, false),
            (ErrorCode::InferenceTimeout, "INFERENCE_TIMEOUT", 504, false),
            (ErrorCode::Cancelled, "CANCELLED", 499, false),
            (ErrorCode::Internal, "INTERNAL", 500, false),
            (ErrorCode::QueueFull, "QUEUE_FULL", 503, true),
            (ErrorCode::ShuttingDown, "SHUTTING_DOWN", 503, true),
        ];
        assert_eq!(table.len(), ErrorCode::ALL.len());
        for (code, s, status, retriable) in table {
            assert_eq!(code.as_str(), s);
            assert_eq!(http_status(code).as_u16(), status, "{s}");
            assert_eq!(code.retriable(), retriable, "{s}");
            assert_eq!(s.parse::<ErrorCode>().unwrap(), code);
        }
        assert!(JobError::cancelled_by_shutdown().retriable);
        assert!(!JobError::cancelled().retriable);
    }

    #[test]
    fn status_comes_from_the_code_and_503s_carry_retry_after() {
        let r = ApiError::from(JobError::queue_full(2)).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::from(JobError::shutting_down()).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().contains_key(header::RETRY_AFTER));
        let r = ApiError::from(JobError::cancelled()).into_response();
        assert_eq!(r.status().as_u16(), 499);
        let r = ApiError::invalid("x: bad").into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(!r.headers().contains_key(header::RETRY_AFTER));
    }
}
