//! Metadata for the submodules' tests.

use crate::gguf::{GgufFile, MetaValue, Metadata};
use crate::model::synthetic::synthetic_model;

pub fn metadata(arch: &str) -> Metadata {
    GgufFile::from_bytes(synthetic_model(arch, 1, 64))
        .unwrap()
        .metadata
}

/// `md` with the keys of `changes` replaced (`Some`) or removed (`None`).
pub fn with(md: &Metadata, changes: &[(&str, Option<MetaValue>)]) -> Metadata {
    let mut out = Metadata::new();
    for (k, v) in md.iter() {
        if !changes.iter().any(|(c, _)| *c == k) {
            out.insert(k, v.clone()).unwrap();
        }
    }
    for (k, v) in changes {
        if let Some(v) = v {
            out.insert(k, v.clone()).unwrap();
        }
    }
    out
}
