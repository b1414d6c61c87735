//! The engine's one token loop, as rounds over the running jobs: a job alone
//! ([`generate`], `--parallel 1`) is a round of one.
//!
//! One round: a chunk's worth of prompt tokens is prefilled, the oldest
//! prompts first (`prefill_chunks`: a burst of prompts stalls the others'
//! streams by one chunk a round, and each prompt's first token comes once its
//! own chunks are done); every job
//! past its prompt has its next token chosen, all in one `Backend::sample`
//! call; the tokens that do not end their job go back to the backend as one
//! decode step (`Backend::decode`). Where the backend queues that step on the
//! device (`Backend::queues_decode`), it is queued before the tokens' text is
//! worked out and streamed, so the host's work overlaps the device's;
//! otherwise the tokens go out first and the step follows, for the jobs that
//! go on.
//!
//! A job's tokens do not depend on which others share its rounds: each
//! sequence is computed as it would be alone (the backend's promise for
//! `decode`), prompts are cut into the same chunks as alone, and each job
//! draws from its own seeded generator.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::backend::{Backend, SeqId};
use crate::engine::generate::{
    GenerationError, GenerationObserver, GenerationRequest, GenerationSummary, Sampled, SampledId,
    StopReason,
};
use crate::engine::Generation;
use crate::tokenizer::Tokenizer;

/// A running job: its generation and the caller's side of it.
pub struct Member<O> {
    pub gen: Generation,
    pub observer: O,
}

/// What ended in a round: the job's index among the members, and how.
pub type Ended = (usize, Result<GenerationSummary, GenerationError>);

/// What a round did.
pub struct Round {
    pub ended: Vec<Ended>,
    /// Rows of its decode step (0: none ran).
    pub rows: usize,
}

/// Runs one job to completion on `backend`, alone: rounds of one. The job's
/// sequence is opened here and always closed before returning, also on error.
pub fn generate(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    req: &GenerationRequest,
    observer: &mut dyn GenerationObserver,
) -> Result<GenerationSummary, GenerationError> {
    let mut gen = Generation::new(req.clone(), observer.wants_parity());
    gen.begin(backend)?;
    let mut members = [Member { gen, observer }];
    let result = loop {
        if let Some((_, result)) = round(backend, tokenizer, &mut members).ended.pop() {
            break result;
        }
    };
    members[0].gen.end(backend);
    result
}

/// One round over `members` (each with its sequence open); returns those
/// that ended in it, whose sequences the caller closes.
pub fn round<O: GenerationObserver>(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    members: &mut [Member<O>],
) -> Round {
    let mut ended: Vec<Ended> = Vec::new();
    // Between steps: cancelled, client gone, timed out?
    for (i, m) in members.iter_mut().enumerate() {
        if let Some(reason) = m.observer.should_abort() {
            ended.push((i, Err(GenerationError::Aborted(reason))));
        }
    }
    let t0 = Instant::now();
    prefill_chunks(backend, members, &mut ended);
    let t1 = Instant::now();
    let mut sampled = sample(backend, tokenizer, members, &mut ended);
    let t2 = Instant::now();
    // The next step of every job that goes on. Jobs that record parity run
    // theirs alone after streaming, as they would alone.
    let mut step: Vec<(usize, (SeqId, u32))> = Vec::new();
    for (i, t) in &sampled {
        let m = &members[*i];
        if !t.is_last && !m.gen.records_parity() {
            if let Ok(seq) = m.gen.seq() {
                step.push((*i, (seq, t.id)));
            }
        }
    }
    let rows: Vec<(SeqId, u32)> = step.iter().map(|(_, r)| *r).collect();
    // Queued ahead, a stop string found below wastes its row.
    let ahead = !rows.is_empty() && backend.queues_decode(&rows);
    if ahead {
        decode(backend, &step, &mut ended);
        sampled.retain(|(i, _)| !is_gone(&ended, *i));
    }
    let t3 = Instant::now();
    let tokens = sampled.len();
    stream(backend, tokenizer, members, sampled, &mut ended);
    let mut decoded = rows.len();
    if !ahead {
        step.retain(|(i, _)| !is_gone(&ended, *i));
        decoded = step.len();
        decode(backend, &step, &mut ended);
    }
    // Where a round's time goes: the first sample waits for the step
    // before it, queued in the last round.
    tracing::debug!(
        jobs = members.len(),
        tokens,
        rows = decoded,
        ahead,
        prefill_us = (t1 - t0).as_micros() as u64,
        sample_us = (t2 - t1).as_micros() as u64,
        queue_us = (t3 - t2).as_micros() as u64,
        stream_us = t3.elapsed().as_micros() as u64,
        "round"
    );
    Round {
        ended,
        rows: decoded,
    }
}

