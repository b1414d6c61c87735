//! Errors of the OpenAI routes in OpenAI's shape,
//! `{"error": {"message", "type", "param", "code"}}`, with the HTTP status and
//! `Retry-After` that `/execute` gives the same error (see `server::error`),
//! so the official clients raise their typed exceptions (`BadRequestError`
//! for 400, `APIStatusError` with 503 for a full queue, ...).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::types::{ErrorObject, ErrorResponse};
use crate::engine::error::{ErrorCode, JobError};
use crate::server::error::{error_response, retry_after, ApiError};

/// The refusals both completion routes document, each an [`ErrorResponse`].
#[derive(utoipa::IntoResponses)]
pub enum Refusals {
    #[response(status = 400, description = "A field is invalid or not served")]
    Invalid(ErrorResponse),
    #[response(status = 404, description = "`model` is not the served model")]
    UnknownModel(ErrorResponse),
    #[response(status = 413, description = "The body is over 1 MiB")]
    TooLarge(ErrorResponse),
    #[response(
        status = 503,
        description = "The queue is full or the worker is shutting down (Retry-After)"
    )]
    Busy(ErrorResponse),
}

/// An error answer of an OpenAI route.
#[derive(Debug)]
pub struct OpenAiError {
    pub status: StatusCode,
    pub body: ErrorResponse,
    retry_after: Option<u64>,
}

/// OpenAI's `type`: its clients read the status, people read this.
fn kind(status: StatusCode) -> &'static str {
    if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    }
}

impl OpenAiError {
    fn new(status: StatusCode, message: String, param: Option<String>, code: &str) -> Self {
        OpenAiError {
            status,
            body: ErrorResponse {
                error: ErrorObject {
                    message,
                    kind: kind(status).to_string(),
                    param,
                    code: Some(code.to_string()),
                },
            },
            retry_after: None,
        }
    }

    /// A 400 that names `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        let code = ErrorCode::InvalidRequest.as_str().to_ascii_lowercase();
        Self::new(
            StatusCode::BAD_REQUEST,
            message.into(),
            Some(param.to_string()),
            &code,
        )
    }

    /// 404 for a `model` other than the one served, as OpenAI answers it.
    pub fn model_not_found(asked: &str, served: &str) -> Self {
        let message = format!("model: {asked:?} is not served here; this worker serves {served:?}");
        Self::new(
            StatusCode::NOT_FOUND,
            message,
            Some("model".into()),
            "model_not_found",
        )
    }

    /// The same error as a stream's last `data:` line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body).expect("error bodies serialize")
    }
}

/// The field a validation message starts with (`"max_tokens: must be ..."`).
fn field_of(message: &str) -> Option<String> {
    let (field, _) = message.split_once(": ")?;
    let is_name = !field.is_empty() && field.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    is_name.then(|| field.to_string())
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        let mut out = OpenAiError::from(e.error);
        out.status = e.status;
        out.body.error.kind = kind(e.status).to_string();
        out
    }
}

impl From<JobError> for OpenAiError {
    fn from(e: JobError) -> Self {
        let status = crate::server::error::http_status(e.code);
        let param = match e.code {
            ErrorCode::InvalidRequest => field_of(&e.message),
            _ => None,
        };
        let code = e.code.as_str().to_ascii_lowercase();
        let mut out = OpenAiError::new(status, e.message, param, &code);
        out.retry_after = retry_after(e.code);
        out
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        error_response(self.status, self.body, self.retry_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    #[test]
    fn validation_errors_keep_status_and_name_their_field() {
        let e = OpenAiError::from(ApiError::invalid(
            "max_tokens: must be between 1 and 8 (got 9)",
        ));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let v = serde_json::to_value(&e.body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "max_tokens");
        assert_eq!(v["error"]["code"], "invalid_request");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("max_tokens: "));
        let e = OpenAiError::from(ApiError::invalid("prompt/messages: give exactly one"));
        assert_eq!(e.body.error.param, None);
    }

    #[test]
    fn a_full_queue_is_503_with_retry_after_and_a_server_error_type() {
        let r = OpenAiError::from(ApiError::from(JobError::queue_full(2))).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let e = OpenAiError::from(JobError::queue_full(2));
        assert_eq!(e.body.error.kind, "server_error");
        assert_eq!(e.body.error.code.as_deref(), Some("queue_full"));
    }

    #[test]
    fn statuses_follow_execute_and_413_stays_413() {
        let too_large =
            ApiError::with_status(StatusCode::PAYLOAD_TOO_LARGE, JobError::invalid("big"));
        assert_eq!(OpenAiError::from(too_large).status.as_u16(), 413);
        assert_eq!(OpenAiError::from(JobError::timeout(1)).status.as_u16(), 504);
        assert_eq!(
            OpenAiError::from(JobError::cancelled()).status.as_u16(),
            499
        );
    }
}
