//! Model architectures: typed configuration read once from GGUF metadata, the
//! operations a device provides, and one file per architecture family that
//! maps GGUF tensor names to weights and describes the forward pass.
//! Nothing here names a backend: `crate::load` puts a model on one.

pub mod config;
pub mod llama;
pub mod ops;
pub mod synthetic;

pub use config::{Architecture, ConfigError, ModelConfig, RopeStyle};

/// What the rest of the worker needs to know about the loaded model.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelInfo {
    /// `general.name`.
    pub name: String,
    /// `general.architecture` (`llama`, `qwen2`, ...).
    pub architecture: String,
    /// The file type's short name (`Q4_1`, `Q4_K_M`, ...).
    pub quant_kind: String,
    pub vocab_size: usize,
    /// The effective context limit in tokens.
    pub context_length: usize,
    /// Bytes of tensor data in the file.
    pub tensor_bytes: u64,
}
