//! How large a request may be: the caps of each route (`/execute`'s
//! M0-W-1300 numbers or the operator's flags; the `/v1` routes bounded by
//! the context, issue 45) and the request body limit.

use super::messages::{DEFAULT_MAX_PROMPT_CHARS, MAX_MESSAGES};
use crate::server::{MAX_BODY_BYTES, MAX_DRAINED_BYTES};

/// `/execute`'s largest `max_tokens` (also its default) unless
/// `--max-tokens-out` says otherwise (M0-W-1300's number).
pub const DEFAULT_MAX_TOKENS_OUT: usize = 2048;
/// Request body bytes allowed a token of context, so that a prompt that
/// fills a long context is not refused for its size alone: 32 bytes hold a
/// token's text even JSON-escaped (about 4 characters a token in English,
/// a `\uXXXX` escape 6 bytes a character).
pub const BODY_BYTES_PER_TOKEN: usize = 32;

/// The route a request came through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Door {
    /// `/execute`, held to M0-W-1300's caps or the operator's flags.
    #[default]
    Execute,
    /// The `/v1` routes (OpenAI's, Anthropic's), which clients size by the
    /// model's context: held to the context only, and to the flags where the
    /// operator set them (issue 45).
    V1,
}

/// How large a request may be beyond what the context allows; `None`: the
/// context alone bounds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Longest `prompt`, or total text of `messages`, in characters.
    pub prompt_chars: Option<usize>,
    /// Largest `max_tokens`, and its default (else what the context leaves).
    pub tokens_out: Option<usize>,
    /// Most entries in `messages` (else no more than the context's tokens:
    /// every message takes at least one).
    pub messages: Option<usize>,
}

impl Caps {
    /// `/execute`'s caps: `--max-prompt-chars` and `--max-tokens-out`, or
    /// M0-W-1300's numbers where the operator set neither.
    pub const fn execute(prompt_chars: Option<usize>, tokens_out: Option<usize>) -> Caps {
        Caps {
            prompt_chars: match prompt_chars {
                Some(n) => Some(n),
                None => Some(DEFAULT_MAX_PROMPT_CHARS),
            },
            tokens_out: match tokens_out {
                Some(n) => Some(n),
                None => Some(DEFAULT_MAX_TOKENS_OUT),
            },
            messages: Some(MAX_MESSAGES),
        }
    }

    /// The `/v1` routes' caps: only the flags the operator set.
    pub const fn v1(prompt_chars: Option<usize>, tokens_out: Option<usize>) -> Caps {
        Caps {
            prompt_chars,
            tokens_out,
            messages: None,
        }
    }
}

/// The worker's side of the limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `--max-tokens-in`: longest prompt in tokens.
    pub max_tokens_in: usize,
    /// What `/execute` allows.
    pub execute: Caps,
    /// What the `/v1` routes allow.
    pub v1: Caps,
    pub vocab_size: usize,
    /// The model's effective context: prompt plus output must fit.
    pub context_length: usize,
}

impl Limits {
    /// The limits of a worker whose operator set no cap: `/execute` at
    /// M0-W-1300's numbers, the `/v1` routes bounded by the context only.
    pub const fn new(max_tokens_in: usize, vocab_size: usize, context_length: usize) -> Limits {
        Limits {
            max_tokens_in,
            execute: Caps::execute(None, None),
            v1: Caps::v1(None, None),
            vocab_size,
            context_length,
        }
    }

    /// The caps a request through `door` is held to.
    pub fn caps(&self, door: Door) -> Caps {
        match door {
            Door::Execute => self.execute,
            Door::V1 => self.v1,
        }
    }

    /// Largest request body: M0's 1 MiB, or room for a prompt that fills
    /// the context at [`BODY_BYTES_PER_TOKEN`] where that is more (at most
    /// half of what is drained of a body too large, so its 413 can still be
    /// read).
    pub fn body_bytes(&self) -> usize {
        let by_context = self.context_length.saturating_mul(BODY_BYTES_PER_TOKEN);
        let most = (MAX_DRAINED_BYTES / 2) as usize;
        by_context.clamp(MAX_BODY_BYTES, most)
    }
}
