//! The engine thread: takes jobs from the queue (one at a time by default,
//! M0-W-1301; up to `--parallel N`), runs them on the backend it owns in
//! `scheduler.rs`'s loop, and streams each token to the job's sink as it is
//! produced.
//!
//! Between steps the engine asks, in this order: was the job cancelled (by its
//! client or by shutdown), has the client gone away, has the job run past the
//! inference timeout (measured from when it starts running, not from when it
//! was queued)? Each ends the job with its own terminal event and outcome.
//! While idle and on `cuda`, the thread checks weight residency every
//! `residency_check` interval (M0-W-1012).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendError, BackendKind};
use crate::engine::channels::Channels;
use crate::engine::error::{ErrorCode, JobError, Phase};
use crate::engine::generate::{
    AbortReason, GeneratedToken, GenerationError, GenerationObserver, GenerationRequest,
    GenerationSummary, ParityStep,
};
use crate::engine::job::{CancelFlag, Job, JobEnd, JobEvent, JobSink, TokenAlternative, TokenOut};
use crate::engine::ledger::{Ledger, Outcome};
use crate::engine::parity::ParitySender;
use crate::engine::queue::{CancelResult, JobQueue, PushError};
use crate::engine::status::{EngineStatus, Problem};
use crate::narrate;
use crate::telemetry::metrics::Metrics;
use crate::tokenizer::Tokenizer;

/// How the engine runs.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Jobs that may wait behind the running one (EXT-003).
    pub queue_depth: usize,
    /// A running job is stopped with `INFERENCE_TIMEOUT` after this long.
    pub inference_timeout: Duration,
    /// Interval of the weight residency check; `None` disables it (always on `cpu`).
    pub residency_check: Option<Duration>,
}

/// What the engine thread takes ownership of.
pub struct EngineParts {
    pub backend: Box<dyn Backend>,
    pub tokenizer: Arc<Tokenizer>,
    pub metrics: Arc<Metrics>,
    pub status: Arc<EngineStatus>,
    pub parity: Option<ParitySender>,
}

/// The running engine. Dropping it without [`Engine::shutdown`] leaves the
/// thread running until the process ends.
pub struct Engine {
    handle: EngineHandle,
    thread: JoinHandle<()>,
}

/// The HTTP side's view of the engine: cheap to clone, never blocks on a job.
#[derive(Clone)]
pub struct EngineHandle {
    queue: Arc<JobQueue>,
    status: Arc<EngineStatus>,
    ledger: Ledger,
}

/// Why a job was not accepted.
#[derive(Debug)]
pub enum SubmitError {
    QueueFull(JobError),
    ShuttingDown(JobError),
    DuplicateId(JobError),
}

impl SubmitError {
    pub fn into_error(self) -> JobError {
        match self {
            SubmitError::QueueFull(e)
            | SubmitError::ShuttingDown(e)
            | SubmitError::DuplicateId(e) => e,
        }
    }

    /// What the refusal is counted as: a duplicate id is the caller's
    /// mistake, a full queue or shutdown a lack of room.
    pub fn outcome(&self) -> Outcome {
        match self {
            SubmitError::DuplicateId(_) => Outcome::Invalid,
            SubmitError::QueueFull(_) | SubmitError::ShuttingDown(_) => Outcome::Rejected,
        }
    }
}

/// Where a cancelled job was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelState {
    Queued,
    Running,
    NotFound,
}

