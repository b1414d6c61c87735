//! What both OpenAI routes build their answers from: the reply's identity
//! (`id`, `created`, `model`), `finish_reason`, `usage`, each token's
//! log-probabilities, and a whole job collected for a non-streaming answer.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::request::ReplyShape;
use super::tools::parse::ToolReply;
use super::types::{TokenLogprobEntry, TopLogprob, Usage};
use crate::engine::generate::{GenerationSummary, StopReason};
use crate::engine::job::{JobEvent, TokenOut};
use crate::engine::JobError;
use crate::tokenizer::Tokenizer;

/// The log-probability reported for a chosen token outside the engine's
/// list of the most likely ones: the value OpenAI itself reports for tokens
/// of negligible probability.
pub const UNLISTED_LOGPROB: f32 = -9999.0;

/// `system_fingerprint`: the build that answered.
pub const SYSTEM_FINGERPRINT: &str = concat!("worker-orcd-", env!("CARGO_PKG_VERSION"));

/// One reply's fixed facts.
#[derive(Clone)]
pub struct ReplyCtx {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub shape: ReplyShape,
    pub prompt_tokens: usize,
    pub tokenizer: Arc<Tokenizer>,
    /// How to read calls from a chat answer (tools given, `tool_choice` not `none`).
    pub tools: Option<ToolReply>,
    /// The choice a stream's chunks are for (their `index`; `n` > 1 streams
    /// each choice with a context of its own).
    pub choice: u32,
}

impl ReplyCtx {
    pub fn usage(&self, summary: &GenerationSummary) -> Usage {
        self.usage_of(std::slice::from_ref(summary))
    }

    /// The usage of a request's choices: the prompt once, every choice's
    /// tokens, and as cached the fewest any choice found cached (choices
    /// posted together compute their prompt once: one finds none cached,
    /// the others attach what it computed).
    pub fn usage_of(&self, summaries: &[GenerationSummary]) -> Usage {
        let out = summaries.iter().map(|s| s.tokens_out).sum();
        let cached = summaries.iter().map(|s| s.tokens_cached).min();
        Usage::new(self.prompt_tokens, out).with_cached(cached.unwrap_or(0))
    }

    /// A chunk's `usage` after `tokens` generated tokens: absent unless asked
    /// for; with vLLM's `continuous_usage_stats` the count so far, else null.
    pub fn chunk_usage(&self, tokens: usize) -> Option<Option<Usage>> {
        let so_far = Usage::new(self.prompt_tokens, tokens);
        self.shape
            .include_usage
            .then_some(self.shape.continuous_usage.then_some(so_far))
    }

    /// The token's bytes and their text (a token may hold part of a
    /// character: the text then has U+FFFD where the bytes are cut).
    pub fn token_text(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_bytes(id).unwrap_or_default().to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// The chosen token's log-probability and the `top_logprobs` most likely
    /// tokens, from the engine's list.
    pub fn logprob_entry(&self, token: &TokenOut) -> TokenLogprobEntry {
        let listed = token.logprobs.as_deref().unwrap_or_default();
        let logprob = listed
            .iter()
            .find(|alt| alt.id == token.id)
            .map_or(UNLISTED_LOGPROB, |alt| alt.logprob);
        let (text, bytes) = self.token_text(token.id);
        let top_logprobs = listed
            .iter()
            .take(self.shape.top_logprobs)
            .map(|alt| {
                let (token, bytes) = self.token_text(alt.id);
                TopLogprob {
                    token,
                    logprob: alt.logprob,
                    bytes,
                }
            })
            .collect();
        TokenLogprobEntry {
            token: text,
            logprob,
            bytes,
            top_logprobs,
        }
    }
}

/// `stop` for an end-of-generation token or a stop string, `length` for
/// `max_tokens` (a chat reply that holds calls says `tool_calls` instead).
pub fn finish_reason(summary: &GenerationSummary) -> &'static str {
    match summary.stop_reason {
        StopReason::MaxTokens => "length",
        StopReason::Eos | StopReason::StopSequence(_) => "stop",
    }
}

