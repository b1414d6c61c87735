//! Tool calls (issue 43) on `POST /v1/chat/completions`, and on
//! `/v1/responses` and `/v1/messages`, which read their own shapes of the
//! same things into the same [`spec::ToolSpec`] and write the calls read
//! here ([`parse::ParsedCall`]) in their own shapes.
//!
//! * [`spec`]: `tools`, `tool_choice` and `parallel_tool_calls` checked,
//!   each refusal naming the path of its field; the definitions go to the
//!   chat template in the chat route's shape (transformers passes the same
//!   dicts).
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
//! * [`release`]: what a reply's tokens release, whole or one by one:
//!   content and, with tools, the calls.
//! * [`types`]: the wire types of definitions and calls.

pub mod format;
pub mod grammar;
pub mod parse;
pub mod release;
pub mod spec;
pub mod types;

use crate::server::validation::ExecuteRequest;

use self::format::ToolFormat;
use self::parse::ToolReply;
use self::spec::{Choice, ToolSpec};
use crate::server::error::ApiError;

/// A refusal of the calls' grammar, as the client sees it: it sent `tools`,
/// not a grammar (no front door with tools takes one), so the refusal names
/// `tools`, whose `parameters` could not be enforced.
pub fn refused_as_tools(mut e: ApiError) -> ApiError {
    if let Some(why) = e.error.message.strip_prefix("grammar: ") {
        e.error.message = format!("tools: a tool's parameters {why}");
    }
    e
}

/// Gives the job `spec`'s definitions (for the chat template) and, for
/// `tool_choice` `required` or a named function, the grammar of the calls
/// in `format`, the model's; how to read the answer's calls, none under
/// `none`. Every front door with tools goes through here.
pub fn apply(
    spec: &ToolSpec,
    format: ToolFormat,
    execute: &mut ExecuteRequest,
) -> Option<ToolReply> {
    execute.tools = Some(spec.definitions.clone());
    execute.grammar = grammar::for_choice(spec, format);
    (spec.choice != Choice::None).then(|| ToolReply {
        format,
        parallel: spec.parallel,
        names: spec.functions.iter().map(|f| f.name.clone()).collect(),
    })
}
