//! JSON logging to stderr with `tracing-subscriber` (one object per line,
//! event fields at the top level), and the worker's fixed log fields.
//!
//! Nothing here logs prompts or generated text (M0-W-1902); callers log a
//! prompt's SHA-256, its length in characters and token counts only.

use std::sync::{Arc, RwLock};

use sha2::{Digest, Sha256};
use tracing_subscriber::EnvFilter;

/// Fields every narration record carries.
#[derive(Clone, Debug, Default)]
pub struct LogContext {
    pub worker_id: String,
    pub model_ref: String,
    pub gpu_device: u64,
    pub backend: String,
}

static CONTEXT: RwLock<Option<Arc<LogContext>>> = RwLock::new(None);

/// Sets the fixed fields: first from the raw flags, then again once the
/// configuration (flags plus YAML) is resolved.
pub fn set_context(ctx: LogContext) {
    *CONTEXT.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(ctx));
}

pub fn context() -> Arc<LogContext> {
    CONTEXT.read().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default()
}

/// Installs the JSON subscriber on stderr. The level comes from `RUST_LOG`
/// (default `info`). Does nothing when a subscriber is already installed.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Hex SHA-256 of a prompt: what the logs hold instead of the text.
pub fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_of_known_text() {
        assert_eq!(
            super::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
