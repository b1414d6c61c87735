//! `POST /cancel` (M0-W-1330) and `POST /shutdown` (M0-W-1340).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiJson};
use super::AppState;
use crate::engine::runner::CancelState;
use crate::narrate;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    pub job_id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct CancelResponse {
    pub job_id: String,
    /// Where the job was: `queued`, `running` or `not_found` (unknown or finished).
    pub state: String,
}

/// Always 202 for a well-formed request: cancelling is idempotent.
#[utoipa::path(
    post,
    path = "/cancel",
    tag = "worker",
    request_body = CancelRequest,
    responses(
        (status = 202, description = "Cancelled, or nothing to cancel", body = CancelResponse),
        (status = 400, description = "No job_id", body = super::events::ErrorBody),
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CancelRequest>,
) -> Result<(StatusCode, Json<CancelResponse>), ApiError> {
    let job_id = req
        .job_id
        .ok_or_else(|| "is required and must not be empty".to_string())
        .and_then(|id| super::validation::check_job_id(&id).map(|()| id))
        .map_err(|reason| ApiError::invalid(format!("job_id: {reason}")))?;
    let found = state.engine.cancel(&job_id);
    let label = match found {
        CancelState::Queued => "queued",
        CancelState::Running => "running",
        CancelState::NotFound => "not_found",
    };
    narrate!(info, "cancel", job_id = %job_id, state = label);
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelResponse {
            job_id,
            state: label.into(),
        }),
    ))
}

/// Starts a graceful shutdown. The body must be empty or `{}`.
#[utoipa::path(
    post,
    path = "/shutdown",
    tag = "worker",
    request_body(content = Object, description = "Empty or `{}`"),
    responses(
        (status = 202, description = "`{status: \"shutting_down\"}`", body = Object),
        (status = 400, description = "A body other than empty or `{}`", body = super::events::ErrorBody),
    )
)]
pub async fn shutdown(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::invalid("the body must be empty or {}"))?;
    if !text.trim().is_empty() {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(map)) if map.is_empty() => {}
            _ => return Err(ApiError::invalid("the body must be empty or {}")),
        }
    }
    state.shutdown.trigger("request");
    Ok((
        StatusCode::ACCEPTED,
        Json(serde_json::json!({"status": "shutting_down"})),
    ))
}
