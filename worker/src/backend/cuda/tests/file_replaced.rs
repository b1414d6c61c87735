//! Issue 47 on the GPU: once the weights are uploaded the worker keeps no
//! map of the model file and reads it no more, so truncating it and then
//! overwriting it in place changes no token (the CPU case and the checks
//! are in `load::file_replaced`).

use super::*;
use crate::backend::BackendKind;
use crate::load::file_replaced::check_model_outlives_its_file;
use crate::load::LoadOptions;

#[test]
#[ignore = "needs an NVIDIA GPU (run with --run-ignored all on the GPU machine)"]
fn a_gpu_model_outlives_its_file_truncated_then_overwritten() {
    let _gpu = shared_gpu();
    let Some(reference) = reference_model_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("model.gguf");
    std::fs::copy(&reference, &copy).unwrap();
    let opts = LoadOptions {
        backend: BackendKind::Cuda,
        ..LoadOptions::default()
    };
    check_model_outlives_its_file(&copy, &opts);
}
