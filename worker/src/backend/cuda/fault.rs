//! Faults that lose the device (issue #47): which of the driver's errors
//! leave the context unusable, and, in builds with the `fault-injection`
//! feature only (tests; never a release), a switch that makes the next
//! kernel launch fail as a kernel fault does.

use cudarc::driver::{sys, DriverError};

use crate::backend::BackendError;

/// `e` from the driver as a backend error: one of CUDA's sticky errors is
/// the device lost.
pub(crate) fn driver_error(what: &str, e: DriverError) -> BackendError {
    if is_sticky(&e) {
        BackendError::device_lost(what, e)
    } else {
        BackendError::driver(what, e)
    }
}

/// The driver's errors after which the context is unusable (CUDA's
/// documentation: "the process must be terminated and relaunched"), and an
/// uncorrectable ECC error.
fn is_sticky(e: &DriverError) -> bool {
    use sys::CUresult::*;
    matches!(
        e.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

#[cfg(feature = "fault-injection")]
static ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the next kernel launch fail with `CUDA_ERROR_ILLEGAL_ADDRESS`, as
/// an out-of-bounds kernel does (test builds only: `serve` arms it on
/// SIGUSR1).
#[cfg(feature = "fault-injection")]
pub fn arm() {
    ARMED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// The injected fault, once armed: the launch of `symbol` fails.
#[cfg(feature = "fault-injection")]
pub(crate) fn injected(symbol: &str) -> Result<(), BackendError> {
    if ARMED.swap(false, std::sync::atomic::Ordering::SeqCst) {
        let e = DriverError(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        return Err(driver_error(
            &format!("launching {symbol} (injected fault)"),
            e,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (Without formatting the errors: that needs libcuda.)
    #[test]
    fn sticky_errors_lose_the_device_and_others_do_not() {
        use sys::CUresult as R;
        for code in [
            R::CUDA_ERROR_ILLEGAL_ADDRESS,
            R::CUDA_ERROR_ASSERT,
            R::CUDA_ERROR_LAUNCH_FAILED,
        ] {
            assert!(
                driver_error("x", DriverError(code)).is_device_lost(),
                "{code:?}"
            );
        }
        for code in [
            R::CUDA_ERROR_OUT_OF_MEMORY,
            R::CUDA_ERROR_INVALID_VALUE,
            R::CUDA_ERROR_NOT_READY,
        ] {
            assert!(
                !driver_error("x", DriverError(code)).is_device_lost(),
                "{code:?}"
            );
        }
    }
}
