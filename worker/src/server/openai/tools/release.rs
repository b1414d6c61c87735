//! What a reply's tokens release for its answer, one by one ([`Release`])
//! or all at once ([`Release::whole`]): without tools, the text of each
//! token that goes to the answer's content (a gpt-oss model's analysis
//! channel and structure tokens do not); with them, what the
//! [`CallParser`] releases: content that can no longer turn into a call,
//! and the calls completed. A stream and a whole answer read the same way,
//! so they agree.

use std::sync::Arc;

use super::parse::{CallParser, Released, ToolReply};
use crate::engine::job::TokenOut;
use crate::server::openai::reply::{part_of, Part};
use crate::tokenizer::Tokenizer;

/// Reads one answer's tokens.
pub struct Release {
    tokenizer: Arc<Tokenizer>,
    parser: Option<CallParser>,
}

impl Release {
    /// A reader for a model's answer; `tools` when calls are to be read.
    pub fn new(tokenizer: Arc<Tokenizer>, tools: Option<ToolReply>) -> Self {
        Release {
            tokenizer,
            parser: tools.map(CallParser::new),
        }
    }

    /// What one generated token releases.
    pub fn token(&mut self, t: &TokenOut) -> Released {
        match &mut self.parser {
            Some(parser) => parser.push(&t.text, t.channel.as_deref()),
            None if part_of(&self.tokenizer, t) == Part::Content => Released {
                content: t.text.clone(),
                calls: Vec::new(),
            },
            None => Released::default(),
        }
    }

    /// What is still held at the answer's end.
    pub fn finish(&mut self) -> Released {
        self.parser
            .as_mut()
            .map(CallParser::finish)
            .unwrap_or_default()
    }

    /// A whole answer's content and calls.
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
