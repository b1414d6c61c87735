//! Weight formats: the ggml block layouts and their CPU decoding.

mod types;

pub use types::GgmlType;