impl Engine {
    /// Starts the engine thread.
    pub fn start(config: EngineConfig, parts: EngineParts) -> std::io::Result<Engine> {
        let queue = Arc::new(JobQueue::new(
            config.queue_depth,
            parts.backend.max_sequences(),
        ));
        let handle = EngineHandle {
            queue: queue.clone(),
            status: parts.status.clone(),
            ledger: Ledger::new(parts.metrics.clone()),
        };
        let backend_kind = parts.backend.device().backend;
        parts.metrics.set_slots(parts.backend.max_sequences());
        if let Some(b) = parts.backend.kv_blocks() {
            parts.metrics.set_kv_blocks(b.total, b.used);
        }
        parts.status.set_prefix_cache(parts.backend.prefix_stats());
        let post_load_vram = parts.backend.memory_use().total();
        parts.status.set_vram_bytes_used(post_load_vram);
        // Looked up once here (passes over the vocabulary), not in a job.
        parts.tokenizer.harmony();
        parts.tokenizer.think();
        let worker = EngineThread {
            config,
            queue,
            backend: parts.backend,
            backend_kind,
            tokenizer: parts.tokenizer,
            metrics: parts.metrics,
            status: parts.status,
            parity: parts.parity,
            post_load_vram,
            lost: None,
        };
        // The first residency check runs before anyone can ask /health.
        if worker.residency_interval().is_some() {
            worker.check_residency();
        }
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .spawn(move || worker.run())?;
        Ok(Engine { handle, thread })
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }

    /// Graceful stop (M0-W-1340): refuses new jobs, ends waiting ones with
    /// `CANCELLED` (retriable), lets the running job finish within `grace`,
    /// then cancels it, and waits for the thread, which frees the backend.
    /// Blocking; returns whether the running job had to be cancelled.
    pub fn shutdown(self, grace: Duration) -> bool {
        for job in self.handle.queue.close() {
            job.finish_unrun(Outcome::Cancelled, JobError::cancelled_by_shutdown());
        }
        let mut cancelled = false;
        if !self.handle.queue.wait_idle(grace) {
            cancelled = true;
            self.handle.queue.cancel_running(AbortReason::ShuttingDown);
        }
        let _ = self.thread.join();
        cancelled
    }
}

impl EngineHandle {
    /// Where every request's end is counted: the server counts its refusals
    /// here and opens each job's sink on it.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Queues an accepted job; the queue counts it as admitted. On refusal
    /// the job's stream is discarded unopened; the caller answers with the
    /// returned error and counts it as [`SubmitError::outcome`].
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        self.submit_all(vec![job])
    }

    /// Queues the accepted jobs of one request together, as
    /// [`EngineHandle::submit`] queues one: all of them, or none.
    pub fn submit_all(&self, jobs: Vec<Job>) -> Result<(), SubmitError> {
        let discard = |jobs: Vec<Box<Job>>| jobs.into_iter().for_each(|j| j.sink.discard());
        match self.queue.push_all(jobs) {
            Ok(()) => Ok(()),
            Err(PushError::Full(jobs)) => {
                discard(jobs);
                Err(SubmitError::QueueFull(JobError::queue_full(
                    self.queue.capacity(),
                )))
            }
            Err(PushError::Closed(jobs)) => {
                discard(jobs);
                Err(SubmitError::ShuttingDown(JobError::shutting_down()))
            }
            Err(PushError::DuplicateId(jobs)) => {
                discard(jobs);
                Err(SubmitError::DuplicateId(JobError::invalid(
                    "job_id: a job with this id is already queued or running",
                )))
            }
        }
    }

    /// Cancels a job by id (M0-W-1330). A queued job is ended here, at once;
    /// a running one is flagged and the engine ends it at its next step.
    pub fn cancel(&self, job_id: &str) -> CancelState {
        match self.queue.cancel(job_id) {
            CancelResult::Queued(job) => {
                job.finish_unrun(Outcome::Cancelled, JobError::cancelled());
                CancelState::Queued
            }
            CancelResult::Running => CancelState::Running,
            CancelResult::NotFound => CancelState::NotFound,
        }
    }

    /// Jobs waiting behind the running one.
    pub fn queue_depth(&self) -> usize {
        self.queue.len()
    }

    pub fn queue_capacity(&self) -> usize {
        self.queue.capacity()
    }

    pub fn busy(&self) -> bool {
        self.queue.is_busy()
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.queue.running()
    }

    /// Jobs that may run at once (`--parallel`).
    pub fn slots(&self) -> usize {
        self.queue.parallel()
    }

    pub fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }

    pub fn status(&self) -> &EngineStatus {
        &self.status
    }
}