fn is_gone(ended: &[Ended], i: usize) -> bool {
    ended.iter().any(|(j, _)| *j == i)
}

/// Prompts: a chunk's worth of tokens a round (`Backend::prefill_chunk`),
/// the oldest jobs' next chunks first, as many as fit (several short
/// prompts share a round; the first always runs). A burst of prompts thus
/// holds the running jobs' next tokens back by one chunk a round, not by a
/// chunk of every prompt, and a prompt's first token comes once its own
/// last chunk is done, not everyone's. Chunks are cut as they would be
/// alone, so no job's tokens depend on this order.
fn prefill_chunks<O: GenerationObserver>(
    backend: &mut dyn Backend,
    members: &mut [Member<O>],
    ended: &mut Vec<Ended>,
) {
    let mut order: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].gen.prefilling() && !is_gone(ended, i))
        .collect();
    order.sort_by_key(|&i| members[i].gen.created());
    let budget = backend.prefill_chunk();
    let mut spent = 0;
    for i in order {
        let m = &mut members[i];
        // A prompt that does not fit is not looked up either: it attaches
        // when its turn comes, with what the older prompts published.
        if spent > 0 && spent + m.gen.next_chunk_len(backend) > budget {
            break;
        }
        match guarded(|| Ok(m.gen.attach(backend)?)) {
            Ok(Some((cached, total))) => m.observer.on_prompt_cached(cached, total),
            Ok(None) => {}
            Err(e) => {
                ended.push((i, Err(e)));
                continue;
            }
        }
        if !m.gen.prefilling() {
            // The same prompt again: every position and its logits came
            // from the cache.
            continue;
        }
        spent += m.gen.next_chunk_len(backend);
        if let Err(e) = guarded(|| Ok(m.gen.prefill(backend)?)) {
            ended.push((i, Err(e)));
        }
    }
}

/// Tokens: every job past its prompt has one chosen, all in one call. The
/// jobs an end-of-generation token ends go to `ended`.
fn sample<O: GenerationObserver>(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    members: &mut [Member<O>],
    ended: &mut Vec<Ended>,
) -> Vec<(usize, SampledId)> {
    let mut ready: Vec<usize> = (0..members.len())
        .filter(|&i| !members[i].gen.prefilling() && !is_gone(ended, i))
        .collect();
    for (i, e) in constrain(members, &ready) {
        ready.retain(|&j| j != i);
        ended.push((i, Err(e)));
    }
    let mut sampled = Vec::new();
    if ready.is_empty() {
        return sampled;
    }
    let draws: Vec<Option<f64>> = ready.iter().map(|&i| members[i].gen.draw()).collect();
    let chosen = guarded(|| {
        let mut requests = Vec::with_capacity(ready.len());
        for (&i, &u) in ready.iter().zip(&draws) {
            let gen = &members[i].gen;
            requests.push((gen.seq()?, gen.request(u)));
        }
        Ok(backend.sample(&requests)?)
    });
    match chosen {
        Ok(tokens) => {
            for (&i, token) in ready.iter().zip(tokens) {
                let m = &mut members[i];
                let (drawn, parity) = m.gen.accept(token, tokenizer);
                if let Some(record) = parity {
                    m.observer.on_parity(record);
                }
                match drawn {
                    Sampled::Token(t) => sampled.push((i, t)),
                    Sampled::Eos => ended.push((i, Ok(m.gen.summary(StopReason::Eos)))),
                }
            }
        }
        // The sampling is shared: each of its jobs ends with its error.
        Err(e) => ended.extend(ready.iter().map(|&i| (i, Err(e.clone())))),
    }
    sampled
}

