//! Benchmarks live under benches/; this is what they share.

use std::path::PathBuf;

/// The reference model, which `ci/fetch-model` puts in place; panics with
/// that hint when it is missing.
pub fn reference_model() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.models/smollm2-135m-instruct-q4_1.gguf");
    assert!(path.exists(), "run ci/fetch-model first: {} is missing", path.display());
    path
}
