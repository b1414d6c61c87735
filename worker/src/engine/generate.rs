//! One job's generation, step by step ([`Generation`]): its sequence, its
//! prompt prefilled a chunk at a time, then one token at a time sampled,
//! turned into text and fed back until `max_tokens`, an end-of-generation
//! token (unless the job ignores them) or a stop string. The steps of every
//! running job are driven by one loop, `engine::round`.
//!
//! This is the whole of generation and nothing else: queueing, cancellation
//! requests, timeouts and transport live in the caller, which answers
//! `should_abort` between steps and receives each token through `on_token` the
//! moment it exists.

use std::sync::Arc;
use std::time::Instant;

use crate::backend::{
    Backend, BackendError, Checkpoints, Logits, SampleRequest, SampledToken, SeqId,
};
use crate::constraint::{Constraint, ConstraintError, Grammar};
use crate::engine::stop::{StopMatcher, StopOutcome};
use crate::sampling::{top_logprobs, BiasState, LogitBias, Sampler, SamplingParams, TokenLogprob};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A validated job, ready to run.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt_tokens: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// How many top log-probabilities to report with each token (0: none).
    pub logprobs: usize,
    /// Do not stop at end-of-generation tokens: they are streamed like any
    /// other token, and only `max_tokens`, a stop string or an abort ends
    /// the job (vLLM's and llama-server's `ignore_eos`, which load tools use
    /// to get fixed output lengths).
    pub ignore_eos: bool,
    /// When the job was accepted: `first_token_ms` counts from here
    /// (M0-W-1600). `None`: from the start of generation.
    pub accepted_at: Option<Instant>,
    /// What the output must match (issue #43): each token is chosen among
    /// those the grammar allows next, and the job ends when it is complete.
    pub constraint: Option<Arc<Grammar>>,
    /// `logit_bias` and the presence and frequency penalties (issue #43).
    pub bias: LogitBias,
}

impl GenerationRequest {
    /// Positions the job's sequence needs: its prompt and every token it may add.
    pub fn positions(&self) -> usize {
        self.prompt_tokens.len() + self.max_tokens
    }
}

/// One generated token as the client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedToken {
    /// 0-based, consecutive.
    pub index: usize,
    pub id: u32,
    /// Text released with this token: whole UTF-8 characters only, and never
    /// text that may still turn out to be part of a stop string.
    pub text: String,
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// Why generation ended normally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    Eos,
    StopSequence(String),
}

impl StopReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::MaxTokens => "max_tokens",
            StopReason::Eos => "eos",
            StopReason::StopSequence(_) => "stop_sequence",
        }
    }
}

/// What a finished job reports in its `end` event.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationSummary {
    pub tokens_in: usize,
    /// Prompt tokens whose KV came from the prefix cache (not computed).
    pub tokens_cached: usize,
    pub tokens_out: usize,
    pub first_token_ms: u64,
    pub decode_time_ms: u64,
    pub stop_reason: StopReason,
}

/// Why the caller asked generation to stop early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    Cancelled,
    Disconnected,
    Timeout,
    ShuttingDown,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum GenerationError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("generation aborted: {0:?}")]
    Aborted(AbortReason),
    /// The engine panicked while running the job (the panic's message).
    #[error("the engine panicked: {0}")]
    Panicked(String),
    /// The job's constraint could not go on (its work bound, or a token it
    /// does not allow).
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
}

/// One token's parity record (EXT-001): what the backend computed at the step
/// that produced token `step`.
#[derive(Clone, Debug)]
pub struct ParityStep {
    pub step: usize,
    pub token_id: u32,
    pub checkpoints: Checkpoints,
    pub top_logits: Vec<TokenLogprob>,
    pub logits: Vec<f32>,
}

/// The caller's side of a running job.
pub trait GenerationObserver {
    /// Asked before every forward call; `Some` ends the job with that reason.
    fn should_abort(&mut self) -> Option<AbortReason>;
    /// Receives each token as soon as it is sampled. Returning `Some` ends
    /// the job (for example: the client has gone away).
    fn on_token(&mut self, token: GeneratedToken) -> Option<AbortReason>;
    /// Whether parity records are wanted; when true, `on_parity` gets one per token.
    fn wants_parity(&self) -> bool {
        false
    }
    fn on_parity(&mut self, _record: ParityStep) {}
    /// The job's prompt begins with `cached` tokens from the prefix cache,
    /// of `total` (told once, when its first chunk is about to run).
    fn on_prompt_cached(&mut self, _cached: usize, _total: usize) {}
}