/// The constrained jobs among `ready` follow their last token and compute
/// their masks, one job per thread of rayon's pool (each job's own grammar,
/// so the order does not matter): the device is still computing the step
/// queued in the last round, so this host work overlaps it. Returns the jobs
/// whose constraint failed.
fn constrain<O>(members: &mut [Member<O>], ready: &[usize]) -> Vec<(usize, GenerationError)> {
    use rayon::prelude::*;
    let mut gens: Vec<(usize, &mut Generation)> = members
        .iter_mut()
        .enumerate()
        .filter(|(i, m)| m.gen.is_constrained() && ready.contains(i))
        .map(|(i, m)| (i, &mut m.gen))
        .collect();
    let run = |(i, gen): &mut (usize, &mut Generation)| {
        guarded(|| gen.constrain()).err().map(|e| (*i, e))
    };
    if gens.len() < 2 {
        return gens.iter_mut().filter_map(run).collect();
    }
    gens.par_iter_mut().filter_map(run).collect()
}

/// One decode step of `step`'s rows; on failure each of its jobs ends with
/// the error (the step is shared).
fn decode(backend: &mut dyn Backend, step: &[(usize, (SeqId, u32))], ended: &mut Vec<Ended>) {
    if step.is_empty() {
        return;
    }
    let rows: Vec<(SeqId, u32)> = step.iter().map(|(_, r)| *r).collect();
    if let Err(e) = guarded(|| Ok(backend.decode(&rows)?)) {
        ended.extend(step.iter().map(|(i, _)| (*i, Err(e.clone()))));
    }
}

/// Streams each token; ends the jobs it ends. A job that records parity
/// appends its token alone here.
fn stream<O: GenerationObserver>(
    backend: &mut dyn Backend,
    tokenizer: &Tokenizer,
    members: &mut [Member<O>],
    sampled: Vec<(usize, SampledId)>,
    ended: &mut Vec<Ended>,
) {
    for (i, token) in sampled {
        let m = &mut members[i];
        let id = token.id;
        let (out, stop) = m.gen.emit(tokenizer, token);
        if let Some(reason) = m.observer.on_token(out) {
            ended.push((i, Err(GenerationError::Aborted(reason))));
        } else if let Some(reason) = stop {
            ended.push((i, Ok(m.gen.summary(reason))));
        } else if m.gen.records_parity() {
            if let Err(e) = guarded(|| Ok(m.gen.feed(backend, id)?)) {
                ended.push((i, Err(e)));
            }
        }
    }
}

/// Runs `f`, turning a panic into the error of the job it was for.
pub(crate) fn guarded<T>(
    f: impl FnOnce() -> Result<T, GenerationError>,
) -> Result<T, GenerationError> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(GenerationError::Panicked(panic_message(p))))
}

