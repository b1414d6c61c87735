//! The worker's router: every route of the API, the answers to an unknown
//! route or a wrong method, and the body limit around them (the limits'
//! `body_bytes`, enforced by `guard::limit_body`).

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::server::state::AppState;
use crate::server::{anthropic, control, error, execute, guard, info, openai, openapi, tokenize};

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
        .layer(DefaultBodyLimit::max(state.limits.body_bytes()))
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