/// A job that ran to its end.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub tokens: Vec<TokenOut>,
    pub summary: Option<GenerationSummary>,
}

impl Collected {
    /// Each collected choice's summary (a collected job always has one).
    pub fn summaries(choices: &[Collected]) -> Vec<GenerationSummary> {
        choices
            .iter()
            .map(|c| c.summary.clone().expect("a collected job has its summary"))
            .collect()
    }

    pub fn text(&self) -> String {
        self.tokens.iter().map(|t| t.text.as_str()).collect()
    }
}

/// Reads a job's events to its end; its `error` event becomes the answer.
/// Dropping this future (the client went away) drops the stream, which
/// cancels the job as it does for `/execute`.
pub async fn collect(mut events: UnboundedReceiver<JobEvent>) -> Result<Collected, JobError> {
    let mut out = Collected::default();
    while let Some(event) = events.recv().await {
        match event {
            JobEvent::Started(_) => {}
            JobEvent::Token(t) => out.tokens.push(t),
            JobEvent::End(s) => {
                out.summary = Some(s);
                return Ok(out);
            }
            JobEvent::Error(e) => return Err(e),
        }
    }
    Err(JobError::internal(
        "the job's stream ended without a result",
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::job::{JobStarted, TokenAlternative};
    use crate::engine::testing::byte_tokenizer;

    /// A job's start, as every reply's stream sees it first.
    pub fn started() -> JobEvent {
        JobEvent::Started(JobStarted {
            job_id: "x-1".into(),
            model: "smol".into(),
            started_at: chrono::Utc::now(),
            seed: 1,
        })
    }

    pub fn ctx(logprobs: bool, top: usize, include_usage: bool) -> ReplyCtx {
        ReplyCtx {
            id: "x-1".into(),
            created: 1_700_000_000,
            model: "smol".into(),
            shape: ReplyShape {
                stream: true,
                include_usage,
                continuous_usage: false,
                logprobs,
                top_logprobs: top,
                choices: 1,
            },
            prompt_tokens: 5,
            tokenizer: byte_tokenizer(),
            tools: None,
            choice: 0,
        }
    }

    pub fn token(index: usize, ch: u8, listed: &[(u8, f32)]) -> TokenOut {
        TokenOut {
            index,
            id: ch as u32,
            text: (ch as char).to_string(),
            logprobs: Some(
                listed
                    .iter()
                    .map(|&(c, logprob)| TokenAlternative {
                        id: c as u32,
                        text: (c as char).to_string(),
                        logprob,
                    })
                    .collect(),
            ),
            channel: None,
        }
    }

    #[test]
    fn the_chosen_logprob_comes_from_the_list_or_is_unlisted() {
        let c = ctx(true, 1, false);
        let e = c.logprob_entry(&token(0, b'b', &[(b'a', -0.1), (b'b', -2.5)]));
        assert_eq!(
            (e.token.as_str(), e.logprob, e.bytes.as_slice()),
            ("b", -2.5, &b"b"[..])
        );
        assert_eq!(e.top_logprobs.len(), 1);
        assert_eq!(e.top_logprobs[0].token, "a");
        let e = c.logprob_entry(&token(0, b'z', &[(b'a', -0.1)]));
        assert_eq!(e.logprob, UNLISTED_LOGPROB);
    }

    /// A finished job's summary: 5 tokens in, 2 out.
    pub fn summary(stop_reason: StopReason) -> GenerationSummary {
        GenerationSummary {
            tokens_in: 5,
            tokens_cached: 0,
            tokens_out: 2,
            first_token_ms: 1,
            decode_time_ms: 2,
            stop_reason,
        }
    }

    #[test]
    fn finish_reasons() {
        let mut s = summary(StopReason::MaxTokens);
        assert_eq!(finish_reason(&s), "length");
        s.stop_reason = StopReason::Eos;
        assert_eq!(finish_reason(&s), "stop");
        s.stop_reason = StopReason::StopSequence("\n".into());
        assert_eq!(finish_reason(&s), "stop");
    }
}
