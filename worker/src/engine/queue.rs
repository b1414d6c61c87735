//! The bounded FIFO between the HTTP side and the engine thread (EXT-003).
//!
//! `capacity` counts waiting jobs; the running one has left the queue (and
//! while the engine is idle, the job it is about to take counts as running,
//! so depth 2 accepts three jobs that arrive together). One
//! mutex guards the waiting list and the running slot, so a cancel and the
//! engine taking the next job can never both claim the same job: a queued job
//! is either removed by `cancel` (and ended there) or taken by `pop`.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::engine::generate::AbortReason;
use crate::engine::job::{CancelFlag, Job};

pub struct JobQueue {
    state: Mutex<State>,
    /// Signalled when a job arrives or the queue closes.
    arrived: Condvar,
    /// Signalled when the running job finishes.
    finished: Condvar,
    capacity: usize,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Box<Job>>,
    running: Option<Running>,
    closed: bool,
}

struct Running {
    id: String,
    cancel: Arc<CancelFlag>,
}

/// Why a job was not queued; the job comes back so its caller can answer.
pub enum PushError {
    Full(Box<Job>),
    Closed(Box<Job>),
    /// A job with this id is already waiting or running.
    DuplicateId(Box<Job>),
}

/// What the engine gets when it asks for work.
pub enum Pop {
    Job(Box<Job>),
    /// Nothing arrived within the timeout.
    Idle,
    /// The queue is closed and empty: the engine should stop.
    Closed,
}

/// What a cancel request found.
pub enum CancelResult {
    /// The job was waiting; it is out of the queue and the caller ends it.
    Queued(Box<Job>),
    /// The job is running; its flag is set and the engine ends it.
    Running,
    /// No such job waiting or running (unknown, or already finished).
    NotFound,
}