impl<T: GenerationObserver + ?Sized> GenerationObserver for &mut T {
    fn should_abort(&mut self) -> Option<AbortReason> {
        (**self).should_abort()
    }
    fn on_token(&mut self, token: GeneratedToken) -> Option<AbortReason> {
        (**self).on_token(token)
    }
    fn wants_parity(&self) -> bool {
        (**self).wants_parity()
    }
    fn on_parity(&mut self, record: ParityStep) {
        (**self).on_parity(record)
    }
    fn on_prompt_cached(&mut self, cached: usize, total: usize) {
        (**self).on_prompt_cached(cached, total)
    }
}

/// A token the backend chose for a job, before its text is worked out.
#[derive(Clone, Debug)]
pub struct SampledId {
    pub index: usize,
    pub id: u32,
    pub logprobs: Vec<TokenLogprob>,
    /// `max_tokens` is reached with this token: no step follows it.
    pub is_last: bool,
}

/// What [`Generation::accept`] made of the backend's choice.
#[derive(Clone, Debug)]
pub enum Sampled {
    /// The next token, to [`Generation::emit`] and (unless it ends the job)
    /// to [`Generation::feed`].
    Token(SampledId),
    /// An end-of-generation token: the job is over and it is not streamed.
    Eos,
}

/// One job's generation, step by step: [`Generation::begin`] its sequence,
/// [`Generation::prefill`] the prompt a chunk at a time, then
/// [`Generation::accept`] the backend's choice of token, [`Generation::emit`]
/// its text and append it (in a batched decode step, or alone with
/// [`Generation::feed`]), until a stop. `engine::round` drives the steps of
/// every running job; [`crate::engine::generate`] runs one alone.
pub struct Generation {
    req: GenerationRequest,
    /// The job's sequence, while open.
    seq: Option<SeqId>,
    /// When the job was made: prompts are prefilled oldest first.
    created: Instant,
    started: Instant,
    /// The prefix cache is still to be asked for the prompt's start.
    attach_pending: bool,
    /// Prompt tokens prefilled so far (attached from the prefix cache included).
    fed: usize,
    /// Prompt tokens attached from the prefix cache.
    cached: usize,
    /// Host logits: filled only for parity records.
    logits: Vec<f32>,
    checkpoints: Option<Checkpoints>,
    sampler: Sampler,
    stream: StreamDecoder,
    stops: StopMatcher,
    constraint: Option<Constraint>,
    /// The token last chosen under the constraint, followed by it in the
    /// next [`Generation::constrain`] (where it runs beside the other jobs'
    /// and the device's step, not between the sample and the next step).
    unfollowed: Option<u32>,
    bias: BiasState,
    generated: Vec<u32>,
    first_token_ms: u64,
    decode_started: Instant,
}

impl Generation {
    /// A job about to start; `parity`: record checkpoints at every step.
    pub fn new(req: GenerationRequest, parity: bool) -> Self {
        let now = Instant::now();
        Generation {
            sampler: Sampler::new(req.sampling.clone()),
            stops: StopMatcher::new(req.stop.clone()),
            constraint: req.constraint.as_deref().map(Constraint::new),
            unfollowed: None,
            bias: BiasState::new(req.bias.clone()),
            generated: Vec::with_capacity(req.max_tokens),
            req,
            seq: None,
            created: now,
            started: now,
            attach_pending: false,
            fed: 0,
            cached: 0,
            logits: Vec::new(),
            checkpoints: parity.then(Checkpoints::default),
            stream: StreamDecoder::new(),
            first_token_ms: 0,
            decode_started: now,
        }
    }

    /// Positions the job's sequence needs: its prompt and every token it may add.
    pub fn capacity(&self) -> usize {
        self.req.positions()
    }

    /// Opens the job's sequence. The prefix cache is asked for the prompt's
    /// start only when its first chunk is about to run
    /// ([`Generation::attach`]), so that a prompt waiting behind another with
    /// the same start finds the chunks that one published meanwhile.
    pub fn begin(&mut self, backend: &mut dyn Backend) -> Result<(), BackendError> {
        let t = Instant::now();
        let seq = backend.open(self.capacity())?;
        self.seq = Some(seq);
        self.attach_pending = true;
        tracing::debug!(
            positions = self.capacity(),
            us = micros(t),
            "sequence begun"
        );
        self.started = Instant::now();
        Ok(())
    }

