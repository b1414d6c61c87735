//! Every way reading a GGUF file or one of its metadata keys can fail.
//!
//! One variant per failure so callers (and hostile-file tests) can match on
//! the cause; each message names the key, tensor or byte offset involved.

use std::path::PathBuf;

/// A GGUF parsing, validation or metadata lookup failure.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read GGUF file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("bad magic 0x{0:08x}: not a GGUF file (expected 0x46554747, \"GGUF\")")]
    BadMagic(u32),

    #[error("unsupported GGUF version {0} (only version 3 is supported)")]
    UnsupportedVersion(u32),

    #[error("file truncated: {what} at byte offset {offset} runs past the end; download it again")]
    Truncated { what: String, offset: u64 },

    #[error("too many {what}: {count} (at most {max} allowed)")]
    TooMany {
        what: &'static str,
        count: u64,
        max: u64,
    },

    #[error("string length {len} exceeds the limit of {max} bytes")]
    StringTooLong { len: u64, max: u64 },

    #[error("string at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: u64 },

    #[error("metadata key '{key}' has unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },

    #[error("metadata key '{key}' nests arrays too deeply")]
    NestingTooDeep { key: String },

    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),

    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),

    #[error("general.alignment {0} is not a nonzero power of two")]
    BadAlignment(u64),

    #[error("tensor '{tensor}' has unknown or unsupported ggml type {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },

    #[error("tensor '{tensor}' has bad dimensions: {reason}")]
    BadDims { tensor: String, reason: String },

    #[error(
        "tensor '{tensor}' ({size} bytes at data offset {offset}) lies outside the \
         {data_len}-byte data section"
    )]
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        size: u64,
        data_len: u64,
    },

    /// The tensor table describes more bytes than the file holds, and the
    /// cut runs through or just before a tensor: what an interrupted
    /// download or copy leaves behind.
    #[error(
        "the file is truncated: its tensor table needs {needed} bytes, the file has {file_len}; \
         download it again (an interrupted download or copy leaves such a file)"
    )]
    CutShort { file_len: u64, needed: u64 },

    #[error(
        "tensor '{tensor}' data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error("tensors '{a}' and '{b}' have overlapping data")]
    TensorOverlap { a: String, b: String },

    #[error("metadata key '{0}' is missing")]
    MissingKey(String),

    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
}