pub(super) struct EngineThread {
    config: EngineConfig,
    pub(super) queue: Arc<JobQueue>,
    pub(super) backend: Box<dyn Backend>,
    backend_kind: BackendKind,
    pub(super) tokenizer: Arc<Tokenizer>,
    pub(super) metrics: Arc<Metrics>,
    status: Arc<EngineStatus>,
    parity: Option<ParitySender>,
    post_load_vram: u64,
    /// The error that lost the device (issue #47): once set, every job ends
    /// with it and the thread stops.
    pub(super) lost: Option<BackendError>,
}

/// Closes the queue if the engine thread ends abnormally, so no accepted job
/// waits forever and `/health` says why.
struct ExitGuard {
    queue: Arc<JobQueue>,
    status: Arc<EngineStatus>,
    normal: bool,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if !self.normal {
            self.status
                .set_problem(Problem::Engine, "the engine thread stopped unexpectedly");
            for job in self.queue.close() {
                job.finish_unrun(
                    Outcome::Error,
                    JobError::internal("the engine stopped unexpectedly"),
                );
            }
        }
    }
}

impl EngineThread {
    fn run(mut self) {
        let mut guard = ExitGuard {
            queue: self.queue.clone(),
            status: self.status.clone(),
            normal: false,
        };
        self.run_jobs();
        guard.normal = true;
        // Dropping the backend frees its memory before the thread ends.
        drop(self.backend);
        drop(self.parity);
    }

    /// Residency is checked on `cuda` only: on the CPU the notion does not apply.
    pub(super) fn residency_interval(&self) -> Option<Duration> {
        self.config
            .residency_check
            .filter(|_| self.backend_kind == BackendKind::Cuda)
    }

    fn check_residency(&self) {
        match self.backend.check_residency() {
            Ok(true) => {
                self.status.set_resident(true);
                self.status.clear_problem(Problem::Residency);
            }
            result => {
                let message = match result {
                    Err(e) => e.to_string(),
                    _ => "a weight buffer is not in device memory".to_string(),
                };
                if self.status.resident() || self.status.unhealthy_reason().is_none() {
                    narrate!(error, "error", code = ErrorCode::CudaError.as_str(), message = %message, critical = true);
                }
                self.status.set_resident(false);
                self.status.set_problem(
                    Problem::Residency,
                    format!("weights not resident: {message}"),
                );
            }
        }
    }

    /// The outcome and error of a job stopped early for `reason`.
    pub(super) fn abort_error(&self, reason: AbortReason) -> (Outcome, JobError) {
        match reason {
            AbortReason::Cancelled => (Outcome::Cancelled, JobError::cancelled()),
            AbortReason::ShuttingDown => (Outcome::Cancelled, JobError::cancelled_by_shutdown()),
            AbortReason::Timeout => (
                Outcome::Timeout,
                JobError::timeout(self.config.inference_timeout.as_secs()),
            ),
            AbortReason::Disconnected => (
                Outcome::Disconnected,
                JobError::new(ErrorCode::Cancelled, "the client disconnected"),
            ),
        }
    }

    /// Takes a job the queue gave out: its stream's start is logged and its
    /// observer made, or, when its client is already gone, it ends here.
    pub(super) fn admit(&self, job: Box<Job>) -> Option<(GenerationRequest, Observer)> {
        let Job {
            id,
            mut request,
            accepted_at,
            prompt,
            cancel,
            sink,
        } = *job;
        request.accepted_at = Some(accepted_at);
        if sink.is_closed() {
            self.queue.finish_running(&id);
            sink.finish(JobEnd::failed(
                Outcome::Disconnected,
                JobError::cancelled(),
                0,
            ));
            return None;
        }
        narrate!(
            info,
            "execute_start",
            job_id = %id,
            tokens_in = request.prompt_tokens.len(),
            max_tokens = request.max_tokens,
            prompt_sha256 = %prompt.sha256,
            prompt_chars = prompt.chars,
            seed = request.sampling.seed,
            temperature = request.sampling.temperature as f64,
            stops = request.stop.len(),
            logprobs = request.logprobs,
            queue_ms = accepted_at.elapsed().as_millis() as u64,
            x_deadline = prompt.deadline.as_deref(),
        );
        let started = Instant::now();
        let observer = Observer {
            sink,
            cancel,
            started,
            deadline: started + self.config.inference_timeout,
            tokenizer: self.tokenizer.clone(),
            // gpt-oss, Qwen3: each token event names its channel.
            channels: Channels::of(&self.tokenizer, &request.prompt_tokens),
            metrics: self.metrics.clone(),
            parity: self.parity.clone(),
            job_id: Arc::from(id.as_str()),
            accepted_at,
            last_token: None,
            tokens_sent: 0,
            first_token_ms: 0,
        };
        Some((request, observer))
    }

