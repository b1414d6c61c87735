//! The channel of each generated token, for models whose replies have
//! them: gpt-oss's harmony channels (`tokenizer/harmony.rs`), or a think
//! block's reasoning (`tokenizer/think.rs`: Qwen3 and its kind, whose
//! reasoning is named `analysis` as harmony's is). Other models' tokens
//! have none.

use std::sync::Arc;

use crate::tokenizer::harmony::ChannelTracker;
use crate::tokenizer::think::ThinkTracker;
use crate::tokenizer::Tokenizer;

/// Follows one reply.
pub(super) enum Channels {
    Harmony(ChannelTracker),
    Think(ThinkTracker),
}

impl Channels {
    /// The tracker of the reply to `prompt`, when the model's replies have
    /// channels (harmony first: its vocabulary is never of the other kind).
    pub(super) fn of(tokenizer: &Tokenizer, prompt: &[u32]) -> Option<Channels> {
        if let Some(ids) = tokenizer.harmony() {
            return Some(Channels::Harmony(ChannelTracker::new(ids)));
        }
        let ids = tokenizer.think()?;
        Some(Channels::Think(ThinkTracker::new(ids, prompt)))
    }

    /// The channel of the next token, `id`.
    pub(super) fn next(&mut self, tokenizer: &Tokenizer, id: u32) -> Option<Arc<str>> {
        match self {
            Channels::Harmony(c) => {
                // The token's own text: the released text may be held back
                // (UTF-8, a possible stop) and come with a later token.
                let own = tokenizer.decode(&[id]).unwrap_or_default();
                c.next(id, &own)
            }
            Channels::Think(t) => t.next(id),
        }
    }
}
