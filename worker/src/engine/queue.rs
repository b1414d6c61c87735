//! The bounded FIFO between the HTTP side and the engine thread (EXT-003).
//!
//! `capacity` counts waiting jobs; running ones (at most `parallel`) have left
//! the queue, and a free slot counts for the job about to take it: with one
//! slot, depth 2 accepts three jobs that arrive together. One mutex guards the
//! waiting list and the running jobs, so a cancel and the engine taking the
//! next job can never both claim the same job: a queued job is either removed
//! by `cancel` (and ended there) or taken by `pop`.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::engine::generate::AbortReason;
use crate::engine::job::{CancelFlag, Job};

pub struct JobQueue {
    state: Mutex<State>,
    /// Signalled when a job arrives or the queue closes.
    arrived: Condvar,
    /// Signalled when a running job finishes.
    finished: Condvar,
    capacity: usize,
    /// Jobs that may run at once (`--parallel`).
    parallel: usize,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Box<Job>>,
    running: Vec<Running>,
    closed: bool,
}

struct Running {
    id: String,
    cancel: Arc<CancelFlag>,
}

/// Why jobs were not queued; the jobs come back so their caller can answer.
pub enum PushError {
    Full(Vec<Box<Job>>),
    Closed(Vec<Box<Job>>),
    /// A job with one of these ids is already waiting or running, or two
    /// share one.
    DuplicateId(Vec<Box<Job>>),
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
    /// A queue of `capacity` waiting jobs in front of `parallel` slots.
    pub fn new(capacity: usize, parallel: usize) -> Self {
        JobQueue {
            state: Mutex::new(State::default()),
            arrived: Condvar::new(),
            finished: Condvar::new(),
            capacity,
            parallel: parallel.max(1),
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
        self.push_all(vec![job])
    }

    /// Queues `jobs` together behind those already waiting (the choices of
    /// one request): all of them, or none when the queue has no room for
    /// all, is closed, or one of their ids is taken.
    pub fn push_all(&self, jobs: Vec<Job>) -> Result<(), PushError> {
        let jobs: Vec<Box<Job>> = jobs.into_iter().map(Box::new).collect();
        let mut st = self.lock();
        if st.closed {
            return Err(PushError::Closed(jobs));
        }
        let taken = |id: &str| {
            st.running.iter().any(|r| r.id == id) || st.waiting.iter().any(|j| j.id == id)
        };
        let duplicate = jobs
            .iter()
            .enumerate()
            .any(|(i, job)| taken(&job.id) || jobs[..i].iter().any(|j| j.id == job.id));
        if duplicate {
            return Err(PushError::DuplicateId(jobs));
        }
        // The oldest waiting jobs are about to take the free slots and do not
        // take any of the `capacity` places.
        let room = self.capacity + self.parallel.saturating_sub(st.running.len());
        if st.waiting.len() + jobs.len() > room {
            return Err(PushError::Full(jobs));
        }
        let count = jobs.len();
        for job in jobs {
            // Counted while the lock keeps the engine from taking it: a job
            // can never end before it was admitted.
            job.sink.admitted();
            st.waiting.push_back(job);
        }
        drop(st);
        for _ in 0..count {
            self.arrived.notify_one();
        }
        Ok(())
    }

    /// Takes the oldest waiting job and marks it running. Blocks until a job
    /// arrives, the queue closes, or `timeout` passes. The caller has a free
    /// slot: at most `parallel` jobs run at once.
    pub fn pop(&self, timeout: Option<Duration>) -> Pop {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.lock();
        debug_assert!(st.running.len() < self.parallel, "pop without a free slot");
        loop {
            if let Some(job) = st.waiting.pop_front() {
                st.running.push(Running {
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

    /// The engine finished the running job `job_id`.
    pub fn finish_running(&self, job_id: &str) {
        self.lock().running.retain(|r| r.id != job_id);
        self.finished.notify_all();
    }

    /// Cancels a waiting or running job by id.
    pub fn cancel(&self, job_id: &str) -> CancelResult {
        let mut st = self.lock();
        if let Some(pos) = st.waiting.iter().position(|j| j.id == job_id) {
            let job = st.waiting.remove(pos).expect("position is in range");
            return CancelResult::Queued(job);
        }
        match st.running.iter().find(|r| r.id == job_id) {
            Some(r) => {
                r.cancel.cancel(AbortReason::Cancelled);
                CancelResult::Running
            }
            None => CancelResult::NotFound,
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

    /// Asks every running job to stop.
    pub fn cancel_running(&self, reason: AbortReason) {
        for r in &self.lock().running {
            r.cancel.cancel(reason);
        }
    }

    /// Waits until no job is running, at most `timeout`; true when idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while !st.running.is_empty() {
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

    /// Jobs waiting (not counting running ones).
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_busy(&self) -> bool {
        !self.lock().running.is_empty()
    }

    /// Jobs running now.
    pub fn running(&self) -> usize {
        self.lock().running.len()
    }

    /// Jobs that may run at once.
    pub fn parallel(&self) -> usize {
        self.parallel
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
    use crate::engine::ledger::{Ledger, Outcome};
    use crate::sampling::SamplingParams;

    fn job(id: &str) -> Job {
        job_counted_in(id, &Ledger::new_for_tests())
    }

    fn job_counted_in(id: &str, ledger: &Ledger) -> Job {
        let (sink, rx) = JobSink::channel(id, 1, ledger.clone());
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
                constraint: None,
                bias: Default::default(),
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
                j.finish_unrun(Outcome::Completed, crate::engine::JobError::cancelled());
                id
            }
            Pop::Idle => "idle".into(),
            Pop::Closed => "closed".into(),
        }
    }

    #[test]
    fn fifo_with_bounded_capacity() {
        let q = JobQueue::new(2, 1);
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
        q.finish_running("a");
        assert_eq!(popped_id(&q), "b");
        // b runs, c waits: one place is free.
        assert!(q.push(job("d")).is_ok());
        q.finish_running("b");
        assert_eq!(popped_id(&q), "c");
        q.finish_running("c");
        assert_eq!(popped_id(&q), "d");
        q.finish_running("d");
        assert_eq!(popped_id(&q), "idle");
    }

    /// With four slots, four jobs run and `capacity` more wait; a cancel
    /// finds each running job, and finishing one frees its slot only.
    #[test]
    fn parallel_slots_run_jobs_alongside() {
        let q = JobQueue::new(1, 4);
        for id in ["a", "b", "c", "d", "e"] {
            assert!(q.push(job(id)).is_ok(), "{id}");
        }
        assert!(matches!(q.push(job("f")), Err(PushError::Full(_))));
        let ids: Vec<String> = (0..4).map(|_| popped_id(&q)).collect();
        assert_eq!(ids, ["a", "b", "c", "d"]);
        assert_eq!((q.running(), q.len()), (4, 1));
        assert!(matches!(q.push(job("f")), Err(PushError::Full(_))));
        assert!(matches!(q.push(job("c")), Err(PushError::DuplicateId(_))));
        assert!(matches!(q.cancel("c"), CancelResult::Running));
        q.finish_running("b");
        assert_eq!(q.running(), 3);
        assert!(q.push(job("f")).is_ok(), "b's slot is free");
        assert!(!q.wait_idle(Duration::from_millis(5)));
        for id in ["a", "c", "d"] {
            q.finish_running(id);
        }
        assert!(q.wait_idle(Duration::from_millis(5)));
    }

    #[test]
    fn depth_zero_runs_one_job_and_queues_none() {
        let q = JobQueue::new(0, 1);
        assert!(q.push(job("a")).is_ok());
        assert!(matches!(q.push(job("b")), Err(PushError::Full(_))));
        assert_eq!(popped_id(&q), "a");
        assert!(matches!(q.push(job("b")), Err(PushError::Full(_))));
    }

    /// Admission is counted by the queue as it takes a job, never for one it
    /// refuses (the caller counts that refusal where it answers).
    #[test]
    fn only_a_job_the_queue_takes_is_counted_as_admitted() {
        let q = JobQueue::new(0, 1);
        let ledger = Ledger::new_for_tests();
        assert!(q.push(job_counted_in("a", &ledger)).is_ok());
        assert_eq!(ledger.jobs(), (1, 0));
        for refused in [
            q.push(job_counted_in("a", &ledger)),
            q.push(job_counted_in("b", &ledger)),
        ] {
            let Err(PushError::DuplicateId(jobs) | PushError::Full(jobs)) = refused else {
                panic!("refused")
            };
            jobs.into_iter().for_each(|j| j.sink.discard());
        }
        assert_eq!(ledger.jobs(), (1, 0));
        assert_eq!(popped_id(&q), "a");
    }

    /// A request's choices (issue 43) are queued all together or not at
    /// all: no room for every one, or an id taken or given twice, queues none.
    #[test]
    fn jobs_pushed_together_are_queued_all_or_none() {
        let q = JobQueue::new(2, 1);
        assert!(q.push(job("a")).is_ok());
        let refused = q.push_all(vec![job("b"), job("c"), job("d")]);
        let Err(PushError::Full(jobs)) = refused else {
            panic!("three more do not fit in three places")
        };
        assert_eq!(jobs.len(), 3);
        jobs.into_iter().for_each(|j| j.sink.discard());
        assert!(matches!(
            q.push_all(vec![job("b"), job("b")]),
            Err(PushError::DuplicateId(_))
        ));
        assert!(matches!(
            q.push_all(vec![job("b"), job("a")]),
            Err(PushError::DuplicateId(_))
        ));
        assert_eq!(q.len(), 1, "nothing of the refused pushes was queued");
        assert!(q.push_all(vec![job("b"), job("c")]).is_ok());
        for want in ["a", "b", "c"] {
            assert_eq!(popped_id(&q), want);
            q.finish_running(want);
        }
    }

    #[test]
    fn duplicate_ids_are_refused_while_waiting_or_running() {
        let q = JobQueue::new(4, 1);
        assert!(q.push(job("a")).is_ok());
        assert!(matches!(q.push(job("a")), Err(PushError::DuplicateId(_))));
        let Pop::Job(_running) = q.pop(None) else {
            panic!()
        };
        assert!(matches!(q.push(job("a")), Err(PushError::DuplicateId(_))));
        q.finish_running("a");
        assert!(q.push(job("a")).is_ok());
    }

    #[test]
    fn cancel_finds_queued_and_running_jobs() {
        let q = JobQueue::new(4, 1);
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
        let q = JobQueue::new(4, 1);
        q.push(job("a")).ok().unwrap();
        q.push(job("b")).ok().unwrap();
        let drained = q.close();
        assert_eq!(drained.len(), 2);
        assert!(matches!(q.push(job("c")), Err(PushError::Closed(_))));
        assert_eq!(popped_id(&q), "closed");
    }

    #[test]
    fn wait_idle_times_out_while_a_job_runs() {
        let q = Arc::new(JobQueue::new(1, 1));
        q.push(job("a")).ok().unwrap();
        let Pop::Job(_j) = q.pop(None) else { panic!() };
        assert!(!q.wait_idle(Duration::from_millis(20)));
        let q2 = q.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q2.finish_running("a");
        });
        assert!(q.wait_idle(Duration::from_secs(5)));
        t.join().unwrap();
    }
}
