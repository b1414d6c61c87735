//! One job's token loop: prefill the prompt, then sample and decode one token
//! at a time until `max_tokens`, an end-of-generation token (unless the job
//! ignores them) or a stop string.
//!
//! This is the whole of generation and nothing else: queueing, cancellation
//! requests, timeouts and transport live in the caller, which answers
//! `should_abort` between steps and receives each token through `on_token` the
//! moment it exists.

use std::time::Instant;

use crate::backend::{Backend, BackendError, Checkpoints, Logits, SampleRequest};
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

#[derive(Debug, thiserror::Error)]
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

/// Runs one job to completion on `backend`. The backend's sequence is
/// started here and always ended before returning, also on error.
pub fn generate(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    req: &GenerationRequest,
    observer: &mut dyn GenerationObserver,
) -> Result<GenerationSummary, GenerationError> {
    let capacity = req.prompt_tokens.len() + req.max_tokens;
    let t = Instant::now();
    backend.begin_sequence(capacity)?;
    tracing::debug!(positions = capacity, us = micros(t), "sequence begun");
    let result = run(backend, tokenizer, req, observer);
    let t = Instant::now();
    backend.end_sequence();
    tracing::debug!(us = micros(t), "sequence ended");
    result
}

fn run(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    req: &GenerationRequest,
    observer: &mut dyn GenerationObserver,
) -> Result<GenerationSummary, GenerationError> {
    let started = Instant::now();
    let mut logits = Vec::new();
    let mut checkpoints = observer.wants_parity().then(Checkpoints::default);
    // The backend samples where its logits are; they come to the host only
    // for parity records.
    let wanted = if checkpoints.is_some() {
        Logits::Last
    } else {
        Logits::None
    };

    // Prefill in chunks of the backend's size, checking for an abort between
    // them (M0-W-1610).
    for chunk in req.prompt_tokens.chunks(backend.prefill_chunk()) {
        check_abort(observer)?;
        if let Some(cp) = checkpoints.as_mut() {
            cp.entries.clear();
        }
        backend.forward(chunk, wanted, &mut logits, checkpoints.as_mut())?;
    }
    // Time in the prefill's forward calls: on the GPU the work is queued
    // then, and `sampled_us` below includes its completion.
    let prefill_calls_us = micros(started);

    let mut sampler = Sampler::new(req.sampling.clone());
    let mut stream = StreamDecoder::new();
    let mut stops = StopMatcher::new(req.stop.clone());
    let mut generated: Vec<u32> = Vec::with_capacity(req.max_tokens);
    let mut first_token_ms = 0;
    let mut decode_started = started;
    // Where the device queues its work, the next step is queued before the
    // host streams a token (its text, stop strings and event then overlap the
    // step instead of holding the device idle). Not with parity records,
    // whose logits the next step would overwrite.
    let ahead = backend.queues_work() && checkpoints.is_none();

    let stop_reason = loop {
        let uniform = sampler.draw();
        let sampled = backend.sample(&SampleRequest {
            params: &req.sampling,
            generated: &generated,
            uniform,
            logprobs: req.logprobs,
        })?;
        let id = sampled.id;
        let index = generated.len();
        generated.push(id);
        if index == 0 {
            first_token_ms = req.accepted_at.unwrap_or(started).elapsed().as_millis() as u64;
            decode_started = Instant::now();
            let tokens = req.prompt_tokens.len();
            let sampled_us = micros(started);
            tracing::debug!(tokens, prefill_calls_us, sampled_us, "first token");
        }
        if let Some(cp) = checkpoints.take() {
            observer.on_parity(ParityStep {
                step: index,
                token_id: id,
                checkpoints: cp,
                top_logits: top_logprobs(&logits, 10),
                logits: logits.clone(),
            });
            checkpoints = Some(Checkpoints::default());
        }
        if !req.ignore_eos && tokenizer.is_eog(id) {
            // Unless ignored, the end-of-generation token ends the job and is
            // never streamed. Text still held back at this point (a
            // stop-string prefix, or bytes of an unfinished character) has no
            // token left to travel with and is dropped: see README, "Streaming".
            generated.pop();
            break StopReason::Eos;
        }

        let is_last = generated.len() >= req.max_tokens;
        // Wasted only when a stop string or a gone client ends the job here.
        // Not after the first token, which would wait for the step that
        // captures the decode graph.
        let queued = ahead && index > 0 && !is_last;
        if queued {
            check_abort(observer)?;
            backend.forward(&[id], wanted, &mut logits, None)?;
        }
        let mut piece = stream.push(tokenizer, id);
        if is_last {
            piece.push_str(&stream.finish());
        }
        let (mut text, stopped) = match stops.push(&piece) {
            StopOutcome::Emit(text) => (text, None),
            StopOutcome::Stopped { emit, stop } => (emit, Some(stop)),
        };
        if is_last && stopped.is_none() {
            // The last token carries whatever was held back.
            text.push_str(&stops.finish());
        }
        let logprobs = (req.logprobs > 0).then_some(sampled.logprobs);
        if let Some(reason) = observer.on_token(GeneratedToken {
            index,
            id,
            text,
            logprobs,
        }) {
            return Err(GenerationError::Aborted(reason));
        }
        if let Some(stop) = stopped {
            break StopReason::StopSequence(stop);
        }
        if is_last {
            break StopReason::MaxTokens;
        }

        if !queued {
            check_abort(observer)?;
            backend.forward(&[id], wanted, &mut logits, checkpoints.as_mut())?;
        }
    };

    Ok(GenerationSummary {
        tokens_in: req.prompt_tokens.len(),
        tokens_out: generated.len(),
        first_token_ms,
        decode_time_ms: decode_started.elapsed().as_millis() as u64,
        stop_reason,
    })
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
