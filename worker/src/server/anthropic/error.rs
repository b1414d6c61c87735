//! Errors of `/v1/messages` in Anthropic's shape,
//! `{"type": "error", "error": {"type", "message"}}`, with the HTTP status and
//! `Retry-After` that `/execute` gives the same error, so the official client
//! raises its typed exceptions (`BadRequestError` for 400, `NotFoundError`
//! for another model, a retried `InternalServerError` for a full queue).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::types::{MessagesErrorBody, MessagesErrorDetail};
use crate::engine::error::JobError;
use crate::server::error::{error_response, retry_after, ApiError};
use crate::server::openai::tools::spec::Refusal;

/// The refusals `/v1/messages` documents, each a [`MessagesErrorBody`].
#[derive(utoipa::IntoResponses)]
pub enum Refusals {
    #[response(status = 400, description = "A field is invalid or not served")]
    Invalid(MessagesErrorBody),
    #[response(status = 404, description = "`model` is not the served model")]
    UnknownModel(MessagesErrorBody),
    #[response(status = 413, description = "The body is over 1 MiB")]
    TooLarge(MessagesErrorBody),
    #[response(
        status = 503,
        description = "The queue is full or the worker is shutting down (Retry-After)"
    )]
    Busy(MessagesErrorBody),
}

/// An error answer of `/v1/messages`.
#[derive(Debug)]
pub struct AnthropicError {
    pub status: StatusCode,
    pub body: MessagesErrorBody,
    retry_after: Option<u64>,
}

/// Anthropic's error `type` of a status.
fn kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

impl AnthropicError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        AnthropicError {
            status,
            body: MessagesErrorBody {
                kind: "error".into(),
                error: MessagesErrorDetail {
                    kind: kind(status).into(),
                    message: message.into(),
                },
            },
            retry_after: None,
        }
    }

    /// A 400; the message starts with the field it names (`"tools: ..."`).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 for a `model` other than the one served.
    pub fn model_not_found(asked: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("model: {asked:?} is not served here; this worker serves {served:?}"),
        )
    }

    /// The error's code in the worker's log (`INVALID_REQUEST`, ...).
    pub fn log_code(&self) -> String {
        self.body.error.kind.to_ascii_uppercase()
    }

    /// The same error as a stream's `error` event data.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body).expect("error bodies serialize")
    }
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        let mut out = AnthropicError::from(e.error);
        out.status = e.status;
        out.body.error.kind = kind(e.status).into();
        out
    }
}

impl From<JobError> for AnthropicError {
    fn from(e: JobError) -> Self {
        let status = crate::server::error::http_status(e.code);
        let mut out = AnthropicError::new(status, e.message);
        out.retry_after = retry_after(e.code);
        out
    }
}

impl From<Refusal> for AnthropicError {
    fn from(r: Refusal) -> Self {
        AnthropicError::invalid(r.message())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        error_response(self.status, self.body, self.retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    #[test]
    fn statuses_keep_execute_s_and_types_are_anthropic_s() {
        let e = AnthropicError::from(ApiError::invalid("max_tokens: must be at least 1"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let v = serde_json::to_value(&e.body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "max_tokens: must be at least 1");
        let r = AnthropicError::from(JobError::queue_full(2)).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let e = AnthropicError::from(JobError::queue_full(2));
        assert_eq!(e.body.error.kind, "overloaded_error");
        assert_eq!(
            AnthropicError::from(JobError::timeout(1)).body.error.kind,
            "timeout_error"
        );
        let too_large =
            ApiError::with_status(StatusCode::PAYLOAD_TOO_LARGE, JobError::invalid("big"));
        let e = AnthropicError::from(too_large);
        assert_eq!(
            (e.status.as_u16(), e.body.error.kind.as_str()),
            (413, "request_too_large")
        );
        assert_eq!(
            AnthropicError::model_not_found("claude", "smol")
                .body
                .error
                .kind,
            "not_found_error"
        );
    }
}
