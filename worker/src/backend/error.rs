//! The backend layer's error type (M0-W-1501).

use std::sync::Arc;

use crate::model::ops::GraphError;

/// The error underneath a backend error (a driver's or a library's), shared
/// by the jobs of a step that failed together.
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

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
    /// A call into the CUDA driver or one of its libraries (cuBLAS) failed:
    /// what was asked, and the library's own error.
    #[error("CUDA call failed: {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: Cause,
    },
    /// Issue #47: the GPU's context is unusable: a kernel faulted (illegal
    /// address, illegal instruction, a device-side assert, ...) or the
    /// device failed (an uncorrectable ECC error). CUDA's "sticky" errors:
    /// every later call in this process fails the same way, so only a new
    /// process can use the GPU again.
    #[error("the GPU failed and cannot go on: {what}: {source}")]
    DeviceLost {
        what: String,
        #[source]
        source: Cause,
    },
    /// NVRTC could not compile a kernel module (its log in the message).
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    /// Operands whose shapes or sizes do not fit the operation or the
    /// kernel's launch limits, refused before anything was launched.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The engine asked for something the backend's contract rules out (a
    /// sequence that is not open, one named twice in a step): a bug in the
    /// caller, logged by name, never a client's fault.
    #[error("backend misused: {0}")]
    CallerBug(String),
    #[error("unknown backend error: {0}")]
    Unknown(String),
}

impl BackendError {
    /// A failed driver or library call, keeping its error as the source.
    pub fn driver(
        what: impl Into<String>,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BackendError::Driver {
            what: what.into(),
            source: Arc::new(e),
        }
    }

    /// A call that left the device unusable (the CUDA backend decides
    /// which of the driver's errors are such).
    pub fn device_lost(
        what: impl Into<String>,
        e: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BackendError::DeviceLost {
            what: what.into(),
            source: Arc::new(e),
        }
    }

    /// Whether the device cannot go on in this process (see `DeviceLost`).
    pub fn is_device_lost(&self) -> bool {
        matches!(self, BackendError::DeviceLost { .. })
    }
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
