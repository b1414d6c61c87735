//! One job's token loop: prefill the prompt, then sample and decode one token
//! at a time until `max_tokens`, an end-of-generation token (unless the job
//! ignores them) or a stop string.
//!
//! This is the whole of generation and nothing else: queueing, cancellation
//! requests, timeouts and transport live in the caller, which answers
//! `should_abort` between steps and receives each token through `on_token` the
//! moment it exists.

use std::time::Instant;

use crate::backend::{Backend, BackendError, Checkpoints, Logits, SampleRequest, SampledToken};
use crate::engine::stop::{StopMatcher, StopOutcome};
use crate::sampling::{top_logprobs, Sampler, SamplingParams, TokenLogprob};
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
}

/// Runs one job to completion on `backend`, alone. The backend's sequence is
/// started here and always ended before returning, also on error.
pub fn generate(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    req: &GenerationRequest,
    observer: &mut dyn GenerationObserver,
) -> Result<GenerationSummary, GenerationError> {
    let mut gen = Generation::new(req.clone(), observer.wants_parity());
    gen.begin(backend)?;
    let result = run(&mut gen, backend, tokenizer, observer);
    gen.end(backend);
    result
}

fn run(
    gen: &mut Generation,
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    observer: &mut dyn GenerationObserver,
) -> Result<GenerationSummary, GenerationError> {
    // Prefill in chunks of the backend's size, checking for an abort between
    // them (M0-W-1610).
    while gen.prefilling() {
        check_abort(observer)?;
        gen.prefill(backend)?;
    }
    // Where the device queues its work, the next step is queued before the
    // host streams a token (its text, stop strings and event then overlap the
    // step instead of holding the device idle). Not with parity records,
    // whose logits the next step would overwrite.
    let ahead = backend.queues_work() && !gen.records_parity();

    let stop_reason = loop {
        let (sampled, parity) = gen.sample(backend, tokenizer)?;
        if let Some(record) = parity {
            observer.on_parity(record);
        }
        let Sampled::Token(token) = sampled else {
            break StopReason::Eos;
        };
        // Wasted only when a stop string or a gone client ends the job here.
        // Not after the first token, which would wait for the step that
        // captures the decode graph.
        let (id, queued) = (token.id, ahead && token.index > 0 && !token.is_last);
        if queued {
            check_abort(observer)?;
            gen.feed(backend, id)?;
        }
        let (out, stopped) = gen.emit(tokenizer, token);
        if let Some(reason) = observer.on_token(out) {
            return Err(GenerationError::Aborted(reason));
        }
        if let Some(reason) = stopped {
            break reason;
        }
        if !queued {
            check_abort(observer)?;
            gen.feed(backend, id)?;
        }
    };
    Ok(gen.summary(stop_reason))
}

/// A token [`Generation::sample`] chose, before its text is worked out.
#[derive(Clone, Debug)]
pub struct SampledId {
    pub index: usize,
    pub id: u32,
    pub logprobs: Vec<TokenLogprob>,
    /// `max_tokens` is reached with this token: no step follows it.
    pub is_last: bool,
}

/// What [`Generation::sample`] found.
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
/// [`Generation::sample`] a token, [`Generation::emit`] its text and
/// [`Generation::feed`] it back, until a stop. [`generate`] runs it alone;
/// the engine's scheduler interleaves several on a backend's slots.
pub struct Generation {
    req: GenerationRequest,
    started: Instant,
    /// Prompt tokens prefilled so far.
    fed: usize,
    /// Host logits: filled only for parity records.
    logits: Vec<f32>,
    checkpoints: Option<Checkpoints>,
    sampler: Sampler,
    stream: StreamDecoder,
    stops: StopMatcher,
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
            generated: Vec::with_capacity(req.max_tokens),
            req,
            started: now,
            fed: 0,
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

