//! OpenAI tool calls on `POST /v1/chat/completions` (issue 43).
//!
//! * [`spec`]: `tools`, `tool_choice` and `parallel_tool_calls` checked,
//!   each refusal an OpenAI 400 naming its field; the definitions go to the
//!   chat template as given (transformers passes the same dicts).
//! * [`format`]: the format the model writes calls in, told by its
//!   vocabulary (gpt-oss's harmony) and by what its template does with a
//!   probe tool: Qwen2.5's `<tool_call>` (Hermes), Llama 3.1's JSON; a
//!   template that ignores tools gets them the Hermes way (`tokenizer`'s
//!   `chat_tools.rs`), and an unknown format is parsed as Hermes.
//! * [`parse`]: calls out of the generated text (or harmony's tokens), fed
//!   token by token: text that may still turn out to be a call is held back,
//!   so a stream never shows call markup as content, and the whole answer
//!   is the same parser run to the end.
//! * [`grammar`]: for `tool_choice` `required` or a named function, a Lark
//!   grammar (llguidance's dialect) in the model's format that admits
//!   exactly the allowed calls, so that every call parses.
//! * [`types`]: the wire types of definitions and calls.

pub mod format;
pub mod grammar;
pub mod parse;
pub mod spec;
pub mod types;