    /// When the job was made (prompts are prefilled oldest first).
    pub fn created(&self) -> Instant {
        self.created
    }

    /// Attaches the longest cached prefix of the prompt to the open
    /// sequence, once, before its first chunk (none when the job records
    /// parity, which wants every chunk's checkpoints); `Some((cached,
    /// total))` the first time, `None` after.
    pub fn attach(
        &mut self,
        backend: &mut dyn Backend,
    ) -> Result<Option<(usize, usize)>, BackendError> {
        if !std::mem::take(&mut self.attach_pending) {
            return Ok(None);
        }
        if self.checkpoints.is_none() {
            let n = backend.attach_prefix(self.seq()?, &self.req.prompt_tokens)?;
            (self.fed, self.cached) = (n, n);
            tracing::debug!(cached = n, "prefix attached");
        }
        Ok(Some(self.prompt_cached()))
    }

    /// Prompt tokens the next [`Generation::prefill`] computes.
    pub fn next_chunk_len(&self, backend: &dyn Backend) -> usize {
        backend
            .prefill_chunk()
            .min(self.req.prompt_tokens.len() - self.fed)
    }

    /// `(cached, total)` prompt tokens: those attached from the prefix cache
    /// by [`Generation::attach`], of all.
    pub fn prompt_cached(&self) -> (usize, usize) {
        (self.cached, self.req.prompt_tokens.len())
    }

    /// Frees the job's sequence, if open.
    pub fn end(&mut self, backend: &mut dyn Backend) {
        let Some(seq) = self.seq.take() else {
            return;
        };
        let t = Instant::now();
        backend.close(seq);
        tracing::debug!(us = micros(t), "sequence ended");
    }

    /// The job's open sequence.
    pub fn seq(&self) -> Result<SeqId, BackendError> {
        self.seq
            .ok_or_else(|| BackendError::CallerBug("a step of a job with no sequence".into()))
    }

    /// Part of the prompt is still to be prefilled.
    pub fn prefilling(&self) -> bool {
        self.fed < self.req.prompt_tokens.len()
    }

    /// Whether each step records checkpoints (then its decode runs alone).
    pub fn records_parity(&self) -> bool {
        self.checkpoints.is_some()
    }

    /// The logits each forward call asks for: on the host only for parity.
    fn wanted(&self) -> Logits {
        if self.checkpoints.is_some() {
            Logits::Last
        } else {
            Logits::None
        }
    }

    /// Prefills the next chunk of the prompt (the backend's size), the
    /// cached prefix attached first if that is still to do.
    pub fn prefill(&mut self, backend: &mut dyn Backend) -> Result<(), BackendError> {
        self.attach(backend)?;
        if !self.prefilling() {
            return Ok(());
        }
        let end = (self.fed + backend.prefill_chunk()).min(self.req.prompt_tokens.len());
        let wanted = self.wanted();
        if let Some(cp) = self.checkpoints.as_mut() {
            cp.entries.clear();
        }
        let chunk = &self.req.prompt_tokens[self.fed..end];
        let seq = self.seq()?;
        backend.forward(
            seq,
            chunk,
            wanted,
            &mut self.logits,
            self.checkpoints.as_mut(),
        )?;
        self.fed = end;
        if !self.prefilling() {
            // Time in the prefill's forward calls: on the GPU the work is
            // queued then, and the first token's log includes its completion.
            tracing::debug!(
                tokens = end,
                prefill_calls_us = micros(self.started),
                "prefilled"
            );
        }
        Ok(())
    }

    /// The next token's draw from the job's generator (`None` when greedy).
    pub fn draw(&mut self) -> Option<f64> {
        self.sampler.draw()
    }

    /// Whether the job's output is constrained (issue #43).
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Follows the token last chosen and works out the tokens the job's
    /// constraint allows next (before each [`Generation::request`]; nothing
    /// without a constraint). On the GPU this runs while the device computes
    /// the step it is for.
    pub fn constrain(&mut self) -> Result<(), GenerationError> {
        if let Some(c) = self.constraint.as_mut() {
            if let Some(id) = self.unfollowed.take() {
                c.commit(id)?;
            }
            c.mask()?;
        }
        Ok(())
    }