    /// Sends a job's terminal event, once its sequence is closed, and takes
    /// it out of the queue's running set.
    pub(super) fn end_job(
        &mut self,
        observer: Observer,
        result: Result<GenerationSummary, GenerationError>,
    ) {
        let id = observer.job_id.clone();
        let tokens_out = observer.tokens_sent;
        let run_ms = observer.started.elapsed().as_secs_f64() * 1000.0;
        self.metrics.observe_inference_ms(run_ms);
        let end = match result {
            Ok(summary) => {
                self.metrics
                    .observe_first_token_ms(summary.first_token_ms as f64);
                JobEnd::completed(summary)
            }
            Err(GenerationError::Aborted(reason)) => {
                let (outcome, error) = self.abort_error(reason);
                if outcome == Outcome::Timeout {
                    narrate!(error, "error", job_id = %id, code = error.code.as_str(), message = %error.message);
                }
                let timings = Some((observer.first_token_ms, run_ms as u64));
                JobEnd {
                    timings,
                    ..JobEnd::failed(outcome, error, tokens_out)
                }
            }
            Err(GenerationError::Backend(err)) => {
                let error = JobError::from_backend(&err, self.backend_kind, Phase::Job);
                if let BackendError::OutOfMemory { .. } = err {
                    self.status.set_problem(
                        Problem::Memory,
                        format!("a job ran out of device memory: {err}"),
                    );
                }
                if err.is_device_lost() && self.lost.is_none() {
                    narrate!(error, "error", code = error.code.as_str(), message = %err.to_string(), critical = true);
                    self.status.set_problem(Problem::Device, err.to_string());
                    self.lost = Some(err.clone());
                }
                // A caller bug is the engine's own: its text goes to the log
                // only, the client gets a plain internal error.
                let logged = match &err {
                    BackendError::CallerBug(_) => err.to_string(),
                    _ => error.message.clone(),
                };
                narrate!(error, "error", job_id = %id, code = error.code.as_str(), message = %logged);
                JobEnd::failed(Outcome::Error, error, tokens_out)
            }
            Err(GenerationError::Constraint(err)) => {
                // The request's own constraint: its message is the client's.
                let error = JobError::invalid(err.to_string());
                narrate!(warn, "error", job_id = %id, code = error.code.as_str(), message = %error.message);
                JobEnd::failed(Outcome::Invalid, error, tokens_out)
            }
            Err(GenerationError::Panicked(what)) => {
                let error = JobError::internal("the engine failed while running the job");
                narrate!(error, "error", job_id = %id, code = error.code.as_str(), message = %format!("engine panic: {what}"));
                JobEnd::failed(Outcome::Error, error, tokens_out)
            }
        };
        // Out of the queue's running set and the memory noted first: a
        // client that sees the terminal event finds the slot free, the job
        // id reusable and /health as the job left it (a memory problem
        // cleared once the memory is back).
        self.queue.finish_running(&id);
        self.note_memory();
        observer.sink.finish(end);
    }