impl JobQueue {
    pub fn new(capacity: usize) -> Self {
        JobQueue {
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            finished: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state torn (every
        // critical section is a few field updates), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues a job behind those already waiting.
    pub fn push(&self, job: Job) -> Result<(), PushError> {
        let job = Box::new(job);
        let mut st = self.lock();
        if st.closed {
            return Err(PushError::Closed(job));
        }
        let duplicate = st.running.as_ref().is_some_and(|r| r.id == job.id)
            || st.waiting.iter().any(|j| j.id == job.id);
        if duplicate {
            return Err(PushError::DuplicateId(job));
        }
        // While nothing runs, the oldest waiting job is about to start and
        // does not take one of the `capacity` places.
        let room = self.capacity + usize::from(st.running.is_none());
        if st.waiting.len() >= room {
            return Err(PushError::Full(job));
        }
        st.waiting.push_back(job);
        drop(st);
        self.arrived.notify_one();
        Ok(())
    }

    /// Takes the oldest waiting job and marks it running. Blocks until a job
    /// arrives, the queue closes, or `timeout` passes.
    pub fn pop(&self, timeout: Option<Duration>) -> Pop {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.lock();
        loop {
            if let Some(job) = st.waiting.pop_front() {
                st.running = Some(Running {
                    id: job.id.clone(),
                    cancel: job.cancel.clone(),
                });
                return Pop::Job(job);
            }
            if st.closed {
                return Pop::Closed;
            }
            st = match deadline {
                None => self.arrived.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Pop::Idle;
                    }
                    self.arrived
                        .wait_timeout(st, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
    }

    /// The engine finished the running job.
    pub fn finish_running(&self) {
        self.lock().running = None;
        self.finished.notify_all();
    }

    /// Cancels a waiting or running job by id.
    pub fn cancel(&self, job_id: &str) -> CancelResult {
        let mut st = self.lock();
        if let Some(pos) = st.waiting.iter().position(|j| j.id == job_id) {
            let job = st.waiting.remove(pos).expect("position is in range");
            return CancelResult::Queued(job);
        }
        match &st.running {
            Some(r) if r.id == job_id => {
                r.cancel.cancel(AbortReason::Cancelled);
                CancelResult::Running
            }
            _ => CancelResult::NotFound,
        }
    }

    /// Refuses new jobs from now on and hands back those still waiting.
    pub fn close(&self) -> Vec<Box<Job>> {
        let mut st = self.lock();
        st.closed = true;
        let drained = st.waiting.drain(..).collect();
        drop(st);
        self.arrived.notify_all();
        drained
    }

    /// Asks the running job, if any, to stop.
    pub fn cancel_running(&self, reason: AbortReason) {
        if let Some(r) = &self.lock().running {
            r.cancel.cancel(reason);
        }
    }

    /// Waits until no job is running, at most `timeout`; true when idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while st.running.is_some() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .finished
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Jobs waiting (not counting the running one).
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_busy(&self) -> bool {
        self.lock().running.is_some()
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::generate::GenerationRequest;
    use crate::engine::job::{JobSink, PromptFacts};
    use crate::sampling::SamplingParams;
    use crate::telemetry::metrics::Metrics;

    fn job(id: &str) -> Job {
        let (sink, rx) = JobSink::channel(id, 1, Arc::new(Metrics::new_for_tests()));
        std::mem::forget(rx);
        Job {
            id: id.into(),
            request: GenerationRequest {
                prompt_tokens: vec![1],
                max_tokens: 1,
                sampling: SamplingParams::default(),
                stop: vec![],
                logprobs: 0,
                ignore_eos: false,
                accepted_at: None,
            },
            accepted_at: Instant::now(),
            prompt: PromptFacts::default(),
            cancel: Arc::new(CancelFlag::default()),
            sink,
        }
    }

    fn popped_id(q: &JobQueue) -> String {
        match q.pop(Some(Duration::from_millis(10))) {
            Pop::Job(j) => {
                let id = j.id.clone();
                j.finish_unrun(
                    crate::engine::job::Outcome::Completed,
                    crate::engine::JobError::cancelled(),
                );
                id
            }
            Pop::Idle => "idle".into(),
            Pop::Closed => "closed".into(),
        }
    }

    #[test]
    fn fifo_with_bounded_capacity() {
        let q = JobQueue::new(2);
        // Idle: the first job is about to run, so three fit.
        assert!(q.push(job("a")).is_ok());
        assert!(q.push(job("b")).is_ok());
        assert!(q.push(job("c")).is_ok());
        assert!(matches!(q.push(job("d")), Err(PushError::Full(_))));
        assert_eq!(q.len(), 3);
        assert_eq!(popped_id(&q), "a");
        assert!(q.is_busy());
        assert_eq!(q.len(), 2);
        assert!(matches!(q.push(job("d")), Err(PushError::Full(_))));
        q.finish_running();
        assert_eq!(popped_id(&q), "b");
        // b runs, c waits: one place is free.
        assert!(q.push(job("d")).is_ok());
        q.finish_running();
        assert_eq!(popped_id(&q), "c");
        q.finish_running();
        assert_eq!(popped_id(&q), "d");
        q.finish_running();
        assert_eq!(popped_id(&q), "idle");
    }

    #[test]
    fn depth_zero_runs_one_job_and_queues_none() {
        let q = JobQueue::new(0);
        assert!(q.push(job("a")).is_ok());
        assert!(matches!(q.push(job("b")), Err(PushError::Full(_))));
        assert_eq!(popped_id(&q), "a");
        assert!(matches!(q.push(job("b")), Err(PushError::Full(_))));
    }

    #[test]
    fn duplicate_ids_are_refused_while_waiting_or_running() {
        let q = JobQueue::new(4);
        assert!(q.push(job("a")).is_ok());
        assert!(matches!(q.push(job("a")), Err(PushError::DuplicateId(_))));
        let Pop::Job(_running) = q.pop(None) else {
            panic!()
        };
        assert!(matches!(q.push(job("a")), Err(PushError::DuplicateId(_))));
        q.finish_running();
        assert!(q.push(job("a")).is_ok());
    }

    #[test]
    fn cancel_finds_queued_and_running_jobs() {
        let q = JobQueue::new(4);
        q.push(job("run")).ok().unwrap();
        q.push(job("wait")).ok().unwrap();
        let Pop::Job(running) = q.pop(None) else {
            panic!()
        };
        assert!(matches!(q.cancel("wait"), CancelResult::Queued(j) if j.id == "wait"));
        assert!(matches!(q.cancel("wait"), CancelResult::NotFound));
        assert!(matches!(q.cancel("run"), CancelResult::Running));
        assert_eq!(running.cancel.get(), Some(AbortReason::Cancelled));
        assert!(matches!(q.cancel("nope"), CancelResult::NotFound));
    }

    #[test]
    fn close_drains_waiting_and_refuses_new_jobs() {
        let q = JobQueue::new(4);
        q.push(job("a")).ok().unwrap();
        q.push(job("b")).ok().unwrap();
        let drained = q.close();
        assert_eq!(drained.len(), 2);
        assert!(matches!(q.push(job("c")), Err(PushError::Closed(_))));
        assert_eq!(popped_id(&q), "closed");
    }

    #[test]
    fn wait_idle_times_out_while_a_job_runs() {
        let q = Arc::new(JobQueue::new(1));
        q.push(job("a")).ok().unwrap();
        let Pop::Job(_j) = q.pop(None) else { panic!() };
        assert!(!q.wait_idle(Duration::from_millis(20)));
        let q2 = q.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q2.finish_running();
        });
        assert!(q.wait_idle(Duration::from_secs(5)));
        t.join().unwrap();
    }
}