    /// What the backend's sampler is asked for the next token, with `uniform`
    /// from [`Generation::draw`].
    pub fn request(&self, uniform: Option<f64>) -> SampleRequest<'_> {
        SampleRequest {
            params: &self.req.sampling,
            generated: &self.generated,
            uniform,
            logprobs: self.req.logprobs,
            mask: self.constraint.as_ref().map(Constraint::bits),
            bias: self.bias.deltas(),
        }
    }

    /// Takes the backend's choice for the next token: the token, or the end
    /// of generation, with its parity record when those are kept. A
    /// constrained job's grammar follows the token at the next
    /// [`Generation::constrain`]: the token was chosen under its mask.
    pub fn accept(
        &mut self,
        sampled: SampledToken,
        tokenizer: &Tokenizer,
    ) -> (Sampled, Option<ParityStep>) {
        let id = sampled.id;
        if self.constraint.is_some() {
            self.unfollowed = Some(id);
        }
        let index = self.generated.len();
        self.generated.push(id);
        if index == 0 {
            let accepted = self.req.accepted_at.unwrap_or(self.started);
            self.first_token_ms = accepted.elapsed().as_millis() as u64;
            self.decode_started = Instant::now();
            let tokens = self.req.prompt_tokens.len();
            tracing::debug!(tokens, sampled_us = micros(self.started), "first token");
        }
        let parity = self.checkpoints.as_mut().map(|cp| ParityStep {
            step: index,
            token_id: id,
            checkpoints: std::mem::take(cp),
            top_logits: top_logprobs(&self.logits, 10),
            logits: self.logits.clone(),
        });
        if !self.req.ignore_eos && tokenizer.is_eog(id) {
            // Unless ignored, the end-of-generation token ends the job and is
            // never streamed. Text still held back at this point (a
            // stop-string prefix, or bytes of an unfinished character) has no
            // token left to travel with and is dropped: see README, "Streaming".
            self.generated.pop();
            return (Sampled::Eos, parity);
        }
        self.bias.push(id);
        let token = SampledId {
            index,
            id,
            logprobs: sampled.logprobs,
            is_last: self.generated.len() >= self.req.max_tokens,
        };
        (Sampled::Token(token), parity)
    }

    /// The token as the client sees it (the text it releases), and the
    /// reason the job ends with it, if it does.
    pub fn emit(
        &mut self,
        tokenizer: &Tokenizer,
        token: SampledId,
    ) -> (GeneratedToken, Option<StopReason>) {
        let mut piece = self.stream.push(tokenizer, token.id);
        if token.is_last {
            piece.push_str(&self.stream.finish());
        }
        let (mut text, stopped) = match self.stops.push(&piece) {
            StopOutcome::Emit(text) => (text, None),
            StopOutcome::Stopped { emit, stop } => (emit, Some(stop)),
        };
        if token.is_last && stopped.is_none() {
            // The last token carries whatever was held back.
            text.push_str(&self.stops.finish());
        }
        let logprobs = (self.req.logprobs > 0).then_some(token.logprobs);
        let reason = match stopped {
            Some(stop) => Some(StopReason::StopSequence(stop)),
            None if token.is_last => Some(StopReason::MaxTokens),
            None => None,
        };
        let out = GeneratedToken {
            index: token.index,
            id: token.id,
            text,
            logprobs,
        };
        (out, reason)
    }

    /// Appends the sampled token to the sequence alone (not in a batched
    /// step): the step that gives the next token's logits, on the host and
    /// with checkpoints when parity is recorded.
    pub fn feed(&mut self, backend: &mut dyn Backend, id: u32) -> Result<(), BackendError> {
        let wanted = self.wanted();
        let seq = self.seq()?;
        backend.forward(
            seq,
            &[id],
            wanted,
            &mut self.logits,
            self.checkpoints.as_mut(),
        )
    }

    /// The `end` event's figures, once the job stopped for `stop_reason`.
    pub fn summary(&self, stop_reason: StopReason) -> GenerationSummary {
        GenerationSummary {
            tokens_in: self.req.prompt_tokens.len(),
            tokens_cached: self.cached,
            tokens_out: self.generated.len(),
            first_token_ms: self.first_token_ms,
            decode_time_ms: self.decode_started.elapsed().as_millis() as u64,
            stop_reason,
        }
    }
}

/// Microseconds since `since`, for the timing logs.
fn micros(since: Instant) -> u64 {
    since.elapsed().as_micros() as u64
}
