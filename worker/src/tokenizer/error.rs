//! Why a tokenizer cannot be built or cannot encode, decode or render.

use std::path::PathBuf;

/// A tokenizer's failure: a vocabulary it cannot build, text it cannot
/// encode, ids it cannot decode, or a chat template it cannot render.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata key missing: {0}")]
    MissingKey(String),
    #[error("unsupported tokenizer model: {0}")]
    UnsupportedModel(String),
    #[error("unknown pre-tokenizer (tokenizer.ggml.pre): {0:?}")]
    UnknownPreTokenizer(String),
    #[error("cannot build tokenizer: {0}")]
    Build(String),
    #[error("cannot read {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("cannot encode text: {0}")]
    Encode(String),
    #[error("cannot decode tokens: {0}")]
    Decode(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("token id {0} is outside the vocabulary")]
    TokenOutOfRange(u32),
}
