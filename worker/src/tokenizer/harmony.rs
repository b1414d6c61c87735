//! gpt-oss's harmony format: which channel each generated token belongs to.
//!
//! A harmony reply is a sequence of messages, each
//! `<|start|>{role}<|channel|>{name}<|message|>{text}` ended by `<|end|>`,
//! `<|return|>` or `<|call|>`; the chat template's generation prompt ends with
//! `<|start|>assistant`, so the model begins with `<|channel|>`. The
//! `analysis` channel carries the model's reasoning, `final` the answer and
//! `commentary` tool calls. A token of a message's text belongs to its
//! channel (the first word of the name: `commentary to=functions.f` is
//! `commentary`); the structure tokens and the header (role, channel name,
//! `<|constrain|>json`) belong to none.

use std::sync::Arc;

/// The structure tokens' text: `<|start|>`, `<|channel|>`, `<|message|>`,
/// then the three that end a message.
pub const STRUCTURE: [&str; 6] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
];

/// The structure tokens of a harmony vocabulary (`o200k_harmony`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HarmonyIds {
    start: u32,
    channel: u32,
    message: u32,
    ends: [u32; 3],
}

impl HarmonyIds {
    /// The ids, when the vocabulary (each token's text, by id) has every
    /// one of them.
    pub fn of(tokens: &[String]) -> Option<HarmonyIds> {
        let mut ids = [None; 6];
        for (id, text) in (0u32..).zip(tokens) {
            if let Some(i) = STRUCTURE.iter().position(|n| n == text) {
                ids[i].get_or_insert(id);
            }
        }
        let [start, channel, message, end, ret, call] = ids;
        Some(HarmonyIds {
            start: start?,
            channel: channel?,
            message: message?,
            ends: [end?, ret?, call?],
        })
    }
}

#[derive(Clone, Debug)]
enum State {
    /// Role or anything before a channel.
    Header,
    /// After `<|channel|>`: the name so far.
    Naming(String),
    /// After `<|message|>`: the message's channel.
    Body(Arc<str>),
}

/// Follows one reply token by token.
#[derive(Clone, Debug)]
pub struct ChannelTracker {
    ids: HarmonyIds,
    state: State,
}

impl ChannelTracker {
    pub fn new(ids: HarmonyIds) -> Self {
        ChannelTracker {
            ids,
            state: State::Header,
        }
    }

    /// The channel of token `id`, whose own text is `text`; `None` for the
    /// structure tokens and headers.
    pub fn next(&mut self, id: u32, text: &str) -> Option<Arc<str>> {
        let ids = self.ids;
        if id == ids.start || ids.ends.contains(&id) {
            self.state = State::Header;
            return None;
        }
        if id == ids.channel {
            self.state = State::Naming(String::new());
            return None;
        }
        match &mut self.state {
            State::Naming(name) if id == ids.message => {
                let first = name.split_whitespace().next().unwrap_or_default();
                self.state = State::Body(Arc::from(first));
                None
            }
            State::Naming(name) => {
                name.push_str(text);
                None
            }
            State::Body(channel) => Some(channel.clone()),
            State::Header => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDS: HarmonyIds = HarmonyIds {
        start: 1,
        channel: 2,
        message: 3,
        ends: [4, 5, 6],
    };

    /// Runs `(id, text)` through a tracker: each token's channel.
    fn channels(tokens: &[(u32, &str)]) -> Vec<Option<String>> {
        let mut t = ChannelTracker::new(IDS);
        tokens
            .iter()
            .map(|&(id, text)| t.next(id, text).map(|c| c.to_string()))
            .collect()
    }

    #[test]
    fn analysis_then_final() {
        let got = channels(&[
            (2, ""),
            (100, "analysis"),
            (3, ""),
            (101, "Think"),
            (102, " hard"),
            (4, ""),
            (1, ""),
            (103, "assistant"),
            (2, ""),
            (104, "final"),
            (3, ""),
            (105, "Yes"),
            (5, ""),
        ]);
        let a = Some("analysis".to_string());
        let f = Some("final".to_string());
        let want = [
            None,
            None,
            None,
            a.clone(),
            a,
            None,
            None,
            None,
            None,
            None,
            None,
            f,
            None,
        ];
        assert_eq!(got, want);
    }

    /// A tool call's channel name carries its recipient and constraint:
    /// the channel is its first word; a name split over tokens is joined.
    #[test]
    fn commentary_with_a_recipient() {
        let got = channels(&[
            (2, ""),
            (100, "comment"),
            (101, "ary to"),
            (102, "=functions.get"),
            (103, " <|constrain|>json"),
            (3, ""),
            (104, "{\"a\": 1}"),
            (6, ""),
            (105, "after the call"),
        ]);
        assert_eq!(got[6].as_deref(), Some("commentary"));
        assert!(got.iter().enumerate().all(|(i, c)| (i == 6) == c.is_some()));
    }

    /// Text before any channel (a reply that skips the format) has none.
    #[test]
    fn text_outside_a_message_has_no_channel() {
        assert_eq!(channels(&[(100, "Hi"), (101, " there")]), [None, None]);
    }
}
