//! The wire types of OpenAI tools: definitions as documented (the request
//! holds them as JSON and `spec.rs` checks them, so that each refusal names
//! its field), and calls in answers, whole and streamed.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One entry of `tools`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

/// A function the model may call.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    /// Letters, digits, `_` and `-`; at most 64 characters; unique in `tools`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of the arguments object; absent means any object.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Accepted; the arguments follow `parameters` exactly under
    /// `tool_choice` `required` or a named function (a grammar), and are
    /// the model's own under `auto`.
    pub strict: Option<bool>,
}

/// `tool_choice`: `auto` (the default with tools), `none` (tools are
/// described, no call is parsed), `required` (at least one call), or
/// `{"type": "function", "function": {"name": ...}}` (that call).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ToolChoiceDoc {
    Mode(String),
    Named(NamedChoiceDoc),
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct NamedChoiceDoc {
    /// Only `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunctionDoc,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
pub struct NamedFunctionDoc {
    pub name: String,
}

/// A call in a whole answer's `message.tool_calls`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ToolCallOut {
    /// `call_` and 24 random hexadecimal digits.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionOut,
}

#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct FunctionOut {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A streamed piece of a call: the first of each call carries `id`, `type`,
/// `function.name` and empty `function.arguments`; the next ones add to
/// `function.arguments`.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct ToolCallDelta {
    /// The call's place in the answer's list of calls.
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub function: FunctionDelta,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, ToSchema, PartialEq)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}
