//! The format a model writes tool calls in, told once per model from its
//! vocabulary and from what its chat template makes of a probe tool
//! (`ChatTemplate::tool_probe`).

use crate::tokenizer::Tokenizer;

/// How calls look in a model's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen2.5, Hermes and the fallback: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
    /// one or several (a bare `{"name": ..., "arguments": ...}` answer is read too).
    Hermes,
    /// Llama 3.1: the answer is `{"name": ..., "parameters": {...}}`, maybe
    /// after `<|python_tag|>`, several separated by `;`.
    Llama3Json,
    /// gpt-oss: a message on the commentary channel addressed
    /// `to=functions.NAME`, its text the arguments.
    Harmony,
}

/// The instruction Llama 3.1's template (and 3.2's, 3.3's) writes with tools.
const LLAMA3_MARKER: &str = "{\"name\": function name, \"parameters\": dictionary";

impl ToolFormat {
    /// The format of the model `tokenizer` serves: harmony for a harmony
    /// vocabulary; else the one its template teaches, Hermes when it
    /// teaches none that is known or ignores tools (then the worker writes
    /// them the Hermes way itself).
    pub fn of(tokenizer: &Tokenizer) -> ToolFormat {
        if tokenizer.harmony().is_some() {
            return ToolFormat::Harmony;
        }
        match tokenizer.chat_template().and_then(|t| t.tool_probe()) {
            Some(p) if p.contains("<tool_call>") => ToolFormat::Hermes,
            Some(p) if p.contains(LLAMA3_MARKER) => ToolFormat::Llama3Json,
            _ => ToolFormat::Hermes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::{byte_vocab_spec, harmony_byte_tokenizer};

    pub(crate) fn tokenizer_with(template: &str) -> Tokenizer {
        Tokenizer::from_spec(byte_vocab_spec(Some(template))).unwrap()
    }

    #[test]
    fn each_template_tells_its_format() {
        let qwen = include_str!("../../../tokenizer/testdata/qwen2.5-instruct.jinja");
        let llama = include_str!("../../../tokenizer/testdata/llama3.1-instruct.jinja");
        assert_eq!(ToolFormat::of(&tokenizer_with(qwen)), ToolFormat::Hermes);
        assert_eq!(
            ToolFormat::of(&tokenizer_with(llama)),
            ToolFormat::Llama3Json
        );
        let plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(ToolFormat::of(&tokenizer_with(plain)), ToolFormat::Hermes);
        // A template that writes tools its own unknown way.
        let other = "{% for t in tools %}<fn>{{ t.function.name }}</fn>{% endfor %}{{ messages[0].content }}";
        let t = tokenizer_with(other);
        assert!(t.chat_template().unwrap().tool_probe().is_some());
        assert_eq!(ToolFormat::of(&t), ToolFormat::Hermes);
        assert_eq!(
            ToolFormat::of(&harmony_byte_tokenizer()),
            ToolFormat::Harmony
        );
    }
}
