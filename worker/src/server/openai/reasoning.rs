//! An answer's text split into reasoning and content, token by token, as
//! llama-server and vLLM report it (`reasoning_content` beside `content`).
//!
//! gpt-oss: the analysis channel is reasoning, the final and commentary
//! channels content, the harmony structure tokens neither. A model that
//! reasons in a think block (`tokenizer/think.rs`: Qwen3 and its kind): the
//! block's text is reasoning, the markers neither, the rest content, trimmed
//! as llama.cpp's reasoning parser (`common/chat-parser.cpp`,
//! `try_parse_reasoning`) trims it: the reasoning without white space at
//! either end, the content after a block without white space at its start.
//! A block never closed (the answer hit its token limit) is reasoning to the
//! end. Any other model's text is all content, as it comes.

use std::sync::Arc;

use crate::engine::job::TokenOut;
use crate::tokenizer::think::ThinkIds;
use crate::tokenizer::Tokenizer;

/// Where a token's text goes in a chat answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Content,
    Reasoning,
    /// A harmony structure token or header, or a think block's marker.
    Neither,
}

/// Where token `token`'s text goes, from the channel the engine gave it
/// (see [`Split`] for the trimming that follows).
pub fn part_of(tokenizer: &Tokenizer, token: &TokenOut) -> Part {
    if tokenizer.harmony().is_some() {
        return match token.channel.as_deref() {
            Some("analysis") => Part::Reasoning,
            Some(_) => Part::Content,
            None => Part::Neither,
        };
    }
    match tokenizer.think() {
        Some(ids) if ids.marker(token.id).is_some() => Part::Neither,
        Some(_) if token.channel.is_some() => Part::Reasoning,
        _ => Part::Content,
    }
}

/// What one token releases of each part.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

/// Reads one answer's tokens (see the module's docs).
#[derive(Clone, Debug)]
pub struct Split {
    tokenizer: Arc<Tokenizer>,
    /// The markers, for a think model only (its text is trimmed).
    think: Option<ThinkIds>,
    /// The part of the text before the next marker.
    last: Part,
    /// The reasoning's white space at its end so far: sent once more
    /// reasoning follows it, dropped when the block ends.
    held: String,
    /// The reasoning's white space at a block's start is dropped.
    trim_reasoning: bool,
    /// The content's white space after a block is dropped.
    trim_content: bool,
}