/// A panic's message, for the log.
pub(crate) fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::generate::{AbortReason, GeneratedToken};
    use crate::engine::testing::{byte_tokenizer, ScriptedBackend, BYTE_VOCAB_SIZE, EOS_ID};
    use crate::sampling::SamplingParams;

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
            constraint: None,
            bias: Default::default(),
        };
        let mut seen = Collect(Vec::new());
        let summary = generate(&mut backend, &byte_tokenizer(), &req, &mut seen).unwrap();
        (summary, seen.0)
    }

    /// One token after a prompt of `len` tokens.
    fn one_token_after(len: usize) -> GenerationRequest {
        GenerationRequest {
            prompt_tokens: vec![b'x' as u32; len],
            max_tokens: 1,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            logprobs: 0,
            ignore_eos: true,
            accepted_at: None,
            constraint: None,
            bias: Default::default(),
        }
    }

    /// The prompt goes to the backend in passes of the backend's size.
    #[test]
    fn the_prompt_is_prefilled_in_the_backends_passes() {
        for (chunk, want) in [(256, vec![256, 256, 88]), (512, vec![512, 88])] {
            let mut backend =
                ScriptedBackend::new(Vec::new(), BYTE_VOCAB_SIZE).with_prefill_chunk(chunk);
            let probe = backend.probe();
            let req = one_token_after(600);
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

    /// A round prefills a chunk's worth of tokens, the oldest prompts first
    /// (short ones sharing a round), so a prompt's first token comes after
    /// its own chunks and the older prompts', not after every prompt's.
    #[test]
    fn prompts_are_prefilled_oldest_first_a_chunk_a_round() {
        let mut backend = ScriptedBackend::new(Vec::new(), BYTE_VOCAB_SIZE)
            .with_prefill_chunk(256)
            .with_slots(3);
        let probe = backend.probe();
        let mut members = [600, 100, 100].map(|len| {
            let mut gen = Generation::new(one_token_after(len), false);
            gen.begin(&mut backend).unwrap();
            Member {
                gen,
                observer: Collect(Vec::new()),
            }
        });
        let mut rounds = Vec::new();
        while members.iter().any(|m| m.observer.0.is_empty()) {
            round(&mut backend, &byte_tokenizer(), &mut members);
            let sizes = std::mem::take(&mut *probe.forward_sizes.lock().unwrap());
            let answered: Vec<bool> = members.iter().map(|m| !m.observer.0.is_empty()).collect();
            rounds.push((sizes, answered));
        }
        assert_eq!(
            rounds,
            [
                (vec![256], vec![false, false, false]),
                (vec![256], vec![false, false, false]),
                (vec![88, 100], vec![true, true, false]),
                (vec![100], vec![true, true, true]),
            ]
        );
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
                constraint: None,
                bias: Default::default(),
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

    /// A constrained job chooses among the tokens its grammar allows (the
    /// script's own choices are not), and ends at the end-of-generation
    /// token once the grammar is complete, whole or in rounds with others.
    #[test]
    fn a_constrained_job_keeps_to_its_grammar_and_ends_where_it_is_complete() {
        use crate::constraint::{Compiler, Spec};
        let tokenizer = byte_tokenizer();
        let compiler = Compiler::new(&tokenizer, BYTE_VOCAB_SIZE).unwrap();
        let grammar = compiler
            .compile(&Spec::Regex("(ab|c)[0-9]{2}".into()))
            .unwrap();
        let request = |temperature: f32, seed: u64| GenerationRequest {
            prompt_tokens: vec![b'x' as u32],
            max_tokens: 10,
            sampling: SamplingParams {
                temperature,
                seed,
                ..SamplingParams::default()
            },
            stop: Vec::new(),
            logprobs: 0,
            ignore_eos: false,
            accepted_at: None,
            constraint: Some(grammar.clone()),
            bias: Default::default(),
        };
        let script: Vec<u32> = b"hello".iter().map(|&b| b as u32).collect();
        let rx = |text: &str| {
            let b = text.as_bytes();
            let digits = |d: &[u8]| d.len() == 2 && d.iter().all(u8::is_ascii_digit);
            (b.starts_with(b"ab") && digits(&b[2..])) || (b.starts_with(b"c") && digits(&b[1..]))
        };
        for (temperature, seed) in [(0.0, 0), (1.0, 7), (1.0, 8)] {
            let mut backend = ScriptedBackend::new(script.clone(), BYTE_VOCAB_SIZE);
            let mut seen = Collect(Vec::new());
            let req = request(temperature, seed);
            let summary = generate(&mut backend, &tokenizer, &req, &mut seen).unwrap();
            let text: String = seen.0.iter().map(|t| t.text.as_str()).collect();
            assert!(rx(&text), "{text:?} at temperature {temperature}");
            assert_eq!(summary.stop_reason, StopReason::Eos, "{text:?}");
            // In a round with an unconstrained job and a twin (two masks, worked
            // out in parallel): the same tokens.
            let mut backend = ScriptedBackend::new(script.clone(), BYTE_VOCAB_SIZE).with_slots(3);
            let jobs = [
                request(temperature, seed),
                run_hi_request(),
                request(temperature, seed),
            ];
            let mut members = jobs.map(|r| {
                let mut gen = Generation::new(r, false);
                gen.begin(&mut backend).unwrap();
                Member {
                    gen,
                    observer: Collect(Vec::new()),
                }
            });
            let mut done = 0;
            while done < 3 {
                done += round(&mut backend, &tokenizer, &mut members).ended.len();
            }
            for m in [&members[0], &members[2]] {
                let shared: String = m.observer.0.iter().map(|t| t.text.as_str()).collect();
                assert_eq!(shared, text);
            }
        }
    }

    fn run_hi_request() -> GenerationRequest {
        GenerationRequest {
            prompt_tokens: vec![b'y' as u32],
            max_tokens: 4,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            logprobs: 0,
            ignore_eos: false,
            accepted_at: None,
            constraint: None,
            bias: Default::default(),
        }
    }
}
