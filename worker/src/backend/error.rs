//! The backend layer's error type (M0-W-1501).

use crate::model::ops::GraphError;

/// What can go wrong inside a backend. Each kind has a fixed message prefix
/// and maps to one stable API code (see `engine::ErrorCode`).
#[derive(Clone, Debug, thiserror::Error)]
pub enum BackendError {
    #[error("no usable GPU: {0}")]
    DeviceNotFound(String),
    #[error("out of device memory: {needed} bytes needed, {available} bytes free")]
    OutOfMemory { needed: u64, available: u64 },
    #[error("invalid device: {0}")]
    InvalidDevice(String),
    #[error("model load failed: {0}")]
    ModelLoadFailed(String),
    #[error("inference failed: {0}")]
    InferenceFailed(String),
    #[error("weights are not resident in device memory: {0}")]
    VramResidencyFailed(String),
    #[error("kernel launch failed: {0}")]
    KernelLaunchFailed(String),
    /// The engine asked for something the backend's contract rules out (a
    /// sequence that is not open, one named twice in a step): a bug in the
    /// caller, logged by name, never a client's fault.
    #[error("backend misused: {0}")]
    CallerBug(String),
    #[error("unknown backend error: {0}")]
    Unknown(String),
}

/// The graph's own findings: a bad tensor fails the load, an empty forward
/// pass is a failed inference.
impl From<GraphError> for BackendError {
    fn from(e: GraphError) -> Self {
        match e {
            GraphError::MissingTensor(_)
            | GraphError::WrongShape { .. }
            | GraphError::TooFewTensors { .. }
            | GraphError::Unsupported(_) => BackendError::ModelLoadFailed(e.to_string()),
            GraphError::NoTokens => BackendError::InferenceFailed(e.to_string()),
        }
    }
}
