//! What a reply's tokens release for its answer, one by one ([`Release`])
//! or all at once ([`Release::whole`]): the reasoning and the content
//! (`reasoning.rs`: a gpt-oss model's analysis channel, a think block's
//! text; structure tokens and markers go to neither); with tools, the
//! content goes through the [`CallParser`], which releases content that can
//! no longer turn into a call, and the calls completed. A stream and a whole
//! answer read the same way, so they agree.

use std::sync::Arc;

use super::parse::{CallParser, Released, ToolReply};
use crate::engine::job::TokenOut;
use crate::server::openai::reasoning::{part_of, Part, Split};
use crate::tokenizer::Tokenizer;

/// Reads one answer's tokens.
pub struct Release {
    split: Split,
    parser: Option<CallParser>,
    /// gpt-oss: the parser reads every token with its harmony channel (a
    /// call is a message to `functions.NAME`, its header the structure).
    harmony: bool,
}

impl Release {
    /// A reader for a model's answer; `tools` when calls are to be read.
    pub fn new(tokenizer: Arc<Tokenizer>, tools: Option<ToolReply>) -> Self {
        Release {
            harmony: tokenizer.harmony().is_some(),
            split: Split::new(tokenizer),
            parser: tools.map(CallParser::new),
        }
    }

    /// What one generated token releases.
    pub fn token(&mut self, t: &TokenOut) -> Released {
        match &mut self.parser {
            Some(parser) if self.harmony => {
                let mut out = parser.push(&t.text, t.channel.as_deref());
                if part_of(self.split.tokenizer(), t) == Part::Reasoning {
                    out.reasoning = t.text.clone();
                }
                out
            }
            parser => {
                let parts = self.split.token(t);
                let mut out = match parser {
                    Some(parser) if !parts.content.is_empty() => parser.push(&parts.content, None),
                    Some(_) => Released::default(),
                    None => Released {
                        content: parts.content,
                        ..Released::default()
                    },
                };
                out.reasoning = parts.reasoning;
                out
            }
        }
    }

    /// What is still held at the answer's end.
    pub fn finish(&mut self) -> Released {
        self.parser
            .as_mut()
            .map(CallParser::finish)
            .unwrap_or_default()
    }

    /// A whole answer's content, calls and reasoning.
    pub fn whole(
        tokenizer: Arc<Tokenizer>,
        tools: Option<ToolReply>,
        tokens: &[TokenOut],
    ) -> Released {
        let mut reader = Release::new(tokenizer, tools);
        let mut out = Released::default();
        for t in tokens {
            out.extend(reader.token(t));
        }
        out.extend(reader.finish());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::{byte_tokenizer, harmony_byte_tokenizer};
    use crate::server::openai::tools::format::ToolFormat;

    fn tok(index: usize, text: &str, channel: Option<&str>) -> TokenOut {
        TokenOut {
            index,
            id: 1,
            text: text.into(),
            logprobs: None,
            channel: channel.map(Into::into),
        }
    }

    fn hermes() -> ToolReply {
        ToolReply {
            format: ToolFormat::Hermes,
            parallel: true,
            names: vec!["now".into()],
        }
    }

    #[test]
    fn without_tools_content_is_the_content_channel_s_text() {
        let tokens = [tok(0, "Hm", Some("analysis")), tok(1, "Yes", Some("final"))];
        let plain = Release::whole(byte_tokenizer(), None, &tokens);
        assert_eq!(plain.content, "HmYes");
        let harmony = Release::whole(harmony_byte_tokenizer(), None, &tokens);
        assert_eq!((harmony.content.as_str(), harmony.calls.len()), ("Yes", 0));
    }

    #[test]
    fn with_tools_a_stream_and_the_whole_answer_agree() {
        let tokens = [
            tok(0, "On it. <tool_", None),
            tok(1, "call>\n{\"name\": \"now\", \"arguments\": {}}", None),
            tok(2, "\n</tool_call>", None),
        ];
        let whole = Release::whole(byte_tokenizer(), Some(hermes()), &tokens);
        assert_eq!(whole.content, "On it.");
        assert_eq!(
            (
                whole.calls[0].name.as_str(),
                whole.calls[0].arguments.as_str()
            ),
            ("now", "{}")
        );
        let mut reader = Release::new(byte_tokenizer(), Some(hermes()));
        let first = reader.token(&tokens[0]);
        assert_eq!(first.content, "On it.", "the possible call start is held");
        assert!(reader.token(&tokens[1]).calls.is_empty());
        assert_eq!(reader.token(&tokens[2]).calls.len(), 1);
        assert_eq!(reader.finish(), Released::default());
    }
}
