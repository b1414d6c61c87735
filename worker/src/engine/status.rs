//! The engine's cached state, written by the engine thread and read by
//! `/health` and `/metrics` without ever calling the backend (M0-W-1604).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::backend::PrefixStats;

/// Why the worker is unhealthy; each kind is set and cleared on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// A weight buffer was found outside device memory (M0-W-1012).
    Residency,
    /// A job ran out of device memory and it is not yet back (M0-W-1021).
    Memory,
    /// The engine thread stopped unexpectedly.
    Engine,
    /// The GPU failed and cannot go on in this process (issue #47): the
    /// worker ends every job and exits so that a supervisor restarts it.
    Device,
}

#[derive(Debug, Default)]
pub struct EngineStatus {
    vram_bytes_used: AtomicU64,
    resident: AtomicBool,
    problems: Mutex<BTreeMap<Problem, String>>,
    /// The prefix cache's counters as last noted; `None` without a cache.
    prefix: Mutex<Option<PrefixStats>>,
}

impl EngineStatus {
    pub fn new(vram_bytes_used: u64, resident: bool) -> Self {
        let s = EngineStatus::default();
        s.set_vram_bytes_used(vram_bytes_used);
        s.set_resident(resident);
        s
    }

    pub fn vram_bytes_used(&self) -> u64 {
        self.vram_bytes_used.load(Ordering::Relaxed)
    }

    pub fn set_vram_bytes_used(&self, bytes: u64) {
        self.vram_bytes_used.store(bytes, Ordering::Relaxed);
    }

    pub fn resident(&self) -> bool {
        self.resident.load(Ordering::Relaxed)
    }

    pub fn set_resident(&self, resident: bool) {
        self.resident.store(resident, Ordering::Relaxed);
    }

    pub fn prefix_cache(&self) -> Option<PrefixStats> {
        *self.prefix.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_prefix_cache(&self, stats: Option<PrefixStats>) {
        *self.prefix.lock().unwrap_or_else(|p| p.into_inner()) = stats;
    }

    pub fn set_problem(&self, problem: Problem, reason: impl Into<String>) {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(problem, reason.into());
    }

    pub fn clear_problem(&self, problem: Problem) {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&problem);
    }

    /// Whether the device was lost (set once; never cleared).
    pub fn device_lost(&self) -> bool {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&Problem::Device)
    }

    /// `None` when healthy; otherwise every current reason, joined.
    pub fn unhealthy_reason(&self) -> Option<String> {
        let problems = self.problems.lock().unwrap_or_else(|p| p.into_inner());
        if problems.is_empty() {
            None
        } else {
            Some(problems.values().cloned().collect::<Vec<_>>().join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_set_and_clear_independently() {
        let s = EngineStatus::new(10, true);
        assert_eq!(s.unhealthy_reason(), None);
        s.set_problem(Problem::Memory, "oom");
        s.set_problem(Problem::Residency, "host-mapped weight");
        assert_eq!(s.unhealthy_reason().unwrap(), "host-mapped weight; oom");
        s.clear_problem(Problem::Memory);
        assert_eq!(s.unhealthy_reason().unwrap(), "host-mapped weight");
        s.clear_problem(Problem::Residency);
        assert_eq!(s.unhealthy_reason(), None);
    }
}
