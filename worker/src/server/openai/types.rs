//! The OpenAI wire types the worker reads and writes, after OpenAI's API
//! reference (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) and
//! the extension fields llama-server and vLLM accept (`top_k`, `min_p`,
//! `repetition_penalty`, `ignore_eos`). Only what the worker serves is here; a field it
//! cannot honour lands in `other` and is refused by name (see `request.rs`).
//! The tool types are in `tools/types.rs`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

pub use super::tools::types::{ToolCallDelta, ToolCallOut};
use super::tools::types::{ToolChoiceDoc, ToolDef};
use crate::server::validation::ToolCallIn;

/// `stop`: one string or a list of them.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and empty `choices`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM's extension: with `include_usage`, every chunk carries the usage so far.
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// The sampling and length fields both routes share.
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema)]
pub struct SamplingFields {
    /// The id from `GET /v1/models`.
    pub model: String,
    #[schema(minimum = 1, maximum = 2048)]
    pub max_tokens: Option<i64>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Any JSON number: serde's `flatten` cannot hold 128-bit integers, so
    /// the range (0 to 2^64 − 1) is checked by `/execute`'s validation.
    #[schema(value_type = Option<u64>, minimum = 0)]
    pub seed: Option<serde_json::Number>,
    pub stop: Option<StopField>,
    /// Choices, a job each (1 to 16; at most `--queue-depth` plus `--parallel`).
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Extension (llama-server, vLLM): 0 is off.
    #[schema(minimum = 0)]
    pub top_k: Option<i64>,
    /// Extension (llama-server, vLLM).
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f64>,
    /// Extension (llama-server, vLLM): 1 is off.
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub repetition_penalty: Option<f64>,
    /// Lowers a token's logit once it has been generated (0 is off).
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f64>,
    /// Lowers a token's logit for each time it has been generated (0 is off).
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f64>,
    /// Token id (a decimal string) → a bias of -100 to 100 added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Extension (llama-server, vLLM): do not stop at the model's
    /// end-of-sequence tokens, which are then streamed like any other; only
    /// the token limit, a stop string or a disconnect ends the answer.
    pub ignore_eos: Option<bool>,
    /// The answer's form (issue #43): enforced token by token, never hoped for.
    pub response_format: Option<ResponseFormat>,
}

/// `response_format`: plain text, any JSON object, or JSON that a schema
/// validates (`strict` or not, the schema is enforced).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct JsonSchemaFormat {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema; absent: any JSON value.
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// The schema `/execute` enforces for this format (`None`: plain text).
    pub fn schema(self) -> Option<Value> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(serde_json::json!({"type": "object"})),
            ResponseFormat::JsonSchema { json_schema } => {
                Some(json_schema.schema.unwrap_or_else(|| serde_json::json!({})))
            }
        }
    }
}

/// Text content, or a list of parts of which only `text` parts are served.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    /// Only `text`.
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// One chat message as sent.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatMessageIn {
    /// `system`, `developer` (served as `system`), `user`, `assistant` or `tool`.
    pub role: String,
    /// Absent or null only in an assistant message with `tool_calls`.
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// An assistant message's calls (as a reply gave them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message: the id of the call whose result it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning, as a reply gave it (llama-server
    /// and vLLM take it back): the template's `message.reasoning_content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessageIn>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Same as `max_tokens`; `max_tokens` wins when both are given.
    #[schema(minimum = 1, maximum = 2048)]
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    /// The most likely tokens to list at each position (needs `logprobs`).
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// `low`, `medium` or `high`, for the chat template (gpt-oss's harmony
    /// system message); other templates ignore it.
    pub reasoning_effort: Option<String>,
    /// Extension (vLLM, llama-server): variables for the model's chat
    /// template, an object of any JSON values (Qwen3:
    /// `{"enable_thinking": false}`); a key may not be one of the
    /// template's own variables (`messages`, `tools`, ...).
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Value>,
    /// Functions the model may call, described to it by its chat template.
    #[schema(value_type = Option<Vec<ToolDef>>)]
    pub tools: Option<Value>,
    #[schema(value_type = Option<ToolChoiceDoc>)]
    pub tool_choice: Option<Value>,
    /// Whether an answer may hold more than one call (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Every other field: refused by name unless it leaves the answer as is.
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// `prompt`: text, or token ids; a list of them holds exactly one prompt.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// The most likely tokens to list at each position (0 lists only the chosen one's).
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<i64>,
    /// Every other field: refused by name unless it leaves the answer as is.
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// The job's end only: prompt tokens that came from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// OpenAI's `usage.prompt_tokens_details`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache (not computed again).
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// The counts with `cached_tokens` of the prompt's from the prefix cache.
    pub fn with_cached(self, cached_tokens: usize) -> Self {
        Usage {
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
            ..self
        }
    }
}

/// One of the most likely tokens at a position (chat).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token's UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
}

/// The chosen token at a position and the most likely ones (chat).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct TokenLogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// A choice's `logprobs` (chat).
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprobEntry>,
}

/// The assistant's reply.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: String,
    /// Null when the reply is calls only.
    pub content: Option<String>,
    /// The calls the model made (`finish_reason` is then `tool_calls`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
    /// The model's reasoning, as llama-server and vLLM name it: gpt-oss's
    /// analysis channel (`content` is then the final channel alone), or
    /// the text of a think block (Qwen3 and its kind; `content` is then
    /// what follows the block).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` (end of generation or a stop string), `length` (`max_tokens`)
    /// or `tool_calls` (the reply holds calls).
    pub finish_reason: String,
}

/// The answer of a non-streaming `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ChatCompletion {
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// What a chunk adds to the reply.
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Reasoning text (see [`AssistantMessage`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<String>,
}

/// One `data:` chunk of a streaming `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChunkChoice>,
    /// Present (null until the last chunk) when `stream_options.include_usage` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// A choice's `logprobs` (completions): one entry per generated token.
#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// Token text → log-probability, for the most likely tokens at each position.
    pub top_logprobs: Vec<std::collections::BTreeMap<String, f32>>,
    /// Character offset of each token in the completion's text.
    pub text_offset: Vec<usize>,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null in a streaming chunk before the last.
    pub finish_reason: Option<String>,
}

/// The answer of `POST /v1/completions`, and each `data:` chunk of its stream.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct Completion {
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    /// Always present in a non-streaming answer; in a stream, null until the
    /// last chunk when `stream_options.include_usage` is set, else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One entry of `GET /v1/models`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct Model {
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// When the worker started (Unix seconds).
    pub created: u64,
    pub owned_by: String,
}

/// `GET /v1/models`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<Model>,
}

/// `{"error": {...}}`: every error answer of the OpenAI routes, and the
/// `data:` of a stream that fails after it began.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ErrorResponse {
    pub error: ErrorObject,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ErrorObject {
    pub message: String,
    /// `invalid_request_error` (4xx) or `server_error` (5xx).
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// The worker's error code in lower case (`invalid_request`, `queue_full`, ...).
    pub code: Option<String>,
}
