//! Serve-mode flags (M0-W-1100, M0-W-1101), the optional YAML file
//! (M0-W-1701) and their checks before anything is loaded.
//!
//! Two command lines lead here: the orchestrator's (the top-level flags,
//! [`ServeArgs`], every required flag by long name) and a person's
//! (`worker-orcd serve MODEL`, [`ServeCommand`], in `by_hand.rs`: short
//! flags, a relative path, defaults for the rest). Both end in the same
//! [`resolve_with`] (`resolve.rs`) and the same checks (`checks.rs`); the
//! flags, the file's keys and their defaults are in `flags.rs`.
//!
//! Every flag may also be given in `--config FILE.yaml` under its long name
//! (`worker-id`, `gpu-device`, `max-tokens-out`, ...); a flag on the command
//! line wins over the file, and an unknown key in the file is an error.
//! A missing required flag is a usage error (exit 2, like clap's own); a
//! value that fails its check exits 1 with a message naming the flag.

mod by_hand;
mod checks;
mod error;
mod flags;
mod resolve;

pub use by_hand::{preprocess_args, ServeCommand};
pub use checks::{chat_template_source, API_KEY_ENV, MAX_CHAT_TEMPLATE_BYTES};
pub(crate) use error::invalid;
pub use error::ConfigError;
pub use flags::{
    Fallbacks, FileConfig, Options, ServeArgs, DEFAULT_BACKEND, DEFAULT_HOST,
    DEFAULT_INFERENCE_TIMEOUT_SEC, DEFAULT_QUEUE_DEPTH, DEFAULT_RESIDENCY_CHECK_SEC,
    DEFAULT_SERVE_PORT, DEFAULT_SHUTDOWN_GRACE_SEC, DEFAULT_UPLOAD_CHUNK_BYTES, MAX_PARALLEL,
    MAX_QUEUE_DEPTH, MIN_CTX_SIZE, MIN_PORT,
};
pub use flags::{OnOff, DEFAULT_PREFIX_CACHE_SHARE};
pub use resolve::{log_format, read_file, resolve, resolve_with, ServeConfig};

#[cfg(test)]
mod tests;
