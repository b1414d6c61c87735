//! Logging to stderr with `tracing-subscriber`, and the worker's fixed log
//! fields. Two formats (`--log-format`): JSON lines (one object per line,
//! event fields at the top level), the machine-readable record every
//! collector and the tests read; and one short line of text for a person at
//! a terminal ([`super::text`]). `auto`, the default, picks the text when
//! stderr is a terminal and JSON otherwise, as most servers do.
//!
//! Nothing here logs prompts or generated text (M0-W-1902); callers log a
//! prompt's SHA-256, its length in characters and token counts only.

use std::io::IsTerminal;
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
    CONTEXT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default()
}

/// How log records are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `pretty` when stderr is a terminal, `json` otherwise.
    #[default]
    Auto,
    /// One JSON object per line.
    Json,
    /// One short line of text per record, coloured on a terminal.
    Pretty,
}

impl LogFormat {
    /// The concrete format: `auto` decided by whether stderr is a terminal.
    pub fn resolve(self, stderr_is_terminal: bool) -> LogFormat {
        match self {
            LogFormat::Auto if stderr_is_terminal => LogFormat::Pretty,
            LogFormat::Auto => LogFormat::Json,
            chosen => chosen,
        }
    }
}

/// Installs the subscriber on stderr in `format`. The level comes from
/// `RUST_LOG` (default `info`). Does nothing when a subscriber is already
/// installed.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_target(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format.resolve(terminal) {
        LogFormat::Pretty => builder
            .event_format(super::text::TextFormat { ansi: terminal })
            .try_init(),
        _ => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
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
    use super::LogFormat;

    #[test]
    fn auto_is_pretty_on_a_terminal_and_json_otherwise() {
        assert_eq!(LogFormat::default(), LogFormat::Auto);
        assert_eq!(LogFormat::Auto.resolve(true), LogFormat::Pretty);
        assert_eq!(LogFormat::Auto.resolve(false), LogFormat::Json);
        for terminal in [true, false] {
            assert_eq!(LogFormat::Json.resolve(terminal), LogFormat::Json);
            assert_eq!(LogFormat::Pretty.resolve(terminal), LogFormat::Pretty);
        }
    }

    #[test]
    fn sha256_of_known_text() {
        assert_eq!(
            super::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
