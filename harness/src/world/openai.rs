//! The OpenAI part of the World: what the last steps over the OpenAI-compatible
//! routes and Anthropic's `/v1/messages` got, kept for the steps that compare
//! them (`steps::openai`, `steps::anthropic`).

/// What the last OpenAI steps got.
#[derive(Debug, Default)]
pub struct OpenAiRuns {
    /// Text, finish reason, completion tokens, per-token logprob entries
    /// (token text, logprob) of the whole answer, and the same of the stream.
    pub whole: Option<Answer>,
    pub streamed: Option<Answer>,
    /// `/execute`'s greedy tokens: (text of the chosen token, logprob).
    pub execute: Vec<(String, f64)>,
    /// `/v1/messages`: the whole answer, and the streamed events as
    /// `(event name, data)`.
    pub message: Option<serde_json::Value>,
    pub message_events: Vec<(String, serde_json::Value)>,
    /// Tool calls (issue 43): the request, and per seed the whole answer's
    /// choice and the stream put together (`steps::tools`).
    pub tool_request: Option<serde_json::Value>,
    pub tool_runs: Vec<ToolRun>,
    /// Several choices of one request (`steps::choices`).
    pub choices: Option<Choices>,
}

/// A chat of `n` choices (issue 43): the whole answer, each choice's
/// stream put together (`{content, finish_reason}` by index), the chunks
/// that carried a usage, the whole one-choice answers with each choice's
/// seed, and how far the whole request moved the prefix cache's hit and
/// miss token counts.
#[derive(Debug, Default, Clone)]
pub struct Choices {
    pub whole: serde_json::Value,
    pub streamed: Vec<serde_json::Value>,
    pub usage_chunks: Vec<serde_json::Value>,
    pub singles: Vec<serde_json::Value>,
    pub cache_counts: (u64, u64),
}

/// One seed's chat with tools, as JSON: the whole answer's first choice,
/// and the stream's `{content, tool_calls: [{name, arguments}], finish_reason}`.
#[derive(Debug, Default, Clone)]
pub struct ToolRun {
    pub seed: u64,
    pub whole: serde_json::Value,
    pub streamed: serde_json::Value,
}

/// One answer as the client read it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Answer {
    pub text: String,
    pub finish_reason: String,
    pub completion_tokens: Option<u32>,
    pub logprobs: Vec<(String, f64)>,
}
