//! The OpenAI Responses wire types the worker reads and writes, after
//! OpenAI's API reference (`POST /v1/responses`). Only what the worker
//! serves is typed; any other field lands in `other` and is refused by name
//! unless it leaves the answer as is (see `request.rs`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::server::openai::tools::types::FunctionDef;
use crate::server::openai::types::{JsonSchemaFormat, ResponseFormat};

/// `input`: one user message as text, or a list of items.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ResponsesInput {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item: a message (`type` `message` or absent), a call the
/// model made (`function_call`: `call_id`, `name`, `arguments`) or its
/// result (`function_call_output`: `call_id`, `output`). Other item types
/// (`reasoning`, `web_search_call`, ...) are refused by their type.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct InputItem {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `user`, `assistant`, `system` or `developer` (served as `system`).
    pub role: Option<String>,
    pub content: Option<InputContent>,
    /// `function_call` and `function_call_output`: the call's id.
    pub call_id: Option<String>,
    /// `function_call`: the function called.
    pub name: Option<String>,
    /// `function_call`: the arguments as JSON text.
    pub arguments: Option<String>,
    /// `function_call_output`: the result, text or text parts.
    pub output: Option<InputContent>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// A message's content: text, or parts of which `input_text` and
/// `output_text` are served.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum InputContent {
    Text(String),
    Parts(Vec<InputPart>),
}

/// One part of a message's content.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct InputPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// `text`: its `format` is enforced token by token; `verbosity` is not served.
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
pub struct TextParam {
    pub format: Option<TextFormat>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// `text.format`: chat's `response_format` with the `json_schema` fields
/// beside `type` rather than under `json_schema`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema(JsonSchemaFormat),
}

impl From<TextFormat> for ResponseFormat {
    fn from(f: TextFormat) -> Self {
        match f {
            TextFormat::Text => ResponseFormat::Text,
            TextFormat::JsonObject => ResponseFormat::JsonObject,
            TextFormat::JsonSchema(json_schema) => ResponseFormat::JsonSchema { json_schema },
        }
    }
}

/// `reasoning`: `effort` goes to the chat template (gpt-oss).
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
pub struct ReasoningParam {
    pub effort: Option<String>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// `POST /v1/responses`. Stateless: `store: true` and
/// `previous_response_id` are refused.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ResponsesRequest {
    /// The id from `GET /v1/models`.
    pub model: String,
    pub input: ResponsesInput,
    /// A system message before the input.
    pub instructions: Option<String>,
    #[schema(minimum = 1, maximum = 2048)]
    pub max_output_tokens: Option<i64>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Extension: the sampling seed, as `/execute`'s (the same seed, the
    /// same answer, whole or streamed).
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    pub reasoning: Option<ReasoningParam>,
    /// The answer's form: `text.format` (issue #43).
    pub text: Option<TextParam>,
    /// Functions the model may call, described to it by its chat template;
    /// other tool types (`web_search`, `file_search`, ...) are refused.
    #[schema(value_type = Option<Vec<FunctionToolDoc>>)]
    pub tools: Option<Value>,
    #[schema(value_type = Option<ResponsesToolChoiceDoc>)]
    pub tool_choice: Option<Value>,
    /// Whether an answer may hold more than one call (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Every other field: refused by name unless it leaves the answer as is.
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// One entry of `tools`: a function, its fields beside `type` rather than
/// under `function` as on the chat route.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FunctionToolDoc {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(flatten)]
    pub function: FunctionDef,
}

/// `tool_choice`: `auto` (the default with tools), `none` (tools are
/// described, no call is read), `required` (at least one call), or
/// `{"type": "function", "name": ...}` (that call).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ResponsesToolChoiceDoc {
    Mode(String),
    Named(ResponsesNamedFunctionDoc),
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ResponsesNamedFunctionDoc {
    /// `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
}

/// A part of the answer's message.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
}

/// The answer's message: an output item.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct OutputMessage {
    /// `message`.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: String,
    /// `assistant`.
    pub role: String,
    pub content: Vec<OutputText>,
}

/// A call the model made: an output item.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct FunctionCallItem {
    /// `function_call`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `fc_` and 24 hexadecimal digits.
    pub id: String,
    /// `call_` and the same digits: what `function_call_output` names.
    pub call_id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
    /// `in_progress` (when added to a stream) or `completed`.
    pub status: String,
}

/// One output item: a message, or a call.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
#[serde(untagged)]
pub enum OutputItem {
    Message(OutputMessage),
    FunctionCall(FunctionCallItem),
}

/// `usage` of a response.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: Value,
    pub output_tokens: usize,
    pub output_tokens_details: Value,
    pub total_tokens: usize,
}

/// The answer: one `response`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ResponseObject {
    /// `resp-<hex>`.
    pub id: String,
    /// `response`.
    pub object: String,
    pub created_at: u64,
    /// `in_progress` (stream start), `completed`, or `incomplete` at `max_output_tokens`.
    pub status: String,
    /// `{"reason": "max_output_tokens"}` when incomplete.
    pub incomplete_details: Option<Value>,
    pub error: Option<Value>,
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    /// The answer's message (none when it is calls alone), then its calls.
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    /// The request's (`none` without tools, `auto` by default).
    #[schema(value_type = ResponsesToolChoiceDoc)]
    pub tool_choice: Value,
    /// The request's.
    #[schema(value_type = Vec<FunctionToolDoc>)]
    pub tools: Vec<Value>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// `false`: nothing is kept.
    pub store: bool,
    pub usage: Option<ResponseUsage>,
}
