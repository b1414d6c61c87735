//! `GET /health` (M0-W-1320) and `GET /metrics` (M0-W-1350), both from cached
//! state: no backend or driver call on the request path (M0-W-1604).
//!
//! `/health` always answers 200; `status` says `healthy` or `unhealthy`
//! (with `reason`). On `cpu`, `resident` is false and does not count.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::AppState;
use crate::backend::{BackendKind, KvLayout, PrefixStats};
use crate::telemetry::metrics::{Snapshot, CONTENT_TYPE};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Health {
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub worker_id: String,
    pub model: String,
    /// `general.name` of the model.
    pub model_name: String,
    pub architecture: String,
    pub resident: bool,
    pub quant_kind: String,
    pub vram_bytes_used: u64,
    pub tokenizer_kind: String,
    pub vocab_size: usize,
    pub context_length: Option<usize>,
    pub uptime_seconds: u64,
    pub backend: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_runtime_version: Option<String>,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    pub busy: bool,
    /// Jobs that may run at once (`--parallel`), running now, and free.
    pub slots_total: usize,
    pub slots_busy: usize,
    pub slots_free: usize,
    pub shutting_down: bool,
    /// The prefix cache (`--prefix-cache on`): its entries (whole prompt
    /// chunks of `chunk_tokens` tokens), their bytes and bound, evictions so
    /// far; absent when it is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheHealth>,
    pub kv_cache: KvCacheHealth,
}

/// The KV cache: its type (`--kv-type`: f16, q8_0 or q4_0) and the bytes one
/// token takes in it, every layer's K and V (the CPU backend holds the
/// type's values as f32).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct KvCacheHealth {
    #[serde(rename = "type")]
    pub kv_type: String,
    pub bytes_per_token: u64,
}

impl From<KvLayout> for KvCacheHealth {
    fn from(k: KvLayout) -> Self {
        KvCacheHealth {
            kv_type: k.kv_type.as_str().into(),
            bytes_per_token: k.bytes_per_token,
        }
    }
}

/// `/health`'s view of the prefix cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PrefixCacheHealth {
    /// Tokens per entry (the backend's prefill chunk).
    pub chunk_tokens: usize,
    /// Entries (cached blocks) held now.
    pub entries: usize,
    /// Bytes of the entries' KV (on the GPU, whole blocks of the pool).
    pub bytes: u64,
    /// Host bytes of the prompts' last logits kept with their last chunks.
    pub logits_bytes: u64,
    /// The most `bytes` and `logits_bytes` may reach together.
    pub max_bytes: u64,
    pub evictions: u64,
}

impl From<PrefixStats> for PrefixCacheHealth {
    fn from(s: PrefixStats) -> Self {
        PrefixCacheHealth {
            chunk_tokens: s.chunk_tokens,
            entries: s.entries,
            bytes: s.bytes,
            logits_bytes: s.logits_bytes,
            max_bytes: s.max_bytes,
            evictions: s.evictions,
        }
    }
}

pub fn health_snapshot(state: &AppState) -> Health {
    let status = state.engine.status();
    let on_cuda = state.model.device.backend == BackendKind::Cuda;
    let mut reason = status.unhealthy_reason();
    if on_cuda && !status.resident() && reason.is_none() {
        reason = Some("weights not resident in device memory".into());
    }
    let info = &state.model.info;
    Health {
        status: if reason.is_none() {
            "healthy"
        } else {
            "unhealthy"
        }
        .into(),
        reason,
        worker_id: state.model.worker_id.clone(),
        model: state.model.model_ref.clone(),
        model_name: info.name.clone(),
        architecture: info.architecture.clone(),
        resident: on_cuda && status.resident(),
        quant_kind: info.quant_kind.clone(),
        vram_bytes_used: status.vram_bytes_used(),
        tokenizer_kind: state.tokenizer.kind().as_str().into(),
        vocab_size: info.vocab_size,
        context_length: Some(info.context_length),
        uptime_seconds: state.started.elapsed().as_secs(),
        backend: state.model.device.backend.as_str().into(),
        sm: state.model.device.sm.clone(),
        cuda_runtime_version: state.model.device.cuda_runtime_version.clone(),
        queue_depth: state.engine.queue_depth(),
        queue_capacity: state.engine.queue_capacity(),
        busy: state.engine.busy(),
        slots_total: state.engine.slots(),
        slots_busy: state.engine.running(),
        slots_free: state.engine.slots().saturating_sub(state.engine.running()),
        shutting_down: state.shutdown.is_triggered(),
        prefix_cache: status.prefix_cache().map(PrefixCacheHealth::from),
        kv_cache: state.model.kv.into(),
    }
}

#[utoipa::path(get, path = "/health", tag = "worker", responses((status = 200, body = Health)))]
pub async fn health(State(state): State<AppState>) -> Json<Health> {
    Json(health_snapshot(&state))
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "worker",
    responses((status = 200, description = "OpenMetrics text", content_type = "application/openmetrics-text",
        body = String))
)]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let text = state.metrics.render(Snapshot {
        vram_bytes: state.engine.status().vram_bytes_used(),
        queue_depth: state.engine.queue_depth(),
        busy: state.engine.busy(),
        running: state.engine.running(),
    });
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text)
}

/// `GET /`: what answers on this port, for a person with a browser or curl
/// and for a client finding its way.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct About {
    /// `worker-orcd`.
    pub name: String,
    pub version: String,
    /// The model's file name, as `/health` and `/v1/models` name it.
    pub model: String,
    /// Every route, `METHOD /path`, from the OpenAPI document
    /// (`GET /openapi.json` describes each).
    pub routes: Vec<String>,
}
