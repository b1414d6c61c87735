//! Stable error codes (M0-W-1500) and the mapping of backend errors onto them
//! (M0-W-1501).
//!
//! Every failure a client can see is a [`JobError`]: a code, a readable
//! message (never prompt text) and whether retrying may help. The server
//! alone knows its wire form: an HTTP status and JSON body, and the same JSON
//! as the SSE `error` event (`server::error`, `server::events`).

use std::fmt;

use crate::backend::{BackendError, BackendKind};
use crate::load::LoadError;

/// The stable API error codes. Strings (and the statuses the server gives
/// them) are part of the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidRequest,
    ModelLoadFailed,
    InsufficientVram,
    VramOom,
    CudaError,
    InferenceTimeout,
    Cancelled,
    Internal,
    QueueFull,
    ShuttingDown,
    /// Issue #47: the GPU failed mid-job and the worker exits so that a
    /// supervisor restarts it; the job may be sent again.
    InferenceFailed,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::InvalidRequest,
        ErrorCode::ModelLoadFailed,
        ErrorCode::InsufficientVram,
        ErrorCode::VramOom,
        ErrorCode::CudaError,
        ErrorCode::InferenceTimeout,
        ErrorCode::Cancelled,
        ErrorCode::Internal,
        ErrorCode::QueueFull,
        ErrorCode::ShuttingDown,
        ErrorCode::InferenceFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::ModelLoadFailed => "MODEL_LOAD_FAILED",
            ErrorCode::InsufficientVram => "INSUFFICIENT_VRAM",
            ErrorCode::VramOom => "VRAM_OOM",
            ErrorCode::CudaError => "CUDA_ERROR",
            ErrorCode::InferenceTimeout => "INFERENCE_TIMEOUT",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::QueueFull => "QUEUE_FULL",
            ErrorCode::ShuttingDown => "SHUTTING_DOWN",
            ErrorCode::InferenceFailed => "INFERENCE_FAILED",
        }
    }

    /// Whether a client may usefully retry. `CANCELLED` is not retriable when
    /// the client asked for it; a job dropped by shutdown is retriable and is
    /// built with [`JobError::cancelled_by_shutdown`].
    pub fn retriable(self) -> bool {
        match self {
            ErrorCode::InvalidRequest => false,
            ErrorCode::ModelLoadFailed => false,
            ErrorCode::InsufficientVram => false,
            ErrorCode::VramOom => false,
            ErrorCode::CudaError => false,
            ErrorCode::InferenceTimeout => false,
            ErrorCode::Cancelled => false,
            ErrorCode::Internal => false,
            ErrorCode::QueueFull => true,
            ErrorCode::ShuttingDown => true,
            ErrorCode::InferenceFailed => true,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ErrorCode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("unknown error code {s:?}"))
    }
}

/// When a backend error happened: it maps to different codes at start-up and
/// inside a job (M0-W-1501).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Load,
    Job,
}

/// The API code for a backend error.
pub fn backend_error_code(err: &BackendError, backend: BackendKind, phase: Phase) -> ErrorCode {
    // On the CPU a "device" failure is a bug of ours, not the GPU's.
    let device_failure = match backend {
        BackendKind::Cuda => ErrorCode::CudaError,
        BackendKind::Cpu => ErrorCode::Internal,
    };
    let load_device_failure = match backend {
        BackendKind::Cuda => ErrorCode::CudaError,
        BackendKind::Cpu => ErrorCode::ModelLoadFailed,
    };
    match (phase, err) {
        (Phase::Load, BackendError::OutOfMemory { .. }) => ErrorCode::InsufficientVram,
        // No usable GPU, or the ordinal is out of range: the device's fault, not the file's.
        (Phase::Load, BackendError::DeviceNotFound(_))
        | (Phase::Load, BackendError::InvalidDevice(_)) => ErrorCode::CudaError,
        // NVRTC compilation and residency problems while setting up (M0-W-1702).
        (Phase::Load, BackendError::KernelLaunchFailed(_))
        | (Phase::Load, BackendError::Driver { .. })
        | (Phase::Load, BackendError::DeviceLost { .. })
        | (Phase::Load, BackendError::Compile(_))
        | (Phase::Load, BackendError::VramResidencyFailed(_)) => load_device_failure,
        (Phase::Load, BackendError::ModelLoadFailed(_))
        | (Phase::Load, BackendError::InferenceFailed(_))
        | (Phase::Load, BackendError::Unknown(_))
        | (Phase::Load, BackendError::Shape(_))
        | (Phase::Load, BackendError::CallerBug(_)) => ErrorCode::ModelLoadFailed,
        (Phase::Job, BackendError::OutOfMemory { .. }) => ErrorCode::VramOom,
        (Phase::Job, BackendError::DeviceLost { .. }) => ErrorCode::InferenceFailed,
        (Phase::Job, BackendError::DeviceNotFound(_))
        | (Phase::Job, BackendError::InvalidDevice(_))
        | (Phase::Job, BackendError::InferenceFailed(_))
        | (Phase::Job, BackendError::VramResidencyFailed(_))
        | (Phase::Job, BackendError::KernelLaunchFailed(_))
        | (Phase::Job, BackendError::Driver { .. })
        | (Phase::Job, BackendError::Compile(_)) => device_failure,
        (Phase::Job, BackendError::ModelLoadFailed(_))
        | (Phase::Job, BackendError::Unknown(_))
        // Operands that do not fit are the engine's own bug, not the device's.
        | (Phase::Job, BackendError::Shape(_))
        | (Phase::Job, BackendError::CallerBug(_)) => ErrorCode::Internal,
    }
}

