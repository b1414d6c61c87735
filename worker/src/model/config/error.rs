//! Why a model's configuration cannot be read from its metadata.

use crate::gguf::GgufError;

/// A configuration the worker refuses: an architecture it does not run, a
/// missing or mistyped key, or a value out of bounds.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "unsupported architecture {0:?} (supported: llama, qwen2, gemma3, phi3, gpt2, gpt-oss)"
    )]
    UnsupportedArchitecture(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("invalid model configuration: {0}")]
    Invalid(String),
}
