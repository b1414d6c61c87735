//! What every handler may use ([`AppState`]): the engine's handle, the
//! tokenizer, the served model's facts, the limits, the metrics and the
//! shutdown trigger.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::backend::{DeviceInfo, KvLayout};
use crate::constraint::Compiler;
use crate::engine::EngineHandle;
use crate::model::ModelInfo;
use crate::server::validation::Limits;
use crate::telemetry::metrics::Metrics;
use crate::tokenizer::Tokenizer;

/// Facts about the served model, fixed at start-up.
#[derive(Clone, Debug)]
pub struct ModelFacts {
    pub worker_id: String,
    /// The model's file name (`--model` without its directories, issue #15):
    /// `/health.model` and `started.model`.
    pub model_ref: String,
    pub info: ModelInfo,
    pub device: DeviceInfo,
    /// The KV cache's type and bytes a token (`/health`'s `kv_cache`).
    pub kv: KvLayout,
}

/// Triggers and awaits the worker's shutdown (from `/shutdown` or a signal).
#[derive(Clone, Debug)]
pub struct Shutdown {
    tx: Arc<watch::Sender<Option<&'static str>>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            tx: Arc::new(watch::channel(None).0),
        }
    }
}

impl Shutdown {
    /// Starts the shutdown; `reason` (`"request"`, `"SIGTERM"`, ...) is kept
    /// from the first call. Returns false when it had already started.
    pub fn trigger(&self, reason: &'static str) -> bool {
        self.tx.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason);
                true
            } else {
                false
            }
        })
    }

    pub fn is_triggered(&self) -> bool {
        self.tx.borrow().is_some()
    }

    /// Resolves with the reason once shutdown has been triggered.
    pub async fn triggered(&self) -> &'static str {
        let mut rx = self.tx.subscribe();
        let reason = match rx.wait_for(|v| v.is_some()).await {
            Ok(v) => *v,
            Err(_) => None,
        };
        reason.unwrap_or("unknown")
    }
}

/// Everything a handler may use. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<AppInner>);

/// The constraint compiler once built ([`OnceLock::wait`] until then).
pub type Constraints = Arc<OnceLock<Result<Arc<Compiler>, String>>>;

pub struct AppInner {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    /// The compiler of constrained requests (issue #43), or why this model
    /// has none: built beside serving, so readiness does not wait for it.
    pub constraints: Constraints,
    pub model: ModelFacts,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub shutdown: Shutdown,
    pub started: Instant,
}

impl AppState {
    pub fn new(inner: AppInner) -> Self {
        AppState(Arc::new(inner))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppInner;
    fn deref(&self) -> &AppInner {
        &self.0
    }
}