/// The API code for a failed load (M0-W-1500): backend errors through
/// [`backend_error_code`] (M0-W-1501), everything else is the file's fault.
pub fn load_error_code(err: &LoadError, backend: BackendKind) -> ErrorCode {
    match err {
        LoadError::Backend(err) => backend_error_code(err, backend, Phase::Load),
        _ => ErrorCode::ModelLoadFailed,
    }
}

/// A client-visible error: what every error answer and the SSE `error`
/// event carry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct JobError {
    pub code: ErrorCode,
    pub message: String,
    pub retriable: bool,
}

impl JobError {
    /// An error with the code's fixed retriable flag.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        JobError {
            code,
            message: message.into(),
            retriable: code.retriable(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        JobError::new(ErrorCode::InvalidRequest, message)
    }

    /// The client (or an operator) cancelled the job.
    pub fn cancelled() -> Self {
        JobError::new(ErrorCode::Cancelled, "the job was cancelled")
    }

    /// The worker is shutting down and dropped the job; another worker may run it.
    pub fn cancelled_by_shutdown() -> Self {
        JobError {
            code: ErrorCode::Cancelled,
            message: "the worker is shutting down; the job was cancelled".into(),
            retriable: true,
        }
    }

    pub fn timeout(limit_s: u64) -> Self {
        JobError::new(
            ErrorCode::InferenceTimeout,
            format!("the job ran longer than the inference timeout of {limit_s} s"),
        )
    }

    pub fn queue_full(depth: usize) -> Self {
        JobError::new(
            ErrorCode::QueueFull,
            format!("the job queue is full ({depth} jobs waiting); retry later"),
        )
    }

    pub fn shutting_down() -> Self {
        JobError::new(ErrorCode::ShuttingDown, "the worker is shutting down")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        JobError::new(ErrorCode::Internal, message)
    }