    /// Opens the job's sequence in the backend's current slot.
    pub fn begin(&mut self, backend: &mut dyn Backend) -> Result<(), BackendError> {
        let t = Instant::now();
        backend.begin_sequence(self.capacity())?;
        tracing::debug!(
            positions = self.capacity(),
            us = micros(t),
            "sequence begun"
        );
        self.started = Instant::now();
        Ok(())
    }

    /// Frees the job's sequence (the backend's current slot).
    pub fn end(&mut self, backend: &mut dyn Backend) {
        let t = Instant::now();
        backend.end_sequence();
        tracing::debug!(us = micros(t), "sequence ended");
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

    /// Prefills the next chunk of the prompt (the backend's size).
    pub fn prefill(&mut self, backend: &mut dyn Backend) -> Result<(), BackendError> {
        let end = (self.fed + backend.prefill_chunk()).min(self.req.prompt_tokens.len());
        let wanted = self.wanted();
        if let Some(cp) = self.checkpoints.as_mut() {
            cp.entries.clear();
        }
        let chunk = &self.req.prompt_tokens[self.fed..end];
        backend.forward(chunk, wanted, &mut self.logits, self.checkpoints.as_mut())?;
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

    /// Picks the next token from the latest step's logits, with its parity
    /// record when those are kept.
    pub fn sample(
        &mut self,
        backend: &mut dyn Backend,
        tokenizer: &Tokenizer,
    ) -> Result<(Sampled, Option<ParityStep>), BackendError> {
        let uniform = self.draw();
        let sampled = backend.sample(&self.request(uniform))?;
        Ok(self.accept(sampled, tokenizer))
    }

    /// The next token's draw from the job's generator (`None` when greedy).
    pub fn draw(&mut self) -> Option<f64> {
        self.sampler.draw()
    }

    /// What the backend's sampler is asked for the next token, with `uniform`
    /// from [`Generation::draw`].
    pub fn request(&self, uniform: Option<f64>) -> SampleRequest<'_> {
        SampleRequest {
            params: &self.req.sampling,
            generated: &self.generated,
            uniform,
            logprobs: self.req.logprobs,
        }
    }

    /// Takes the backend's choice for the next token: the token, or the end
    /// of generation, with its parity record when those are kept.
    pub fn accept(
        &mut self,
        sampled: SampledToken,
        tokenizer: &Tokenizer,
    ) -> (Sampled, Option<ParityStep>) {
        let id = sampled.id;
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

    /// Appends the sampled token to the sequence: the step that gives the
    /// next token's logits.
    pub fn feed(&mut self, backend: &mut dyn Backend, id: u32) -> Result<(), BackendError> {
        let wanted = self.wanted();
        backend.forward(&[id], wanted, &mut self.logits, self.checkpoints.as_mut())
    }

    /// The `end` event's figures, once the job stopped for `stop_reason`.
    pub fn summary(&self, stop_reason: StopReason) -> GenerationSummary {
        GenerationSummary {
            tokens_in: self.req.prompt_tokens.len(),
            tokens_out: self.generated.len(),
            first_token_ms: self.first_token_ms,
            decode_time_ms: self.decode_started.elapsed().as_millis() as u64,
            stop_reason,
        }
    }
}

fn check_abort(observer: &mut dyn GenerationObserver) -> Result<(), GenerationError> {
    match observer.should_abort() {
        Some(reason) => Err(GenerationError::Aborted(reason)),
        None => Ok(()),
    }
}

/// Microseconds since `since`, for the timing logs.
fn micros(since: Instant) -> u64 {
    since.elapsed().as_micros() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::{byte_tokenizer, ScriptedBackend, BYTE_VOCAB_SIZE, EOS_ID};

    struct Collect(Vec<GeneratedToken>);

    impl GenerationObserver for Collect {
        fn should_abort(&mut self) -> Option<AbortReason> {
            None
        }
        fn on_token(&mut self, token: GeneratedToken) -> Option<AbortReason> {
            self.0.push(token);
            None
        }
    }

    /// Greedy "hi", then the scripted backend's EOS at every later step.
    fn run_hi(ignore_eos: bool, max_tokens: usize) -> (GenerationSummary, Vec<GeneratedToken>) {
        let mut backend = ScriptedBackend::new(vec![b'h' as u32, b'i' as u32], BYTE_VOCAB_SIZE);
        let req = GenerationRequest {
            prompt_tokens: vec![b'x' as u32],
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop: Vec::new(),
            logprobs: 0,
            ignore_eos,
            accepted_at: None,
        };
        let mut seen = Collect(Vec::new());
        let summary = generate(&mut backend, &byte_tokenizer(), &req, &mut seen).unwrap();
        (summary, seen.0)
    }

    /// The prompt goes to the backend in passes of the backend's size.
    #[test]
    fn the_prompt_is_prefilled_in_the_backends_passes() {
        for (chunk, want) in [(256, vec![256, 256, 88]), (512, vec![512, 88])] {
            let mut backend =
                ScriptedBackend::new(Vec::new(), BYTE_VOCAB_SIZE).with_prefill_chunk(chunk);
            let probe = backend.probe();
            let req = GenerationRequest {
                prompt_tokens: vec![b'x' as u32; 600],
                max_tokens: 1,
                sampling: SamplingParams::default(),
                stop: Vec::new(),
                logprobs: 0,
                ignore_eos: true,
                accepted_at: None,
            };
            generate(
                &mut backend,
                &byte_tokenizer(),
                &req,
                &mut Collect(Vec::new()),
            )
            .unwrap();
            assert_eq!(
                *probe.forward_sizes.lock().unwrap(),
                want,
                "passes of {chunk}"
            );
        }
    }

    /// A backend that queues its work gets each step before the token it
    /// follows is streamed: the same tokens, text and stop, at the cost of
    /// one step where a stop string ends the job.
    #[test]
    fn a_queuing_backend_streams_the_same_tokens() {
        use std::sync::atomic::Ordering;
        let run = |queues: bool, stop: &[&str]| {
            let script = b"hello world".iter().map(|&b| b as u32).collect();
            let mut backend = ScriptedBackend::new(script, BYTE_VOCAB_SIZE).queuing(queues);
            let probe = backend.probe();
            let req = GenerationRequest {
                prompt_tokens: vec![b'x' as u32],
                max_tokens: 8,
                sampling: SamplingParams {
                    temperature: 0.0,
                    ..SamplingParams::default()
                },
                stop: stop.iter().map(|s| s.to_string()).collect(),
                logprobs: 0,
                ignore_eos: false,
                accepted_at: None,
            };
            let mut seen = Collect(Vec::new());
            let summary = generate(&mut backend, &byte_tokenizer(), &req, &mut seen).unwrap();
            let calls = probe.forward_calls.load(Ordering::SeqCst);
            (summary.stop_reason, seen.0, calls)
        };
        for (stop, extra) in [(&[][..], 0), (&["lo w"][..], 1)] {
            let (reason, tokens, calls) = run(false, stop);
            let (q_reason, q_tokens, q_calls) = run(true, stop);
            assert_eq!((&q_reason, &q_tokens), (&reason, &tokens), "stop {stop:?}");
            assert_eq!(q_calls, calls + extra, "stop {stop:?}");
        }
    }

    #[test]
    fn eos_ends_the_job_unless_it_is_ignored() {
        let (summary, tokens) = run_hi(false, 5);
        assert_eq!(summary.stop_reason, StopReason::Eos);
        assert_eq!((summary.tokens_out, tokens.len()), (2, 2));

        let (summary, tokens) = run_hi(true, 5);
        assert_eq!(summary.stop_reason, StopReason::MaxTokens);
        assert_eq!((summary.tokens_out, tokens.len()), (5, 5));
        let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
        assert_eq!(ids, [b'h' as u32, b'i' as u32, EOS_ID, EOS_ID, EOS_ID]);
        // The end-of-sequence token travels with its text, like any control token.
        assert_eq!(tokens[2].text, "<|endoftext|>");
    }
}
