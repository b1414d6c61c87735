//! The one mapping from errors to HTTP answers: every non-stream error is a
//! JSON body `{code, message, retriable}` (the same JSON as the SSE `error`
//! event) with the code's status, and `Retry-After` on 503s.
//!
//! Body problems are answered as `INVALID_REQUEST` (EXT-004):
//! malformed JSON, invalid UTF-8, wrong JSON types, unknown fields and a
//! `Content-Type` other than `application/json` → 400 (EXT-004 names 400
//! and 413 only); a body over
//! [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES) → 413 (the body limit itself,
//! which reads the body before any handler, is `server::guard`'s).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
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

    /// 413: the body is over [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES).
    pub fn too_large(limit: usize) -> Self {
        ApiError::with_status(
            StatusCode::PAYLOAD_TOO_LARGE,
            JobError::invalid(format!("the request body is larger than {limit} bytes")),
        )
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
            // guard::limit_body refuses a body over the limit before any
            // extractor reads it; this is the extractors' own limit, the same.
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than the worker accepts".to_string(),
            ),
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
        ErrorCode::InferenceFailed => 503,
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

/// Seconds a client should wait before retrying an error with `code`
/// (`Retry-After`), for the errors that pass.
pub fn retry_after(code: ErrorCode) -> Option<u64> {
    match code {
        ErrorCode::QueueFull => Some(RETRY_AFTER_QUEUE_FULL_S),
        ErrorCode::ShuttingDown => Some(RETRY_AFTER_SHUTTING_DOWN_S),
        _ => None,
    }
}

/// `body` as JSON with `status`, and `Retry-After` when `retry_after` says:
/// every front door's error answer.
pub fn error_response<T: serde::Serialize>(
    status: StatusCode,
    body: T,
    retry_after: Option<u64>,
) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Some(s) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = retry_after(self.error.code);
        error_response(self.status, ErrorBody::from(&self.error), retry)
    }
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
            (ErrorCode::InferenceFailed, "INFERENCE_FAILED", 503, true),
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
