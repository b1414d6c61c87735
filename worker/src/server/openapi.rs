//! `GET /openapi.json`: the OpenAPI document of the whole HTTP API, every
//! front door (`/execute` and its companions, the OpenAI routes, Anthropic's
//! `/v1/messages`), generated from the request and response types and the
//! handlers' `#[utoipa::path]` annotations, as TGI does, so the document cannot drift from the code's
//! types. CI checks the running worker against it with schemathesis.

use axum::extract::State;
use axum::Json;
use utoipa::OpenApi;

use super::info::About;
use super::{anthropic, openai, AppState};

#[derive(OpenApi)]
#[openapi(
    info(title = "worker-orcd", description = "One GGUF model on one GPU over HTTP/SSE: the worker's own API \
        (`/execute` ...), an OpenAI-compatible one (`/v1/chat/completions` ...) and Anthropic's \
        Messages (`/v1/messages`)."),
    paths(
        about,
        super::execute::execute,
        super::control::cancel,
        super::control::shutdown,
        super::info::health,
        super::info::metrics,
        super::tokenize::tokenize,
        super::tokenize::detokenize,
        openai::chat::chat_completions,
        openai::completions::completions,
        openai::models::list_models,
        openai::responses::responses,
        anthropic::messages,
        openapi_json,
    ),
    components(schemas(
        About,
        super::events::StartedEvent,
        super::events::TokenEvent,
        super::events::EndEvent,
        super::events::LogprobEntry,
        openai::types::ChatCompletionChunk,
        // Named by `openai::error::Refusals`' responses, which do not register it.
        openai::types::ErrorResponse,
        anthropic::types::MessagesErrorBody,
    )),
    tags(
        (name = "worker", description = "The worker's own API"),
        (name = "openai", description = "The OpenAI-compatible API"),
        (name = "anthropic", description = "The Anthropic Messages API"),
    )
)]
pub struct ApiDoc;

/// Every route of the document, `METHOD /path`, in its order.
pub fn routes() -> &'static [String] {
    static ROUTES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ROUTES.get_or_init(|| {
        let doc: serde_json::Value =
            serde_json::from_str(&document()).expect("the OpenAPI document is JSON");
        let paths = doc["paths"].as_object().cloned().unwrap_or_default();
        let mut routes = Vec::new();
        for (path, item) in paths {
            for (method, _) in item.as_object().into_iter().flatten() {
                routes.push(format!("{} {path}", method.to_uppercase()));
            }
        }
        routes
    })
}

/// The document as JSON.
pub fn document() -> String {
    ApiDoc::openapi()
        .to_json()
        .expect("the OpenAPI document serializes")
}

/// The document as this worker serves it: `model` of the OpenAI and
/// Anthropic requests is one of the names it answers to, so clients and
/// fuzzers (schemathesis) can make requests that reach the engine.
pub fn served_document(model_names: &[String]) -> serde_json::Value {
    let mut doc: serde_json::Value =
        serde_json::from_str(&document()).expect("the OpenAPI document is JSON");
    for schema in ["SamplingFields", "ResponsesRequest", "MessagesRequest"] {
        let model = &mut doc["components"]["schemas"][schema]["properties"]["model"];
        if model.is_object() {
            model["enum"] = serde_json::json!(model_names);
        }
    }
    doc
}