    /// Publishes the device memory held now: `/health`'s VRAM and the KV
    /// cache gauge; clears a memory problem once back at the post-load level.
    pub(super) fn note_memory(&self) {
        let memory = self.backend.memory_use();
        // With a paged pool the device holds all of it from start-up; the
        // gauge counts what the open sequences hold.
        match self.backend.kv_blocks() {
            Some(b) => {
                self.metrics.set_kv_blocks(b.total, b.used);
                self.metrics
                    .set_kv_cache_bytes(b.used as u64 * b.block_bytes);
            }
            None => self.metrics.set_kv_cache_bytes(memory.kv_cache),
        }
        let prefix = self.backend.prefix_stats();
        if let Some(p) = prefix {
            self.metrics
                .set_prefix_cache(p.entries, p.bytes + p.logits_bytes, p.evictions);
        }
        self.status.set_prefix_cache(prefix);
        let vram = memory.total();
        self.status.set_vram_bytes_used(vram);
        if vram <= self.post_load_vram {
            self.status.clear_problem(Problem::Memory);
        }
    }
}

/// When an idle engine next checks weight residency.
pub(super) struct IdleClock {
    every: Option<Duration>,
    next: Option<Instant>,
}

impl IdleClock {
    pub(super) fn new(every: Option<Duration>) -> Self {
        IdleClock {
            every,
            next: every.map(|e| Instant::now() + e),
        }
    }

    /// Runs the check when it is due; how long the engine may wait for a job
    /// before the next one (`None`: no checks, wait as long as it takes).
    pub(super) fn wait(&mut self, engine: &EngineThread) -> Option<Duration> {
        if let (Some(every), Some(at)) = (self.every, self.next) {
            if Instant::now() >= at {
                engine.check_residency();
                self.next = Some(Instant::now() + every);
            }
        }
        self.next
            .map(|at| at.saturating_duration_since(Instant::now()))
    }
}

/// The engine's side of one running job.
pub(super) struct Observer {
    pub(super) sink: JobSink,
    cancel: Arc<CancelFlag>,
    /// When the job started running.
    started: Instant,
    deadline: Instant,
    tokenizer: Arc<Tokenizer>,
    channels: Option<Channels>,
    metrics: Arc<Metrics>,
    parity: Option<ParitySender>,
    pub(super) job_id: Arc<str>,
    /// When the job was accepted: the first token's latency counts from here.
    accepted_at: Instant,
    last_token: Option<Instant>,
    tokens_sent: usize,
    first_token_ms: u64,
}

impl GenerationObserver for Observer {
    fn should_abort(&mut self) -> Option<AbortReason> {
        if let Some(reason) = self.cancel.get() {
            return Some(reason);
        }
        if self.sink.is_closed() {
            return Some(AbortReason::Disconnected);
        }
        if Instant::now() >= self.deadline {
            return Some(AbortReason::Timeout);
        }
        None
    }

    fn on_token(&mut self, token: GeneratedToken) -> Option<AbortReason> {
        let logprobs = token.logprobs.map(|list| {
            list.into_iter()
                .map(|lp| TokenAlternative {
                    id: lp.id,
                    text: self.tokenizer.decode(&[lp.id]).unwrap_or_default(),
                    logprob: lp.logprob,
                })
                .collect()
        });
        let channel = self
            .channels
            .as_mut()
            .and_then(|c| c.next(&self.tokenizer, token.id));
        let event = JobEvent::Token(TokenOut {
            index: token.index,
            id: token.id,
            text: token.text,
            logprobs,
            channel,
        });
        if !self.sink.send(event) {
            return Some(AbortReason::Disconnected);
        }
        let now = Instant::now();
        match self.last_token {
            Some(prev) => self
                .metrics
                .observe_inter_token_ms((now - prev).as_secs_f64() * 1000.0),
            None => self.first_token_ms = (now - self.accepted_at).as_millis() as u64,
        }
        self.last_token = Some(now);
        self.tokens_sent += 1;
        self.metrics.token_generated();
        None
    }

    fn wants_parity(&self) -> bool {
        self.parity.is_some()
    }

    fn on_parity(&mut self, record: ParityStep) {
        if let Some(p) = &self.parity {
            p.offer(&self.job_id, record);
        }
    }

    fn on_prompt_cached(&mut self, cached: usize, total: usize) {
        self.metrics.prompt_tokens(cached, total - cached);
    }
}
