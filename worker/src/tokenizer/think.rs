//! Reasoning in a think block: Qwen3 (and DeepSeek-R1, QwQ, SmolLM3 and
//! others of their kind) write their reasoning between `<think>` and
//! `</think>`, then the answer. Qwen3's chat template leaves the block to the
//! model (`<|im_start|>assistant\n`, and the model begins with `<think>`) or,
//! with `enable_thinking` false, writes an empty one into the prompt itself;
//! DeepSeek-R1's and Qwen3-Thinking-2507's end the prompt with `<think>\n`,
//! so the reply starts inside the block and only closes it.
//!
//! A model is of this kind when its vocabulary has both markers as tokens
//! of their own (Qwen3's are added tokens 151667 and 151668). That is
//! decided from the vocabulary, not the chat template, because the ids are
//! unambiguous where text is not: a marker arrives as one token whatever
//! the stream decoder holds back, text that merely spells `<think>` is not
//! one, and a template given with `--chat-template-file`, or none at all (a
//! raw prompt), changes nothing.

use std::sync::Arc;

/// The markers' text.
pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// The channel a think block's tokens are given: harmony's name for the
/// reasoning, so that a client of `/execute` reads both kinds of model alike.
pub const CHANNEL: &str = "analysis";

/// The markers' ids in a vocabulary that has both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinkIds {
    pub open: u32,
    pub close: u32,
}

impl ThinkIds {
    /// The ids, when the vocabulary (each token's text, by id) has both
    /// markers.
    pub fn of(tokens: &[String]) -> Option<ThinkIds> {
        let id = |text: &str| tokens.iter().position(|t| t == text);
        Some(ThinkIds {
            open: u32::try_from(id(OPEN)?).ok()?,
            close: u32::try_from(id(CLOSE)?).ok()?,
        })
    }

    /// The marker's text when `id` is one.
    pub fn marker(&self, id: u32) -> Option<&'static str> {
        match id {
            _ if id == self.open => Some(OPEN),
            _ if id == self.close => Some(CLOSE),
            _ => None,
        }
    }

    /// Whether a reply to `prompt` starts inside a think block: the
    /// prompt's last marker opens one (a template that opens the block for
    /// the model). Qwen3's empty block of `enable_thinking` false is closed.
    pub fn open_after(&self, prompt: &[u32]) -> bool {
        prompt
            .iter()
            .rev()
            .find(|&&id| self.marker(id).is_some())
            .is_some_and(|&id| id == self.open)
    }
}

/// Follows one reply token by token: which tokens are reasoning.
#[derive(Clone, Debug)]
pub struct ThinkTracker {
    ids: ThinkIds,
    inside: bool,
    channel: Arc<str>,
}

impl ThinkTracker {
    /// A tracker for the reply to `prompt` (see [`ThinkIds::open_after`]).
    pub fn new(ids: ThinkIds, prompt: &[u32]) -> Self {
        ThinkTracker {
            ids,
            inside: ids.open_after(prompt),
            channel: Arc::from(CHANNEL),
        }
    }

    /// The channel of token `id`: [`CHANNEL`] inside a think block, none
    /// for the markers themselves and for the answer. A marker opens or
    /// closes a block wherever it comes.
    pub fn next(&mut self, id: u32) -> Option<Arc<str>> {
        if id == self.ids.open {
            self.inside = true;
            return None;
        }
        if id == self.ids.close {
            self.inside = false;
            return None;
        }
        self.inside.then(|| self.channel.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: ThinkIds = ThinkIds { open: 1, close: 2 };

    fn channels(prompt: &[u32], reply: &[u32]) -> Vec<Option<String>> {
        let mut t = ThinkTracker::new(IDS, prompt);
        reply
            .iter()
            .map(|&id| t.next(id).map(|c| c.to_string()))
            .collect()
    }

    #[test]
    fn the_ids_are_found_only_when_both_markers_are_tokens() {
        let vocab = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            ThinkIds::of(&vocab(&["a", "</think>", "<think>"])),
            Some(ThinkIds { open: 2, close: 1 })
        );
        assert_eq!(ThinkIds::of(&vocab(&["a", "<think>", "<think >"])), None);
    }

    /// A block the model opens: its tokens are reasoning, the markers and
    /// the answer after it are not.
    #[test]
    fn a_block_the_model_opens_and_closes() {
        let a = Some(CHANNEL.to_string());
        assert_eq!(
            channels(&[10], &[1, 11, 12, 2, 13]),
            [None, a.clone(), a, None, None]
        );
    }

    /// A prompt that ends inside a block (DeepSeek-R1's template): the
    /// reply is reasoning up to `</think>`; one whose block is closed
    /// (Qwen3 with `enable_thinking` false) starts with the answer.
    #[test]
    fn the_prompt_decides_where_the_reply_starts() {
        let a = Some(CHANNEL.to_string());
        assert_eq!(channels(&[10, 1, 20], &[11, 2, 12]), [a, None, None]);
        assert_eq!(channels(&[10, 1, 20, 2, 20], &[11, 12]), [None, None]);
        assert_eq!(channels(&[], &[11]), [None]);
    }
}
