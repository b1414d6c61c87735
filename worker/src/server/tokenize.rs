//! `POST /tokenize` and `POST /detokenize` (EXT-006), as llama.cpp's server
//! has them. They run on the HTTP side with the shared tokenizer and never
//! wait for a job.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiJson};
use super::AppState;

/// Most ids one `/detokenize` call takes.
pub const MAX_DETOKENIZE_TOKENS: usize = 65_536;

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default = "yes")]
    pub add_special: bool,
    #[serde(default = "yes")]
    pub parse_special: bool,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenizeResponse {
    pub tokens: Vec<u32>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    pub tokens: Vec<i64>,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeResponse {
    pub content: String,
}

#[utoipa::path(
    post,
    path = "/tokenize",
    tag = "worker",
    request_body = TokenizeRequest,
    responses(
        (status = 200, body = TokenizeResponse),
        (status = 400, body = super::events::ErrorBody),
    )
)]
pub async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    // The longest text that `/execute` takes.
    let chars = req.content.chars().count();
    if let Some(most) = state
        .limits
        .execute
        .prompt_chars
        .filter(|&most| chars > most)
    {
        return Err(ApiError::invalid(format!(
            "content: must be at most {most} characters (got {chars})"
        )));
    }
    let tokenizer = state.tokenizer.clone();
    let tokens = tokio::task::spawn_blocking(move || {
        tokenizer.encode(&req.content, req.add_special, req.parse_special)
    })
    .await
    .map_err(|_| ApiError::from(crate::engine::JobError::internal("tokenization failed")))?
    .map_err(|e| ApiError::invalid(format!("content: cannot be tokenized: {e}")))?;
    Ok(Json(TokenizeResponse { tokens }))
}

#[utoipa::path(
    post,
    path = "/detokenize",
    tag = "worker",
    request_body = DetokenizeRequest,
    responses(
        (status = 200, body = DetokenizeResponse),
        (status = 400, body = super::events::ErrorBody),
    )
)]
pub async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    if req.tokens.len() > MAX_DETOKENIZE_TOKENS {
        return Err(ApiError::invalid(format!(
            "tokens: at most {MAX_DETOKENIZE_TOKENS} ids"
        )));
    }
    let vocab = state.tokenizer.vocab_size() as i64;
    let mut ids = Vec::with_capacity(req.tokens.len());
    for (i, &t) in req.tokens.iter().enumerate() {
        if !(0..vocab).contains(&t) {
            return Err(ApiError::invalid(format!(
                "tokens: id {t} at index {i} is outside the vocabulary (0..{vocab})"
            )));
        }
        ids.push(t as u32);
    }
    let tokenizer = state.tokenizer.clone();
    let content = tokio::task::spawn_blocking(move || tokenizer.decode(&ids))
        .await
        .map_err(|_| ApiError::from(crate::engine::JobError::internal("detokenization failed")))?
        .map_err(|e| ApiError::invalid(format!("tokens: cannot be decoded: {e}")))?;
    Ok(Json(DetokenizeResponse { content }))
}