    /// The client's view of a backend error. A caller bug is the engine's
    /// own: the client gets a plain internal error, the log gets its text.
    pub fn from_backend(err: &BackendError, backend: BackendKind, phase: Phase) -> Self {
        let code = backend_error_code(err, backend, phase);
        match err {
            BackendError::CallerBug(_) => JobError::new(code, "internal error in the engine"),
            _ => JobError::new(code, err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive: adding a `BackendError` variant fails to compile here until
    /// its mapping is decided.
    #[test]
    fn every_backend_error_maps_in_both_phases() {
        fn sample(kind: usize) -> BackendError {
            match kind {
                0 => BackendError::DeviceNotFound("x".into()),
                1 => BackendError::OutOfMemory {
                    needed: 2,
                    available: 1,
                },
                2 => BackendError::InvalidDevice("x".into()),
                3 => BackendError::ModelLoadFailed("x".into()),
                4 => BackendError::InferenceFailed("x".into()),
                5 => BackendError::VramResidencyFailed("x".into()),
                6 => BackendError::KernelLaunchFailed("x".into()),
                7 => BackendError::CallerBug("x".into()),
                8 => BackendError::driver("cuLaunchKernel", std::io::Error::other("x")),
                9 => BackendError::Compile("x".into()),
                10 => BackendError::Shape("x".into()),
                // (A cudarc error is not formatted here: that needs libcuda.)
                11 => BackendError::DeviceLost {
                    what: "cuStreamSynchronize".into(),
                    source: std::sync::Arc::new(std::io::Error::other("x")),
                },
                _ => BackendError::Unknown("x".into()),
            }
        }
        use BackendKind::{Cpu, Cuda};
        use ErrorCode::*;
        use Phase::{Job, Load};
        for kind in 0..13 {
            let err = sample(kind);
            let expected = |backend: BackendKind, phase: Phase| -> ErrorCode {
                let dev = if backend == Cuda { CudaError } else { Internal };
                let load_dev = if backend == Cuda {
                    CudaError
                } else {
                    ModelLoadFailed
                };
                match (&err, phase) {
                    (BackendError::OutOfMemory { .. }, Load) => InsufficientVram,
                    (BackendError::OutOfMemory { .. }, Job) => VramOom,
                    (BackendError::DeviceLost { .. }, Job) => InferenceFailed,
                    (BackendError::DeviceNotFound(_), Load)
                    | (BackendError::InvalidDevice(_), Load) => CudaError,
                    (BackendError::KernelLaunchFailed(_), Load)
                    | (BackendError::Driver { .. }, Load)
                    | (BackendError::DeviceLost { .. }, Load)
                    | (BackendError::Compile(_), Load)
                    | (BackendError::VramResidencyFailed(_), Load) => load_dev,
                    (BackendError::ModelLoadFailed(_), Load)
                    | (BackendError::InferenceFailed(_), Load)
                    | (BackendError::Unknown(_), Load)
                    | (BackendError::Shape(_), Load)
                    | (BackendError::CallerBug(_), Load) => ModelLoadFailed,
                    (BackendError::DeviceNotFound(_), Job)
                    | (BackendError::InvalidDevice(_), Job)
                    | (BackendError::InferenceFailed(_), Job)
                    | (BackendError::VramResidencyFailed(_), Job)
                    | (BackendError::KernelLaunchFailed(_), Job)
                    | (BackendError::Driver { .. }, Job)
                    | (BackendError::Compile(_), Job) => dev,
                    (BackendError::ModelLoadFailed(_), Job)
                    | (BackendError::Unknown(_), Job)
                    | (BackendError::Shape(_), Job)
                    | (BackendError::CallerBug(_), Job) => Internal,
                }
            };
            for backend in [Cpu, Cuda] {
                for phase in [Load, Job] {
                    assert_eq!(
                        backend_error_code(&err, backend, phase),
                        expected(backend, phase),
                        "{err:?} {backend:?} {phase:?}"
                    );
                }
            }
            // Each kind has its fixed message prefix.
            let prefix = match &err {
                BackendError::DeviceNotFound(_) => "no usable GPU: ",
                BackendError::OutOfMemory { .. } => "out of device memory: ",
                BackendError::InvalidDevice(_) => "invalid device: ",
                BackendError::ModelLoadFailed(_) => "model load failed: ",
                BackendError::InferenceFailed(_) => "inference failed: ",
                BackendError::VramResidencyFailed(_) => {
                    "weights are not resident in device memory: "
                }
                BackendError::KernelLaunchFailed(_) => "kernel launch failed: ",
                BackendError::CallerBug(_) => "backend misused: ",
                BackendError::Driver { .. } => "CUDA call failed: ",
                BackendError::DeviceLost { .. } => "the GPU failed and cannot go on: ",
                BackendError::Compile(_) => "kernel compilation failed: ",
                BackendError::Shape(_) => "shape mismatch: ",
                BackendError::Unknown(_) => "unknown backend error: ",
            };
            assert!(err.to_string().starts_with(prefix), "{err}");
        }
        let lost = BackendError::DeviceLost {
            what: "launching sample_select".into(),
            source: std::sync::Arc::new(std::io::Error::other("CUDA_ERROR_ILLEGAL_ADDRESS")),
        };
        let lost = JobError::from_backend(&lost, Cuda, Job);
        assert_eq!(lost.code, InferenceFailed);
        assert!(lost.retriable, "another worker can run the job");
        let oom = BackendError::OutOfMemory {
            needed: 2,
            available: 1,
        };
        let e = JobError::from_backend(&oom, Cuda, Job);
        assert_eq!(e.code, VramOom);
        assert!(!e.retriable);
        let bug = BackendError::CallerBug("SeqId { slot: 3 } is not open".into());
        let e = JobError::from_backend(&bug, Cuda, Job);
        assert_eq!(e.code, Internal);
        assert!(
            !e.message.contains("SeqId"),
            "a caller bug's text stays in the log"
        );
        let driver = BackendError::driver("cuMemAlloc", std::io::Error::other("CUDA_ERROR_X"));
        let source = std::error::Error::source(&driver).map(|s| s.to_string());
        assert_eq!(
            source.as_deref(),
            Some("CUDA_ERROR_X"),
            "the driver's error is the source"
        );
    }
}