/// This document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "worker",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object))
)]
pub async fn openapi_json(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(served_document(&openai::models::served_names(&state)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_front_door_is_documented_with_its_types() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        for path in [
            "/",
            "/execute",
            "/cancel",
            "/shutdown",
            "/health",
            "/metrics",
            "/tokenize",
            "/detokenize",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/v1/responses",
            "/v1/messages",
            "/openapi.json",
        ] {
            assert!(doc["paths"].get(path).is_some(), "{path} is missing");
        }
        let schemas = &doc["components"]["schemas"];
        for name in [
            "ExecuteRequest",
            "ChatCompletionRequest",
            "ChatCompletion",
            "Completion",
            "ErrorResponse",
            "ResponsesRequest",
            "ResponseObject",
            "MessagesRequest",
            "Message",
            "MessagesErrorBody",
        ] {
            assert!(schemas.get(name).is_some(), "{name} is missing");
        }
        // The /execute body keeps refusing unknown fields, and says so.
        assert_eq!(schemas["ExecuteRequest"]["additionalProperties"], false);
        let served = served_document(&["m".to_string()]);
        for schema in ["SamplingFields", "ResponsesRequest", "MessagesRequest"] {
            let model = &served["components"]["schemas"][schema]["properties"]["model"];
            assert_eq!(model["enum"], serde_json::json!(["m"]), "{schema}");
        }
        // Each front door documents its own error body (utoipa names schemas
        // by type name: two `ErrorBody`s would silently become one).
        let messages_400 = &doc["paths"]["/v1/messages"]["post"]["responses"]["400"];
        let schema = &messages_400["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(schema, "#/components/schemas/MessagesErrorBody");
    }

    /// The tool fields of the three front doors are documented, each with
    /// its own types (a schema name used twice would silently be one: the
    /// Responses API's `tool_choice` took Anthropic's shape once).
    #[test]
    fn every_front_door_documents_its_own_tool_types() {
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let property = |schema: &str, field: &str| {
            let p = &schemas[schema]["properties"][field];
            assert!(!p.is_null(), "{schema}.{field} is missing");
            p.to_string()
        };
        for (schema, field, names) in [
            ("ResponsesRequest", "tools", "FunctionToolDoc"),
            ("ResponsesRequest", "tool_choice", "ResponsesToolChoiceDoc"),
            ("ResponseObject", "tool_choice", "ResponsesToolChoiceDoc"),
            ("ResponseObject", "output", "OutputItem"),
            ("MessagesRequest", "tools", "MessagesToolDoc"),
            ("MessagesRequest", "tool_choice", "MessagesToolChoiceDoc"),
            ("Message", "content", "ContentBlock"),
        ] {
            let p = property(schema, field);
            assert!(p.contains(&format!("/{names}\"")), "{schema}.{field}: {p}");
        }
        for (schema, fields) in [
            ("ResponsesRequest", &["parallel_tool_calls", "seed"][..]),
            ("MessagesRequest", &["seed"][..]),
            ("ContentBlockIn", &["input", "tool_use_id", "is_error"][..]),
            ("InputItem", &["call_id", "arguments", "output"][..]),
            ("FunctionCallItem", &["call_id", "arguments", "status"][..]),
        ] {
            for field in fields {
                property(schema, field);
            }
        }
        let choices = [
            "ToolChoiceDoc",
            "ResponsesToolChoiceDoc",
            "MessagesToolChoiceDoc",
        ]
        .map(|name| schemas[name].to_string());
        assert!(
            choices[1].contains("ResponsesNamedFunctionDoc"),
            "{}",
            choices[1]
        );
        assert!(
            choices[2].contains("disable_parallel_tool_use"),
            "{}",
            choices[2]
        );
        assert!(choices[0] != choices[1] && choices[1] != choices[2]);
        let block = schemas["ContentBlock"].to_string();
        assert!(block.contains("tool_use"), "{block}");
    }

    /// `GET /` lists the routes from this document, so it cannot miss one.
    #[test]
    fn routes_come_from_the_document() {
        let routes = routes();
        for route in [
            "GET /",
            "POST /execute",
            "GET /health",
            "POST /v1/chat/completions",
        ] {
            assert!(routes.iter().any(|r| r == route), "{route} in {routes:?}");
        }
        let doc: serde_json::Value = serde_json::from_str(&document()).unwrap();
        assert!(routes.len() >= doc["paths"].as_object().unwrap().len());
    }
}

/// `GET /` answers with the routes of this document (so it lives here).
#[utoipa::path(get, path = "/", tag = "worker", responses((status = 200, body = About)))]
pub async fn about(State(state): State<AppState>) -> Json<About> {
    Json(About {
        name: env!("CARGO_PKG_NAME").into(),
        version: env!("CARGO_PKG_VERSION").into(),
        model: state.model.model_ref.clone(),
        routes: routes().to_vec(),
    })
}
