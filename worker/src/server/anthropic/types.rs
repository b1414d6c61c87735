//! The Anthropic Messages wire types the worker reads and writes, after
//! Anthropic's API reference (`POST /v1/messages`). Only what the worker
//! serves is typed; any other field lands in `other` and is refused by name
//! (see `request.rs`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// A message's or the system prompt's content: text, or a list of blocks.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<ContentBlockIn>),
}

/// One content block as sent. Only `text` blocks are served; the others
/// (`image`, `tool_use`, `tool_result`, `document`, `thinking`) are refused
/// by their type, with the fields they carry kept only to name them.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ContentBlockIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `cache_control` and whatever else a block carries.
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// One message of the conversation.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageParam {
    /// `user` or `assistant`.
    pub role: String,
    pub content: Content,
}

/// `thinking`: only `{"type": "disabled"}` is served.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ThinkingParam {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// `POST /v1/messages`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct MessagesRequest {
    /// The id from `GET /v1/models`.
    pub model: String,
    pub messages: Vec<MessageParam>,
    /// Required, as Anthropic requires it.
    #[schema(minimum = 1, maximum = 2048)]
    pub max_tokens: i64,
    pub system: Option<Content>,
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: bool,
    /// Extension (Anthropic's current API has no sampling fields; clients
    /// send them as extra body fields).
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    pub thinking: Option<ThinkingParam>,
    /// Every other field: refused by name unless it leaves the answer as is
    /// (`metadata`, `service_tier`, `inference_geo`, `speed`, `cache_control`).
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// A block of the answer's content.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct TextBlock {
    /// `text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

impl TextBlock {
    pub fn new(text: impl Into<String>) -> Self {
        TextBlock {
            kind: "text".into(),
            text: text.into(),
        }
    }
}

/// Tokens of the prompt and of the answer.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, ToSchema, PartialEq, Eq)]
pub struct MessagesUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
}

/// The answer: one `message`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct Message {
    /// `msg_<hex>`.
    pub id: String,
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `assistant`.
    pub role: String,
    pub model: String,
    /// The answer's text; empty when the model ended at once.
    pub content: Vec<TextBlock>,
    /// `end_turn`, `max_tokens` or `stop_sequence`; null in `message_start`.
    pub stop_reason: Option<String>,
    /// The stop sequence that ended the answer.
    pub stop_sequence: Option<String>,
    pub usage: MessagesUsage,
}

/// `error` of an [`MessagesErrorBody`].
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct MessagesErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `request_too_large`, `overloaded_error`, `timeout_error` or `api_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// An error answer, also the `data` of a stream's `error` event.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct MessagesErrorBody {
    /// `error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub error: MessagesErrorDetail,
}