impl Split {
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let think = tokenizer.harmony().is_none().then(|| tokenizer.think());
        Split {
            tokenizer,
            think: think.flatten(),
            last: Part::Content,
            held: String::new(),
            trim_reasoning: true,
            trim_content: false,
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// What token `t` releases.
    pub fn token(&mut self, t: &TokenOut) -> Parts {
        let part = part_of(&self.tokenizer, t);
        let mut out = Parts::default();
        let Some(marker) = self.think.and_then(|ids| ids.marker(t.id)) else {
            self.push(part, &t.text, &mut out);
            self.last = part;
            return out;
        };
        // A marker's released text may begin with text the engine held back
        // before it (the start of a possible stop string): that text is the
        // part before the marker's.
        let (before, after) = match t.text.rfind(marker) {
            Some(at) => (&t.text[..at], &t.text[at + marker.len()..]),
            None => (t.text.as_str(), ""),
        };
        self.push(self.last, before, &mut out);
        self.held.clear();
        if marker == crate::tokenizer::think::OPEN {
            self.trim_reasoning = true;
            self.last = Part::Reasoning;
        } else {
            self.trim_content = true;
            self.last = Part::Content;
        }
        self.push(self.last, after, &mut out);
        out
    }

    fn push(&mut self, part: Part, text: &str, out: &mut Parts) {
        if self.think.is_none() {
            match part {
                Part::Content => out.content.push_str(text),
                Part::Reasoning => out.reasoning.push_str(text),
                Part::Neither => {}
            }
            return;
        }
        match part {
            Part::Content => {
                let text = trim_start_if(&mut self.trim_content, text);
                out.content.push_str(text);
            }
            Part::Reasoning => {
                let text = trim_start_if(&mut self.trim_reasoning, text);
                self.held.push_str(text);
                let end = self.held.trim_end().len();
                out.reasoning.push_str(&self.held[..end]);
                self.held.drain(..end);
            }
            Part::Neither => {}
        }
    }
}

/// `text` without its leading white space while `trim` is set; `trim` is
/// cleared by the first text that is not white space.
fn trim_start_if<'a>(trim: &mut bool, text: &'a str) -> &'a str {
    if !*trim {
        return text;
    }
    let text = text.trim_start();
    *trim = text.is_empty();
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::think_token as tok;
    use crate::engine::testing::{byte_tokenizer, harmony_byte_tokenizer, think_byte_tokenizer};
    use crate::engine::testing::{THINK_CLOSE_ID, THINK_OPEN_ID};

    /// `(id, text, inside)` through a [`Split`] of the think tokenizer: each
    /// token's parts, and the whole answer's.
    fn split(tokens: &[(u32, &str, bool)]) -> (Vec<Parts>, Parts) {
        let mut s = Split::new(think_byte_tokenizer());
        let each: Vec<Parts> = tokens
            .iter()
            .enumerate()
            .map(|(i, &(id, text, inside))| s.token(&tok(i, id, text, inside)))
            .collect();
        let whole = Parts {
            reasoning: each.iter().map(|p| p.reasoning.as_str()).collect(),
            content: each.iter().map(|p| p.content.as_str()).collect(),
        };
        (each, whole)
    }

    const O: u32 = THINK_OPEN_ID;
    const C: u32 = THINK_CLOSE_ID;
    /// Any token that is not a marker (the split reads ids of markers only).
    const T: u32 = b'x' as u32;

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    /// Qwen3 thinking: `<think>\nreasoning\n</think>\n\nanswer`, the
    /// white space inside the block and after it trimmed, each token's text
    /// sent as soon as it is known not to be the reasoning's end.
    #[test]
    fn a_think_block_then_the_answer() {
        let (each, whole) = split(&[
            (O, "<think>", false),
            (T, "\n", true),
            (T, "Hm,", true),
            (T, " two", true),
            (T, "\n", true),
            (T, "\n", true),
            (T, "sums", true),
            (T, "\n", true),
            (C, "</think>", false),
            (T, "\n\n", false),
            (T, "Four", false),
            (T, ".\n", false),
        ]);
        assert_eq!(whole, parts("Hm, two\n\nsums", "Four.\n"));
        let reasoning: Vec<&str> = each.iter().map(|p| p.reasoning.as_str()).collect();
        assert_eq!(
            reasoning,
            ["", "", "Hm,", " two", "", "", "\n\nsums", "", "", "", "", ""]
        );
        assert_eq!(each[10], parts("", "Four"));
    }

    /// `max_tokens` inside the block: all of it is reasoning (its trailing
    /// white space never sent), no content.
    #[test]
    fn an_unclosed_block_is_all_reasoning() {
        let (_, whole) = split(&[
            (O, "<think>", false),
            (T, "\nStill", true),
            (T, " going ", true),
        ]);
        assert_eq!(whole, parts("Still going", ""));
    }

    /// Qwen3 with `enable_thinking` false: the template closed an empty
    /// block in the prompt, the reply has no markers and is content as it
    /// comes, white space included.
    #[test]
    fn a_reply_without_markers_is_content() {
        let (_, whole) = split(&[(T, "\nFour", false), (T, ".", false)]);
        assert_eq!(whole, parts("", "\nFour."));
    }

    /// A prompt that opened the block (DeepSeek-R1's template): the reply
    /// is reasoning up to `</think>`.
    #[test]
    fn a_block_the_prompt_opened() {
        let (_, whole) = split(&[
            (T, "\nSo", true),
            (C, "</think>", false),
            (T, "\n\nYes", false),
        ]);
        assert_eq!(whole, parts("So", "Yes"));
    }

    /// Text the engine held back (a possible stop string) comes with the
    /// marker's token: it is the part before the marker's.
    #[test]
    fn text_released_with_a_marker_keeps_its_part() {
        let (_, whole) = split(&[
            (O, "<think>", false),
            (T, "a", true),
            (T, "", true),
            (C, " b</think>", false),
            (T, "c", false),
        ]);
        assert_eq!(whole, parts("a b", "c"));
    }

    /// gpt-oss's channels: as they come, nothing trimmed; another model's
    /// text is all content, `<think>` in it included.
    #[test]
    fn harmony_and_plain_models_are_not_trimmed() {
        let harmony = |text: &str, channel: Option<&str>| TokenOut {
            channel: channel.map(Into::into),
            ..tok(0, T, text, false)
        };
        let mut s = Split::new(harmony_byte_tokenizer());
        assert_eq!(
            s.token(&harmony(" Hm ", Some("analysis"))),
            parts(" Hm ", "")
        );
        assert_eq!(s.token(&harmony("final", None)), Parts::default());
        assert_eq!(s.token(&harmony(" Yes", Some("final"))), parts("", " Yes"));
        let mut s = Split::new(byte_tokenizer());
        assert_eq!(
            s.token(&tok(0, T, "<think>\n", true)),
            parts("", "<think>\n")
        );
    }
}
