//! Logs and metrics: JSON narration records (M0-W-1900), their one-line text
//! form for a terminal (`text.rs`), and the Prometheus registry behind
//! `/metrics` (M0-W-1350).

pub mod logging;
pub mod metrics;
pub mod text;

/// Logs one narration record: `event` plus the worker's fixed fields
/// (`worker_id`, `model_ref`, `gpu_device`, `backend`) and any extra fields,
/// in `tracing` field syntax, optionally ending with a message.
///
/// ```ignore
/// narrate!(info, "execute_start", job_id = %id, tokens_in = n, "job started");
/// ```
#[macro_export]
macro_rules! narrate {
    ($level:ident, $event:literal) => {{
        let ctx = $crate::telemetry::logging::context();
        ::tracing::$level!(
            event = $event,
            worker_id = %ctx.worker_id,
            model_ref = %ctx.model_ref,
            gpu_device = ctx.gpu_device,
            backend = %ctx.backend,
        )
    }};
    ($level:ident, $event:literal, $($rest:tt)+) => {{
        let ctx = $crate::telemetry::logging::context();
        ::tracing::$level!(
            event = $event,
            worker_id = %ctx.worker_id,
            model_ref = %ctx.model_ref,
            gpu_device = ctx.gpu_device,
            backend = %ctx.backend,
            $($rest)+
        )
    }};
}
