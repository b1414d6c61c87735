//! The Anthropic Messages wire types the worker reads and writes, after
//! Anthropic's API reference (`POST /v1/messages`). Only what the worker
//! serves is typed; any other field lands in `other` and is refused by name
//! (see `request.rs`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::server::openai::responses::types::InputContent;

/// A message's or the system prompt's content: text, or a list of blocks.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<ContentBlockIn>),
}

/// One content block as sent: `text`; in an assistant message `tool_use`
/// (`id`, `name`, `input`); in a user message `tool_result`
/// (`tool_use_id`, `content`, `is_error`). Other types (`image`,
/// `document`, `thinking`, ...) are refused by their type.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ContentBlockIn {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `tool_use`: the call's id, which its `tool_result` names.
    pub id: Option<String>,
    /// `tool_use`: the tool called.
    pub name: Option<String>,
    /// `tool_use`: the call's arguments, an object.
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// `tool_result`: the `id` of the call it answers.
    pub tool_use_id: Option<String>,
    /// `tool_result`: the result, text or text blocks (absent: empty),
    /// the shape of a Responses message's content.
    pub content: Option<InputContent>,
    /// `tool_result`: the call failed; the template gets the content
    /// after `Error: `.
    pub is_error: Option<bool>,
    /// `cache_control` and whatever else a block carries.
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// One entry of `tools`: a client tool (`type` absent or `custom`); server
/// tools (`web_search_20250305`, `bash_20250124`, ...) are refused by type.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MessagesToolDoc {
    /// Letters, digits, `_` and `-`; at most 64 characters; unique in `tools`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of the input object.
    #[schema(value_type = Object)]
    pub input_schema: Value,
    /// Absent or `custom`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

/// `tool_choice`: `auto` (the default with tools), `any` (at least one
/// call), `tool` (a call to `name`) or `none` (the tools are described, no
/// call is read); `any` and `tool` are generated under a grammar of the
/// calls, so that they always parse.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MessagesToolChoiceDoc {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `tool`: the tool to call.
    pub name: Option<String>,
    /// At most one call in the answer (default false).
    pub disable_parallel_tool_use: Option<bool>,
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
    /// Extension: the sampling seed, as `/execute`'s (the same seed, the
    /// same answer, whole or streamed).
    pub seed: Option<u64>,
    pub thinking: Option<ThinkingParam>,
    /// Tools the model may call, described to it by its chat template.
    #[schema(value_type = Option<Vec<MessagesToolDoc>>)]
    pub tools: Option<Value>,
    #[schema(value_type = Option<MessagesToolChoiceDoc>)]
    pub tool_choice: Option<Value>,
    /// Every other field: refused by name unless it leaves the answer as is
    /// (`metadata`, `service_tier`, `inference_geo`, `speed`, `cache_control`).
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// A block of the answer's content: its text, or a call.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    ToolUse {
        /// `toolu_` and 24 hexadecimal digits.
        id: String,
        name: String,
        /// The arguments, an object (under the tool's `input_schema` when
        /// `tool_choice` is `any` or `tool`).
        #[schema(value_type = Object)]
        input: Value,
    },
}

impl ContentBlock {
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
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
    /// The answer's text, then its calls; empty when the model ended at once.
    pub content: Vec<ContentBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`; null in
    /// `message_start`.
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
