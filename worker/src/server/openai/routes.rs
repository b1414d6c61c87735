//! The OpenAI routes and their handlers.

use axum::routing::{get, post};
use axum::Router;

use crate::server::openai::{chat, completions, models, responses};
use crate::server::state::AppState;

/// The OpenAI routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/models", get(models::list_models))
}
