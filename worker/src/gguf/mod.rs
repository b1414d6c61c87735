//! GGUF v3 model files: a validating reader and a writer.
//!
//! The layout follows ggml's GGUF v3 specification (ggml `docs/gguf.md`):
//! a little-endian header (magic "GGUF", version, tensor count, metadata
//! count), typed metadata key/value pairs, a tensor info table (name, dims
//! with ne0 first, ggml type, offset), padding to `general.alignment`
//! (default 32), then the tensor data section.
//!
//! [`GgufFile::open`] memory-maps the file ([`GgufFile::read`] reads it into
//! memory, for a holder that outlives changes to the file) and validates all of it up front
//! (counts, lengths, types, dims, tensor bounds, alignment and overlap), so
//! code holding a `GgufFile` can slice tensor data without further checks.
//! A hostile or corrupt file yields a [`GgufError`], never a panic or an
//! allocation larger than the file warrants. [`GgufWriter`] produces files
//! for tests and the synthetic-model generator.

mod error;
mod reader;
mod value;
mod writer;

#[cfg(test)]
mod tests;

pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo, GGUF_MAGIC};
pub use value::{MetaValue, Metadata};
pub use writer::GgufWriter;

/// Short name of a llama.cpp `LLAMA_FTYPE` number (the `general.file_type`
/// key), or `None` for numbers this worker has no name for.
pub fn file_type_name(file_type: u32) -> Option<&'static str> {
    Some(match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        // LLAMA_FTYPE_MOSTLY_MXFP4_MOE
        38 => "MXFP4",
        _ => return None,
    })
}
